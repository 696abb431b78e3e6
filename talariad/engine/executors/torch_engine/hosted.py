"""A model hosted by a torch instance: its architecture, tokenizer and weights (checkpoint or seeded
random), ready to be registered with the memory substrate."""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from talariad.engine.model import (
    ArchConfig,
    TextTokenizer,
    load_checkpoint,
    param_shapes,
    random_weights,
    tiny_config,
)
from talariad.engine.model.gguf_model import load_gguf
from talariad.engine.model.loader import default_dtype
from talariad.engine.model.tokenizer import FALLBACK_CHAT_TEMPLATE, build_tiny_tokenizer
from talariad.memory import KVLayout
from talariad.modelfiles import is_gguf

ARCHITECTURES: dict[str, Callable[[], ArchConfig]] = {
    "tiny": tiny_config,  # 2 layers, hidden 64, GQA 4:2, vocab 320: the CPU default
}
"""Built-in architectures a model without `path` is built from (by its `profile` name)."""


TURN_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>")
"""Chat-template end-of-turn tokens a model stops on when its vocabulary has them."""


@dataclass
class HostedModel:
    name: str
    config: ArchConfig
    tokenizer: TextTokenizer
    params: dict[str, torch.Tensor]
    """Weights on the CPU, copied into the substrate's host image at registration."""
    dtype: torch.dtype

    def shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        dt = str(self.dtype).removeprefix("torch.")
        return {name: (shape, dt) for name, shape in param_shapes(self.config).items()}

    def kv_layout(self, page_size: int) -> KVLayout:
        c = self.config
        return KVLayout(
            num_layers=c.num_hidden_layers,
            num_kv_heads=c.num_key_value_heads,
            head_dim=c.head_dim,
            page_size=page_size,
            dtype=str(self.dtype).removeprefix("torch."),
        )

    @functools.cached_property
    def _end_ids(self) -> frozenset[int]:
        tok = self.tokenizer
        names = (tok.special.get("eos_token"), *TURN_END_TOKENS)
        found = {i for n in names if (i := tok.token_id(n)) is not None}
        return frozenset(found | set(self.config.eos_token_ids))

    def eos_ids(self) -> frozenset[int]:
        """Ids that end an answer: the config's and tokenizer's EOS and the chat templates' turn ends."""
        return self._end_ids


def model_seed(name: str, seed: int | None) -> int:
    """The configured seed, or one derived from the name (stable across processes, unlike hash())."""
    return seed if seed is not None else zlib.crc32(name.encode())


@functools.cache
def tiny_tokenizer(vocab_size: int) -> TextTokenizer:
    tok = build_tiny_tokenizer(min(vocab_size, 320))
    return TextTokenizer(tok, FALLBACK_CHAT_TEMPLATE, {"eos_token": "<|im_end|>"})


def load_hosted(
    name: str,
    *,
    path: str | Path | None,
    profile: str | None,
    seed: int | None,
    device: str,
    dtype: torch.dtype | None = None,
    chat_template: str | None = None,
) -> HostedModel:
    """Load `path` (an HF-format directory or a .gguf file) or build `profile`'s architecture with
    seeded weights. `chat_template` (its text) replaces the model's own."""
    dtype = dtype or default_dtype(device)
    if path is not None:
        if is_gguf(path):
            ckpt = load_gguf(path, dtype)
        else:
            ckpt = load_checkpoint(path, "cpu", dtype)
        if chat_template is not None:
            ckpt.tokenizer.chat_template = chat_template
        return HostedModel(name, ckpt.config, ckpt.tokenizer, ckpt.params, dtype)
    arch = profile or "tiny"
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"model {name!r}: profile {arch!r} is not a built-in architecture "
            f"(known: {', '.join(sorted(ARCHITECTURES))}); set `path` to a checkpoint directory"
        )
    config = ARCHITECTURES[arch]()
    params = random_weights(config, model_seed(name, seed), "cpu", dtype)
    tok = tiny_tokenizer(config.vocab_size)  # shared: a model's own template gets its own wrapper
    if chat_template is not None:
        tok = TextTokenizer(tok.tokenizer, chat_template, tok.special)
    return HostedModel(name, config, tok, params, dtype)
