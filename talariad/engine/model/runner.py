"""ModelRunner: a model's weights, paged KV pool and page allocator; prefill, decode, generate.

Weights are a dict of tensors and the pool is a plain tensor, both passed in (or built here),
so either can be re-pointed at views of a larger buffer with bind_params / bind_kv_pool.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch

from talariad.engine.model import llama
from talariad.engine.model.attention import build_batch, kv_pool_shape, make_kv_pool
from talariad.engine.model.config import ArchConfig
from talariad.engine.model.paged import BlockTables
from talariad.engine.model.sampling import SamplingParams, finish_reason, make_generator, sample


@dataclass(frozen=True, slots=True)
class PrefillSeq:
    req_id: Hashable
    token_ids: Sequence[int]
    """The whole prompt; only token_ids[cached_len:] is computed."""
    cached_len: int
    """Leading tokens whose KV is already in the block table's pages."""
    block_table: Sequence[int]
    """Pages covering len(token_ids) tokens."""


@dataclass(frozen=True, slots=True)
class DecodeSeq:
    req_id: Hashable
    token_id: int
    position: int
    """Index of token_id in the sequence (= tokens already cached)."""
    block_table: Sequence[int]
    """Pages covering position + 1 tokens."""


@dataclass(slots=True)
class Generation:
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None


class ModelRunner:
    def __init__(
        self,
        config: ArchConfig,
        params: llama.Params,
        *,
        num_pages: int = 256,
        page_size: int = 16,
        kv_pool: torch.Tensor | None = None,
    ) -> None:
        """A given kv_pool fixes num_pages and page_size (its dims 2 and 3)."""
        llama.check_params(config, params)
        self.config = config
        self.params = params
        first = next(iter(params.values()))
        self.device, self.dtype = first.device, first.dtype
        if kv_pool is not None and kv_pool.dim() == 6:
            num_pages, page_size = kv_pool.shape[2], kv_pool.shape[3]
        self.page_size = page_size
        self.allocator = BlockTables(num_pages, page_size)
        self.inv_freq = llama.rope_inv_freq(config, self.device)
        if kv_pool is None:
            kv_pool = make_kv_pool(config, num_pages, page_size, self.dtype, self.device)
        self.kv_pool = self._checked_pool(kv_pool)
        self._ids = itertools.count()

    def bind_params(self, params: llama.Params) -> None:
        """Re-point the weights (e.g. at views of a bump buffer) without copying."""
        llama.check_params(self.config, params)
        self.params = params

    def bind_kv_pool(self, kv_pool: torch.Tensor) -> None:
        self.kv_pool = self._checked_pool(kv_pool)

    def _checked_pool(self, kv_pool: torch.Tensor) -> torch.Tensor:
        want = kv_pool_shape(self.config, self.allocator.num_pages, self.page_size)
        if tuple(kv_pool.shape) != want or kv_pool.device != self.device:
            raise ValueError(f"kv_pool is {tuple(kv_pool.shape)} on {kv_pool.device}, want {want}")
        return kv_pool

    @torch.inference_mode()
    def run(self, items: Sequence[tuple], all_logits: bool = False) -> torch.Tensor:
        """items: (new_token_ids, start_position, block_table); see llama.forward for the result."""
        for new_ids, start, table in items:
            self._check_item(len(new_ids), start, table)
        batch = build_batch(items, self.page_size, self.device)
        return llama.forward(
            self.config, self.params, self.inv_freq, batch, self.kv_pool, all_logits
        )

    def prefill(self, items: Sequence[PrefillSeq], all_logits: bool = False) -> torch.Tensor:
        """Compute each prompt's uncached tail; logits [B, vocab] for each prompt's last token."""
        # a fully cached prompt recomputes its last token: logits need a query; the rewrite is
        # idempotent
        starts = [min(it.cached_len, len(it.token_ids) - 1) for it in items]
        return self.run(
            [(it.token_ids[s:], s, it.block_table) for it, s in zip(items, starts, strict=False)],
            all_logits,
        )

    def decode(self, items: Sequence[DecodeSeq]) -> torch.Tensor:
        return self.run([([it.token_id], it.position, it.block_table) for it in items])

    def _check_item(self, num_new: int, start: int, table: Sequence[int]) -> None:
        if num_new < 1 or start < 0:
            raise ValueError(f"need >= 1 new token and start >= 0 (got {num_new}, {start})")
        if len(table) * self.page_size < start + num_new:
            raise ValueError(
                f"block table of {len(table)} pages cannot hold {start + num_new} tokens"
            )
        if any(not 0 <= p < self.allocator.num_pages for p in table):
            raise ValueError(f"block table {list(table)} names pages outside the pool")

    def read_pages(self, pages: Sequence[int]) -> torch.Tensor:
        """A copy of the pages' KV, [num_layers, 2, len(pages), page_size, Hkv, D] (layer-first)."""
        return self.kv_pool[:, :, list(pages)].clone()

    def write_pages(self, pages: Sequence[int], kv: torch.Tensor) -> None:
        """Store KV read by read_pages (from any device) into `pages`, e.g. to restore a prefix."""
        self.kv_pool[:, :, list(pages)] = kv.to(self.kv_pool.device, self.kv_pool.dtype)

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Generation | None:
        out = self.generate_many([prompt_ids], [sampling])
        return None if out is None else out[0]

    def generate_many(
        self, prompts: Sequence[Sequence[int]], samplings: Sequence[SamplingParams]
    ) -> list[Generation] | None:
        """Run the prompts as one batch until each finishes; None if the pool cannot hold them.

        Pages come from this runner's allocator and are freed on return.
        """
        need = [len(p) + s.max_tokens for p, s in zip(prompts, samplings, strict=False)]
        if sum(self.allocator.pages_for(n) for n in need) > self.allocator.num_free_pages:
            return None
        req_ids = [("generate", next(self._ids)) for _ in prompts]
        tables = [self.allocator.allocate(r, n) for r, n in zip(req_ids, need, strict=False)]
        try:
            items = [
                PrefillSeq(r, p, 0, t) for r, p, t in zip(req_ids, prompts, tables, strict=False)
            ]
            return self.generate_batch(items, samplings)
        finally:
            for r in req_ids:
                self.allocator.free(r)

    def generate_batch(
        self, items: Sequence[PrefillSeq], samplings: Sequence[SamplingParams]
    ) -> list[Generation]:
        """Prefill (reusing each item's cached_len) then decode until every request finishes.

        The caller owns the block tables; each must cover len(token_ids) + max_tokens - 1 tokens.
        On return the pages hold the KV of the prompt and of all generated tokens but the last.
        """
        gens = [make_generator(s) for s in samplings]
        outs = [Generation() for _ in items]
        logits = self.prefill(items)
        live = list(range(len(items)))
        while live:
            tokens = sample(logits, [samplings[i] for i in live], [gens[i] for i in live])
            for i, tok in zip(live, tokens, strict=False):
                outs[i].token_ids.append(tok)
                outs[i].finish_reason = finish_reason(
                    tok, len(outs[i].token_ids), samplings[i], self.config.eos_token_ids
                )
            live = [i for i in live if outs[i].finish_reason is None]
            if live:
                logits = self.decode([_next_step(items[i], outs[i]) for i in live])
        return outs


def _next_step(item: PrefillSeq, out: Generation) -> DecodeSeq:
    position = len(item.token_ids) + len(out.token_ids) - 1
    return DecodeSeq(item.req_id, out.token_ids[-1], position, item.block_table)
