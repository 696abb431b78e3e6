"""The built-in engine's model: a Llama/Qwen2 decoder over a paged KV pool, in plain torch.

Names load on first use (PEP 562), so torch-free users of a submodule (the sglang executor reads
`tokenizer`) do not import torch through this package.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "kv_page_bytes": "attention",
    "kv_pool_shape": "attention",
    "make_kv_pool": "attention",
    "ArchConfig": "config",
    "tiny_config": "config",
    "param_shapes": "llama",
    "Checkpoint": "loader",
    "load_checkpoint": "loader",
    "random_weights": "loader",
    "write_checkpoint": "loader",
    "write_tiny_checkpoint": "loader",
    "BlockTables": "paged",
    "DecodeSeq": "runner",
    "Generation": "runner",
    "ModelRunner": "runner",
    "PrefillSeq": "runner",
    "SamplingParams": "sampling",
    "TextTokenizer": "tokenizer",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
