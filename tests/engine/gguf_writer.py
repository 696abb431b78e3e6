"""Write small GGUF files for the reader's tests: a GGUF v3 writer, a Q8_0 quantizer, ggml's block
dequantization as scalar loops (the reference the vectorized reader is checked against), and a
tiny Llama written the way llama.cpp's converter writes one."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from talariad.engine.model.gguf import ARRAY, STRING
from talariad.engine.model.gguf_model import permute
from talariad.engine.model.llama import param_shapes
from talariad.engine.model.loader import random_weights
from talariad.engine.model.tokenizer import FALLBACK_CHAT_TEMPLATE, build_tiny_tokenizer

F32, F16, Q8_0, BF16 = 0, 1, 8, 30
_HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _value(v) -> tuple[int, bytes]:
    if isinstance(v, bool):
        return 7, struct.pack("<?", v)
    if isinstance(v, int):
        return 4, struct.pack("<I", v)
    if isinstance(v, float):
        return 6, struct.pack("<f", v)
    if isinstance(v, str):
        return STRING, _string(v)
    itype, _ = _value(v[0])
    body = b"".join(_value(x)[1] for x in v)
    return ARRAY, struct.pack("<IQ", itype, len(v)) + body


def _string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<Q", len(raw)) + raw


def write_gguf(path, metadata: dict, tensors: dict[str, tuple[int, tuple, bytes]]) -> Path:
    """tensors: name -> (ggml type, shape in numpy order, raw bytes)."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata)))
    for key, v in metadata.items():
        vtype, raw = _value(v)
        out += _string(key) + struct.pack("<I", vtype) + raw
    offset, blobs = 0, []
    for name, (ttype, shape, raw) in tensors.items():
        dims = list(reversed(shape))
        out += _string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", ttype, offset)
        pad = -len(raw) % 32
        blobs.append(raw + bytes(pad))
        offset += len(raw) + pad
    out += bytes(-len(out) % 32)
    Path(path).write_bytes(bytes(out) + b"".join(blobs))
    return Path(path)


def quantize_q8_0(x: np.ndarray) -> bytes:
    blocks = x.astype(np.float32).reshape(-1, 32)
    d = np.abs(blocks).max(axis=1, keepdims=True) / 127
    q = np.round(blocks / np.where(d == 0, 1, d)).astype(np.int8)
    return b"".join(
        d16.astype(np.float16).tobytes() + qs.tobytes() for d16, qs in zip(d, q, strict=True)
    )


def encode(x: np.ndarray, ttype: int) -> bytes:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if ttype == F32:
        return x.tobytes()
    if ttype == F16:
        return x.astype(np.float16).tobytes()
    if ttype == BF16:
        return (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    return quantize_q8_0(x)


# ---- ggml-quants.c dequantize_row_* as scalar loops -------------------------------------------


def _h(b: bytes, i: int) -> float:
    return float(np.frombuffer(b[i : i + 2], dtype=np.float16)[0])


def ref_block(name: str, b: bytes) -> list[float]:
    if name == "Q8_0":
        d = _h(b, 0)
        return [d * int(np.int8(np.uint8(q))) for q in b[2:34]]
    if name in ("Q4_0", "Q4_1"):
        d, m, qs = (
            (_h(b, 0), -8 * _h(b, 0), b[2:18]) if name == "Q4_0" else (_h(b, 0), _h(b, 2), b[4:20])
        )
        return [d * (q & 0xF) + m for q in qs] + [d * (q >> 4) + m for q in qs]
    if name == "Q4_K":
        d, dmin, sc, qs = _h(b, 0), _h(b, 2), b[4:16], b[16:144]
        out = []
        for j in range(4):
            (s1, m1), (s2, m2) = _scale_min_k4(2 * j, sc), _scale_min_k4(2 * j + 1, sc)
            q = qs[32 * j : 32 * j + 32]
            out += [d * s1 * (x & 0xF) - dmin * m1 for x in q]
            out += [d * s2 * (x >> 4) - dmin * m2 for x in q]
        return out
    assert name == "Q6_K"
    ql, qh, sc, d = b[0:128], b[128:192], np.frombuffer(b[192:208], np.int8), _h(b, 208)
    y = [0.0] * 256
    for n in range(2):  # two halves of 128
        for i in range(32):
            is_ = i // 16
            L, H, S, base = ql[64 * n :], qh[32 * n :], sc[8 * n :], 128 * n
            q1 = ((L[i] & 0xF) | (((H[i] >> 0) & 3) << 4)) - 32
            q2 = ((L[i + 32] & 0xF) | (((H[i] >> 2) & 3) << 4)) - 32
            q3 = ((L[i] >> 4) | (((H[i] >> 4) & 3) << 4)) - 32
            q4 = ((L[i + 32] >> 4) | (((H[i] >> 6) & 3) << 4)) - 32
            y[base + i] = d * S[is_] * q1
            y[base + i + 32] = d * S[is_ + 2] * q2
            y[base + i + 64] = d * S[is_ + 4] * q3
            y[base + i + 96] = d * S[is_ + 6] * q4
    return y


def _scale_min_k4(j: int, q: bytes) -> tuple[int, int]:
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


# ---- a tiny Llama as llama.cpp writes it --------------------------------------------------------


def tiny_llama_gguf(path, config, seed: int = 0, types: dict[str, int] | None = None, **meta):
    """`config`'s seeded random weights (q/k permuted, as the converter does) with the tiny
    byte-level tokenizer; `types`: GGUF name -> ggml type (default F32); `meta` overrides keys."""
    params = random_weights(config, seed)
    tensors = {}
    for hf in param_shapes(config):
        w = params[hf].numpy()
        name = _gguf_name(hf)
        if name.endswith("attn_q.weight"):
            w = permute(w, config.num_attention_heads)
        elif name.endswith("attn_k.weight"):
            w = permute(w, config.num_key_value_heads)
        ttype = (types or {}).get(name, F32)
        tensors[name] = (ttype, w.shape, encode(w, ttype))
    tok = json.loads(build_tiny_tokenizer(min(config.vocab_size, 320)).to_str())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    special = {t["content"] for t in tok["added_tokens"] if t["special"]}
    arch = "llama"
    metadata = {
        "general.architecture": arch,
        f"{arch}.block_count": config.num_hidden_layers,
        f"{arch}.context_length": config.max_position_embeddings,
        f"{arch}.embedding_length": config.hidden_size,
        f"{arch}.feed_forward_length": config.intermediate_size,
        f"{arch}.attention.head_count": config.num_attention_heads,
        f"{arch}.attention.head_count_kv": config.num_key_value_heads,
        f"{arch}.attention.layer_norm_rms_epsilon": config.rms_norm_eps,
        f"{arch}.rope.freq_base": config.rope_theta,
        f"{arch}.vocab_size": config.vocab_size,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": [t for t, _ in vocab],
        "tokenizer.ggml.token_type": [3 if t in special else 1 for t, _ in vocab],
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.eos_token_id": tok["model"]["vocab"]["<|im_end|>"],
        "tokenizer.chat_template": FALLBACK_CHAT_TEMPLATE,
        **meta,
    }
    return write_gguf(path, metadata, tensors), params


def _gguf_name(hf: str) -> str:
    if hf in _HF_TO_GGUF:
        return _HF_TO_GGUF[hf]
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{_HF_TO_GGUF[rest]}"
