"""Test helpers: an independent dense (unpaged) decoder to check the paged engine against."""

from __future__ import annotations

import random

import pytest
import torch

from talariad.engine.model import ArchConfig, ModelRunner, random_weights, tiny_config

CUDA_REASON = "no CUDA device: torch.cuda.is_available() is False"
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not torch.cuda.is_available(), reason=CUDA_REASON),
        ],
    ),
]


def tol(device: str) -> dict[str, float]:
    return {"atol": 1e-4, "rtol": 1e-4} if device == "cpu" else {"atol": 2e-3, "rtol": 2e-3}


def _norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x [H, T, D]; rotate pairs (i, i + D/2) by angle pos * theta^(-2i/D)."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
    ang = torch.arange(x.shape[1], device=x.device, dtype=torch.float32)[:, None] * inv
    cos, sin = ang.cos(), ang.sin()
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


def dense_logits(config: ArchConfig, params: dict, token_ids: list[int]) -> torch.Tensor:
    """Logits [T, vocab] for every position, recomputing the whole sequence with no cache."""
    c, p = config, params
    x = p["model.embed_tokens.weight"][
        torch.tensor(token_ids, device=p["model.norm.weight"].device)
    ]
    t, group = len(token_ids), c.num_attention_heads // c.num_key_value_heads
    causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
    for i in range(c.num_hidden_layers):
        pre = f"model.layers.{i}."
        h = _norm(x, p[pre + "input_layernorm.weight"], c.rms_norm_eps)
        q, k, v = (
            (h @ p[f"{pre}self_attn.{n}_proj.weight"].T + p.get(f"{pre}self_attn.{n}_proj.bias", 0))
            .view(t, -1, c.head_dim)
            .transpose(0, 1)
            for n in "qkv"
        )
        q, k = _rope(q, c.rope_theta), _rope(k, c.rope_theta)
        kv_head = torch.arange(c.num_attention_heads, device=x.device) // group
        scores = (q @ k[kv_head].transpose(1, 2)) / c.head_dim**0.5
        attn = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v[kv_head]
        o = attn.transpose(0, 1).reshape(t, -1) @ p[pre + "self_attn.o_proj.weight"].T
        x = x + o + p.get(pre + "self_attn.o_proj.bias", 0)
        h = _norm(x, p[pre + "post_attention_layernorm.weight"], c.rms_norm_eps)
        gate, up = h @ p[pre + "mlp.gate_proj.weight"].T, h @ p[pre + "mlp.up_proj.weight"].T
        x = x + (gate * torch.sigmoid(gate) * up) @ p[pre + "mlp.down_proj.weight"].T
    head = p["model.embed_tokens.weight"] if c.tie_word_embeddings else p["lm_head.weight"]
    return _norm(x, p["model.norm.weight"], c.rms_norm_eps) @ head.T


def dense_greedy(config: ArchConfig, params: dict, prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(dense_logits(config, params, seq)[-1].argmax()))
    return seq[len(prompt) :]


PROMPT = [5 + (7 * i) % 300 for i in range(37)]


def make_runner(device="cpu", num_pages=64, page_size=4, seed=0, **overrides) -> ModelRunner:
    config = tiny_config(**overrides)
    return ModelRunner(
        config, random_weights(config, seed, device), num_pages=num_pages, page_size=page_size
    )


def scrambled_table(runner: ModelRunner, req_id, num_tokens: int, seed: int = 0) -> list[int]:
    """Pages in a shuffled, non-contiguous order, to exercise the block-table indirection."""
    table = runner.allocator.allocate(req_id, num_tokens)
    random.Random(seed).shuffle(table)
    return table
