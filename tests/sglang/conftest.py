"""The checkpoint directory the SGLang tests share."""

from __future__ import annotations

import pathlib

import pytest

from talariad.engine.model.tokenizer import build_tiny_tokenizer


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> pathlib.Path:
    """A checkpoint directory as far as the executor and the fake read it: tokenizer.json."""
    path = tmp_path_factory.mktemp("ckpt")
    build_tiny_tokenizer().save(str(path / "tokenizer.json"))
    return path
