"""The built-in engine's model: a Llama/Qwen2 decoder over a paged KV pool, in plain torch."""

from talariad.engine.model.attention import kv_page_bytes, kv_pool_shape, make_kv_pool
from talariad.engine.model.config import ArchConfig, tiny_config
from talariad.engine.model.llama import param_shapes
from talariad.engine.model.loader import (
    Checkpoint,
    load_checkpoint,
    random_weights,
    write_checkpoint,
    write_tiny_checkpoint,
)
from talariad.engine.model.paged import BlockTables
from talariad.engine.model.runner import DecodeSeq, Generation, ModelRunner, PrefillSeq
from talariad.engine.model.sampling import SamplingParams
from talariad.engine.model.tokenizer import TextTokenizer

__all__ = [
    "Checkpoint",
    "DecodeSeq",
    "Generation",
    "ArchConfig",
    "ModelRunner",
    "BlockTables",
    "PrefillSeq",
    "SamplingParams",
    "TextTokenizer",
    "kv_page_bytes",
    "kv_pool_shape",
    "load_checkpoint",
    "make_kv_pool",
    "param_shapes",
    "random_weights",
    "tiny_config",
    "write_checkpoint",
    "write_tiny_checkpoint",
]
