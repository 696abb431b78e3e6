"""Pieces of the built-in torch executor: hosted models, streamed text, per-session KV records."""

from talariad.engine.executors.torch_engine.hosted import (
    ARCHITECTURES,
    HostedModel,
    load_hosted,
    model_seed,
)
from talariad.engine.executors.torch_engine.kv import KVBook, TokenContext
from talariad.engine.executors.torch_engine.text import TextStream

__all__ = [
    "ARCHITECTURES",
    "HostedModel",
    "KVBook",
    "TextStream",
    "TokenContext",
    "load_hosted",
    "model_seed",
]
