"""A GGUF file as a Checkpoint: the architecture from its metadata, the weights under Hugging Face
names, the tokenizer rebuilt with `tokenizers`, the chat template it carries.

llama.cpp's converter stores a Llama's q/k projections permuted for interleaved rotary; they are
permuted back to the rotate-half order `llama.forward` uses. `gguf_problem(path)` reads only the
header and metadata and says in one line why a file cannot be served (check-config uses it, so
this module imports torch only when it loads weights).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from talariad.engine.model.config import ArchConfig
from talariad.engine.model.gguf import GGUFFile
from talariad.engine.model.tokenizer import TextTokenizer

if TYPE_CHECKING:
    import torch

    from talariad.engine.model.loader import Checkpoint

ARCHITECTURES = ("llama", "qwen2")
TOKEN_CONTROL = 3  # tokenizer.ggml.token_type of special (control) tokens
DIGIT_SPLIT_PRE = ("smollm", "starcoder", "refact", "codeshell")
"""llama.cpp pre-tokenizers that split every digit, then apply GPT-2's byte-level regex."""
BYTE_LEVEL_PRE = ("default", "gpt-2")

_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor; None for one the model does not use (rope_freqs)."""
    if name in _TOP:
        return _TOP[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER:
        return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}"
    return None


def arch_config(g: GGUFFile) -> ArchConfig:
    md = g.metadata
    arch = md.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"{g.path.name}: architecture {arch!r} is not supported (supported: "
            f"{', '.join(ARCHITECTURES)})"
        )

    def get(key: str, default: Any = None) -> Any:
        return md.get(f"{arch}.{key}", default)

    heads, hidden = get("attention.head_count"), get("embedding_length")
    eos = md.get("tokenizer.ggml.eos_token_id")
    bias = "blk.0.attn_q.bias" in g.tensors
    return ArchConfig(
        vocab_size=get("vocab_size") or len(md.get("tokenizer.ggml.tokens", ())),
        hidden_size=hidden,
        intermediate_size=get("feed_forward_length"),
        num_hidden_layers=get("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=get("attention.head_count_kv") or heads,
        head_dim=get("attention.key_length") or hidden // heads,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        max_position_embeddings=get("context_length", 2048),
        tie_word_embeddings="output.weight" not in g.tensors,
        model_type=arch,
        qkv_bias=arch == "qwen2" or bias,
        o_bias=arch == "llama" and "blk.0.attn_output.bias" in g.tensors,
        bos_token_id=md.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
    )


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k permute (interleaved rotary -> rotate-half), rows split per head."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k permute (rotate-half -> interleaved): what its converter writes."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_params(g: GGUFFile, config: ArchConfig, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor the model uses, dequantized to `dtype` on the CPU, one at a time."""
    import torch

    from talariad.engine.model.llama import check_params

    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    params = {}
    for name in g.tensors:
        hf = hf_name(name)
        if hf is None:
            continue
        w = g.tensor(name)
        kind = name.split(".")[2] if name.startswith("blk.") else ""
        if config.model_type == "llama" and kind in heads:
            w = unpermute(w, heads[kind])
        params[hf] = torch.from_numpy(w).to(dtype=dtype)
    check_params(config, params)
    return params


def build_tokenizer(g: GGUFFile) -> Tokenizer:
    """A byte-level BPE from tokenizer.ggml.{tokens,merges,token_type} (GPT-2-style vocabularies)."""
    md = g.metadata
    kind, pre = md.get("tokenizer.ggml.model"), md.get("tokenizer.ggml.pre", "default")
    if kind != "gpt2":
        raise ValueError(f"{g.path.name}: tokenizer model {kind!r} is not supported (only gpt2)")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in DIGIT_SPLIT_PRE:
        pre_tok = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    elif pre in BYTE_LEVEL_PRE:
        pre_tok = byte_level
    else:
        raise ValueError(f"{g.path.name}: pre-tokenizer {pre!r} is not supported")
    tokens = md["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in md.get("tokenizer.ggml.merges", [])]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tok
    tok.decoder = decoders.ByteLevel()
    types = md.get("tokenizer.ggml.token_type") or []
    special = [t for t, ty in zip(tokens, types, strict=False) if ty == TOKEN_CONTROL]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return tok


def text_tokenizer(g: GGUFFile) -> TextTokenizer:
    """The tokenizer, the file's chat template and its named special tokens."""
    md = g.metadata
    tokens = md.get("tokenizer.ggml.tokens", [])
    special = {}
    for key, name in (("bos", "bos"), ("eos", "eos"), ("unknown", "unk"), ("padding", "pad")):
        i = md.get(f"tokenizer.ggml.{key}_token_id")
        if i is not None and 0 <= i < len(tokens):
            special[f"{name}_token"] = tokens[i]
    return TextTokenizer(build_tokenizer(g), md.get("tokenizer.chat_template"), special)


def open_gguf(path: str | Path) -> tuple[GGUFFile, ArchConfig, TextTokenizer]:
    """The file, its architecture and tokenizer; ValueError in one line for anything this engine
    cannot serve (architecture, tensor type, tokenizer). Dequantizes nothing."""
    g = GGUFFile(path)
    config = arch_config(g)
    bad = g.unsupported_types()
    if bad:
        name, kind = next(iter(bad.items()))
        more = f" (and {len(bad) - 1} more tensors)" if len(bad) > 1 else ""
        raise ValueError(f"{g.path.name}: tensor {name} is {kind}, which is not supported{more}")
    try:
        tokenizer = text_tokenizer(g)
    except KeyError as e:
        raise ValueError(f"{g.path.name}: metadata {e} is missing") from None
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(
            f"{g.path.name}: the tokenizer has {tokenizer.vocab_size} tokens, "
            f"vocab_size is {config.vocab_size}"
        )
    return g, config, tokenizer


def gguf_problem(path: str | Path) -> str | None:
    """Why the file cannot be served, in one line; None when it can (check-config asks this)."""
    try:
        open_gguf(path)
    except ValueError as e:
        return str(e)
    return None


def load_gguf(path: str | Path, dtype: torch.dtype | None = None) -> Checkpoint:
    """The checkpoint in a .gguf file, weights on the CPU in `dtype` (default float32)."""
    from talariad.engine.model.loader import Checkpoint, default_dtype

    g, config, tokenizer = open_gguf(path)
    params = load_params(g, config, dtype or default_dtype("cpu"))
    return Checkpoint(config, params, tokenizer)
