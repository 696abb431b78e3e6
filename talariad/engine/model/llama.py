"""The Llama/Qwen2 decoder as functions over a dict of HF-named tensors (re-pointable to views).

Parameters are looked up by name on every forward, so replacing `params[name]` with a view of
another buffer (e.g. a bump allocator's weight region) rebinds the model without copying.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from talariad.engine.model.attention import ForwardBatch, paged_attention, write_kv
from talariad.engine.model.config import ArchConfig

Params = dict[str, torch.Tensor]
EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"


def param_shapes(config: ArchConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the model reads, by HF name, with its shape (lm_head absent when tied)."""
    c = config
    q_out, kv_out = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    shapes = {EMBED: (c.vocab_size, c.hidden_size), FINAL_NORM: (c.hidden_size,)}
    if not c.tie_word_embeddings:
        shapes[LM_HEAD] = (c.vocab_size, c.hidden_size)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (c.hidden_size,)
        shapes[p + "post_attention_layernorm.weight"] = (c.hidden_size,)
        for name, out in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
            shapes[f"{p}self_attn.{name}.weight"] = (out, c.hidden_size)
            if c.qkv_bias:
                shapes[f"{p}self_attn.{name}.bias"] = (out,)
        shapes[p + "self_attn.o_proj.weight"] = (c.hidden_size, q_out)
        if c.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (c.hidden_size,)
        shapes[p + "mlp.gate_proj.weight"] = (c.intermediate_size, c.hidden_size)
        shapes[p + "mlp.up_proj.weight"] = (c.intermediate_size, c.hidden_size)
        shapes[p + "mlp.down_proj.weight"] = (c.hidden_size, c.intermediate_size)
    return shapes


def check_params(config: ArchConfig, params: Params) -> None:
    """Raise ValueError naming the first missing or mis-shaped tensors."""
    shapes = param_shapes(config)
    missing = [n for n in shapes if n not in params]
    if missing:
        raise ValueError(f"missing {len(missing)} weight tensor(s), e.g. {missing[:3]}")
    wrong = [
        f"{n}: {tuple(params[n].shape)} != {s}" for n, s in shapes.items() if params[n].shape != s
    ]
    if wrong:
        raise ValueError(f"{len(wrong)} weight tensor(s) have the wrong shape, e.g. {wrong[:3]}")


def rope_inv_freq(config: ArchConfig, device: str | torch.device = "cpu") -> torch.Tensor:
    d = config.head_dim
    # float32 exponents, as HF computes them, so real checkpoints match bit for bit
    exps = torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d
    inv = 1.0 / (config.rope_theta**exps)
    rs = config.rope_scaling
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        inv = _llama3_scale(inv, rs)
    return inv


def _llama3_scale(inv: torch.Tensor, rs: dict) -> torch.Tensor:
    # long wavelengths are slowed by `factor`, short ones kept, the band between interpolated
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old_len = rs["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    smooth = (old_len / wavelen - low) / (high - low)
    mid = (1 - smooth) * inv / factor + smooth * inv
    scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
    is_mid = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_mid, mid, scaled)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]; cos/sin [T, D] (HF's rotate-half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def _rope_tables(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _linear(x: torch.Tensor, params: Params, name: str) -> torch.Tensor:
    return F.linear(x, params[name + ".weight"], params.get(name + ".bias"))


def attention_block(config, params, prefix, x, rope, kv_layer, batch) -> torch.Tensor:
    c, t = config, x.shape[0]
    q = _linear(x, params, prefix + "q_proj").view(t, c.num_attention_heads, c.head_dim)
    k = _linear(x, params, prefix + "k_proj").view(t, c.num_key_value_heads, c.head_dim)
    v = _linear(x, params, prefix + "v_proj").view(t, c.num_key_value_heads, c.head_dim)
    q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    write_kv(kv_layer, k, v, batch)
    out = paged_attention(q, kv_layer, batch)
    return _linear(out.reshape(t, -1), params, prefix + "o_proj")


def mlp_block(params: Params, prefix: str, x: torch.Tensor) -> torch.Tensor:
    gate = _linear(x, params, prefix + "gate_proj")
    return _linear(
        F.silu(gate) * _linear(x, params, prefix + "up_proj"), params, prefix + "down_proj"
    )


def decoder_layer(config, params, i, h, rope, kv_layer, batch) -> torch.Tensor:
    p, eps = f"model.layers.{i}.", config.rms_norm_eps
    x = rms_norm(h, params[p + "input_layernorm.weight"], eps)
    h = h + attention_block(config, params, p + "self_attn.", x, rope, kv_layer, batch)
    x = rms_norm(h, params[p + "post_attention_layernorm.weight"], eps)
    return h + mlp_block(params, p + "mlp.", x)


def forward(
    config: ArchConfig,
    params: Params,
    inv_freq: torch.Tensor,
    batch: ForwardBatch,
    kv_pool: torch.Tensor,
    all_logits: bool = False,
) -> torch.Tensor:
    """Run the new tokens, writing their KV into the pool.

    Returns float32 logits [B, vocab] for each request's last token, or [T, vocab] for every
    new token when `all_logits`.
    """
    h = F.embedding(batch.input_ids, params[EMBED])
    rope = _rope_tables(inv_freq, batch.positions, h.dtype)
    for i in range(config.num_hidden_layers):
        h = decoder_layer(config, params, i, h, rope, kv_pool[i], batch)
    if not all_logits:
        h = h[batch.last_index]
    h = rms_norm(h, params[FINAL_NORM], config.rms_norm_eps)
    head = params[EMBED] if config.tie_word_embeddings else params[LM_HEAD]
    return F.linear(h, head).float()
