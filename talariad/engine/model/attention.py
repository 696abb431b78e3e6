"""Paged attention in plain torch: the KV pool layout, the per-step batch, KV writes and reads.

KV pool layout (layer-first, one tensor per model):
    kv_pool[layer, 0] = K pages, kv_pool[layer, 1] = V pages
    shape [num_layers, 2, num_pages, page_size, num_kv_heads, head_dim]
Token t of a request lives in page block_table[t // page_size] at offset t % page_size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from talariad.engine.model.config import ArchConfig


def kv_pool_shape(config: ArchConfig, num_pages: int, page_size: int) -> tuple[int, ...]:
    return (
        config.num_hidden_layers,
        2,
        num_pages,
        page_size,
        config.num_key_value_heads,
        config.head_dim,
    )


def kv_page_bytes(config: ArchConfig, page_size: int, dtype: torch.dtype) -> int:
    """Bytes one page takes across all layers, K and V (the pool's size per page)."""
    per_token = config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim
    return per_token * page_size * torch.empty((), dtype=dtype).element_size()


def make_kv_pool(
    config: ArchConfig,
    num_pages: int,
    page_size: int,
    dtype: torch.dtype,
    device: str | torch.device,
) -> torch.Tensor:
    return torch.zeros(kv_pool_shape(config, num_pages, page_size), dtype=dtype, device=device)


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    """The new tokens of B requests, flattened to T tokens, plus where their KV goes and is read."""

    input_ids: torch.Tensor  # [T] new tokens, request after request
    positions: torch.Tensor  # [T] absolute position of each new token
    slot_pages: torch.Tensor  # [T] page that receives each new token's KV
    slot_offsets: torch.Tensor  # [T] offset inside that page
    rows: torch.Tensor  # [T] request index of each token (row in the padded layout)
    cols: torch.Tensor  # [T] index of each token among its request's new tokens
    block_tables: torch.Tensor  # [B, max_pages], padded with page 0 (masked out)
    attn_mask: torch.Tensor  # [B, 1, max_query, max_pages * page_size], True = attend
    last_index: torch.Tensor  # [B] index in T of each request's last new token

    @property
    def num_requests(self) -> int:
        return self.block_tables.shape[0]

    @property
    def max_query_len(self) -> int:
        return self.attn_mask.shape[2]


def build_batch(
    items: Sequence[tuple[Sequence[int], int, Sequence[int]]],
    page_size: int,
    device: str | torch.device,
) -> ForwardBatch:
    """items: (new_token_ids, start, block_table) per request; start = tokens already cached."""
    ids, pos, rows, cols = [], [], [], []
    for b, (new_ids, start, _) in enumerate(items):
        ids += list(new_ids)
        pos += range(start, start + len(new_ids))
        rows += [b] * len(new_ids)
        cols += range(len(new_ids))
    # only the pages that hold the sequence so far; the rest of a table is not read
    used = [list(bt[: -(-(start + len(new)) // page_size)]) for new, start, bt in items]
    width = max(len(bt) for bt in used)
    tables = [bt + [0] * (width - len(bt)) for bt in used]
    t = _tensors(device, ids=ids, pos=pos, rows=rows, cols=cols, tables=tables)
    pages = t["tables"][t["rows"], t["pos"] // page_size]
    query_lens = [len(new_ids) for new_ids, _, _ in items]
    return ForwardBatch(
        input_ids=t["ids"],
        positions=t["pos"],
        slot_pages=pages,
        slot_offsets=t["pos"] % page_size,
        rows=t["rows"],
        cols=t["cols"],
        block_tables=t["tables"],
        attn_mask=_causal_mask(items, max(query_lens), width * page_size, device),
        last_index=torch.tensor(query_lens, device=device).cumsum(0) - 1,
    )


def _tensors(device: str | torch.device, **lists: list) -> dict[str, torch.Tensor]:
    return {k: torch.tensor(v, dtype=torch.long, device=device) for k, v in lists.items()}


def _causal_mask(items, max_query: int, max_kv: int, device) -> torch.Tensor:
    # query i of request b sits at position start_b + i and sees keys 0..start_b + i
    starts = torch.tensor([start for _, start, _ in items], device=device)
    seq_lens = torch.tensor([start + len(new) for new, start, _ in items], device=device)
    q_pos = starts[:, None] + torch.arange(max_query, device=device)[None, :]
    k_pos = torch.arange(max_kv, device=device)
    k_pos = k_pos[None, None, :]
    mask = (k_pos <= q_pos[:, :, None]) & (k_pos < seq_lens[:, None, None])
    return mask[:, None]


def write_kv(kv_layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch) -> None:
    """Store the new tokens' K/V [T, Hkv, D] into their pages (in place in the pool)."""
    kv_layer[0][batch.slot_pages, batch.slot_offsets] = k.to(kv_layer.dtype)
    kv_layer[1][batch.slot_pages, batch.slot_offsets] = v.to(kv_layer.dtype)


def paged_attention(q: torch.Tensor, kv_layer: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
    """q [T, H, D] attends to its request's pages (cached prefix + new tokens) -> [T, H, D]."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    q_pad = q.new_zeros(batch.num_requests, batch.max_query_len, num_heads, head_dim)
    q_pad[batch.rows, batch.cols] = q
    k, v = (_gather_pages(kv_layer[i], batch.block_tables).to(q.dtype) for i in (0, 1))
    out = F.scaled_dot_product_attention(
        q_pad.transpose(1, 2),
        k,
        v,
        attn_mask=batch.attn_mask,
        enable_gqa=k.shape[1] != num_heads,  # GQA: heads share their group's K/V, not copied
    )
    return out.transpose(1, 2)[batch.rows, batch.cols]


def _gather_pages(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[num_pages, S, Hkv, D] gathered by block tables -> [B, Hkv, max_pages * S, D]."""
    b, width = block_tables.shape
    pages = cache[block_tables]  # [B, max_pages, S, Hkv, D]
    return pages.reshape(b, width * cache.shape[1], cache.shape[2], cache.shape[3]).transpose(1, 2)
