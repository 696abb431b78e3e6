"""Peer routers as baselines: SGLang cache-aware, Dynamo KV cost, llm-d weighted scorers.

Each rule is its project's router as its source defines it, at its defaults. Each chooses among
every instance allowed the model by its own rule; residency is not one of their signals, so a
peer may send a call where the model is not loaded and the instance pays the open or switch.
Our telemetry stands in for theirs; the rules, the mapping and each peer's defaults:
docs/internals.md.
"""

from __future__ import annotations

import math

from talariad.router.messages import CallRequest
from talariad.router.policies.base import POLICIES, Choice, ClusterView, Policy, placed
from talariad.router.policies.prefix_index import RoutedPrefixIndex
from talariad.router.telemetry import InstanceState
from talariad.types import KVState

BLOCK = 16


@POLICIES.register("sglang-cache-aware")
class SGLangCacheAwarePolicy(Policy):
    CACHE_THRESHOLD = 0.3
    BALANCE_ABS = 64
    BALANCE_REL = 1.5
    EVICTION_INTERVAL_S = 120.0
    MAX_TREE_SIZE = 1 << 26

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.index = RoutedPrefixIndex(self.MAX_TREE_SIZE)
        self._last_evict: float | None = None

    def choose(self, call: CallRequest, view: ClusterView, now: float) -> Choice:
        self._maybe_evict(now)
        insts = view.eligible(call.model, now)
        if not insts:
            return placed(view, call, None, insts, "no eligible instance")
        loads = [ClusterView.load(i) for i in insts]
        shortest = min(insts, key=ClusterView.load)  # first minimum, as `min_by_key`
        lo, hi = min(loads), max(loads)
        scores = {i.name: float(ClusterView.load(i)) for i in insts}
        if hi - lo > self.BALANCE_ABS and hi > self.BALANCE_REL * lo:
            return placed(view, call, shortest, insts, "imbalanced: shortest queue", scores)
        matches = self.index.matches(call.model, call.session_id, call.prefix_tokens)
        w_tree, matched = self._deepest(matches)
        rate = matched / call.prompt_tokens if call.prompt_tokens else 0.0
        if rate <= self.CACHE_THRESHOLD:
            return placed(view, call, shortest, insts, f"cache miss ({rate:.2f}): min load", scores)
        by_name = {i.name: i for i in insts}
        inst = by_name.get(w_tree, insts[0])  # unhealthy tree tenant: first healthy worker
        return placed(view, call, inst, insts, f"cache hit ({rate:.2f})", scores)

    def on_placed(self, call: CallRequest, instance: str, now: float) -> None:
        self.index.insert(call.model, call.session_id, instance, call.prompt_tokens)

    @staticmethod
    def _deepest(matches: dict[str, tuple[int, int]]) -> tuple[str | None, int]:
        if not matches:
            return None, 0
        name, (tokens, _) = max(matches.items(), key=lambda kv: kv[1])
        return name, tokens

    def _maybe_evict(self, now: float) -> None:
        if self._last_evict is None:
            self._last_evict = now
        elif now - self._last_evict >= self.EVICTION_INTERVAL_S:
            self.index.evict()
            self._last_evict = now


@POLICIES.register("dynamo-kv")
class DynamoKVPolicy(Policy):
    OVERLAP_WEIGHT = 1.0
    HOST_HIT_WEIGHT = 0.75

    def choose(self, call: CallRequest, view: ClusterView, now: float) -> Choice:
        insts = view.eligible(call.model, now)
        logits = {i.name: self._logit(call, view, i) for i in insts}
        best = min(logits.values(), default=None)
        ties = [i for i in insts if logits[i.name] == best]
        if len(ties) > 1:
            smallest = min(len(i.snapshot.sessions) for i in ties)
            ties = [i for i in ties if len(i.snapshot.sessions) == smallest]
        inst = self.rng.choice(ties) if len(ties) > 1 else (ties[0] if ties else None)
        return placed(view, call, inst, insts, "min KV logit", logits)

    def _logit(self, call: CallRequest, view: ClusterView, inst: InstanceState) -> float:
        state, kv_len = view.kv(inst, call)
        cached_blocks = min(kv_len, call.prefix_tokens) // BLOCK
        device = cached_blocks if state is KVState.DEVICE else 0
        host = cached_blocks if state is KVState.HOST else 0
        overlap = device + self.HOST_HIT_WEIGHT * host
        active_prefill = sum(r.call.prompt_tokens for r in inst.inflight.values())
        active_blocks = sum(math.ceil(r.call.prompt_tokens / BLOCK) for r in inst.inflight.values())
        prefill_tokens = active_prefill + max(call.prompt_tokens - overlap * BLOCK, 0.0)
        new_blocks = math.ceil(max(call.prompt_tokens - device * BLOCK, 0) / BLOCK)
        return self.OVERLAP_WEIGHT * prefill_tokens / BLOCK + active_blocks + new_blocks


LLMD_WEIGHTS = (3.0, 2.0, 2.0)  # prefix-cache, queue, kv-cache-utilization (GIE's defaults)
LLMD_MAX_BLOCKS = 256  # the prefix scorer matches at most this many blocks
LLMD_LRU_BLOCKS = 31_250  # its approximate producer's index, per server


def llmd_scores(
    prompt_tokens: int,
    matched_tokens: dict[str, int],
    queues: dict[str, float],
    kv_util: dict[str, float],
) -> dict[str, float]:
    """GIE's default scorer mix per endpoint (each of `queues`): prefix-cache (matched / total
    16-token blocks, at most LLMD_MAX_BLOCKS), queue ((max Q - Q) / (max Q - min Q), 1.0 when
    all are equal) and kv-cache-utilization (1 - use), weighted by LLMD_WEIGHTS."""
    total = min(math.ceil(prompt_tokens / BLOCK), LLMD_MAX_BLOCKS)
    lo, hi = min(queues.values(), default=0), max(queues.values(), default=0)
    wp, wq, wk = LLMD_WEIGHTS
    out = {}
    for name, q in queues.items():
        matched = min(matched_tokens.get(name, 0) // BLOCK, total)
        prefix = matched / total if total else 0.0
        queue = 1.0 if hi == lo else (hi - q) / (hi - lo)
        kv = 1.0 - min(max(kv_util[name], 0.0), 1.0)
        out[name] = wp * prefix + wq * queue + wk * kv
    return out


@POLICIES.register("llm-d")
class LlmDPolicy(Policy):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.index = RoutedPrefixIndex(LLMD_LRU_BLOCKS * BLOCK)

    def choose(self, call: CallRequest, view: ClusterView, now: float) -> Choice:
        insts = view.eligible(call.model, now)
        scores = self._scores(call, insts)
        order = list(insts)
        self.rng.shuffle(order)  # max-score picker: shuffle first, so ties break at random
        inst = max(order, key=lambda i: scores[i.name], default=None)
        return placed(view, call, inst, insts, "max weighted score", scores)

    def on_placed(self, call: CallRequest, instance: str, now: float) -> None:
        self.index.insert(call.model, call.session_id, instance, call.prompt_tokens)
        self.index.evict()

    def _scores(self, call: CallRequest, insts: list[InstanceState]) -> dict[str, float]:
        matches = self.index.matches(call.model, call.session_id, call.prefix_tokens)
        return llmd_scores(
            call.prompt_tokens,
            {name: m[0] for name, m in matches.items()},
            {i.name: self._queue_len(i) for i in insts},
            {i.name: i.snapshot.kv_occupancy for i in insts},
        )

    @staticmethod
    def _queue_len(inst: InstanceState) -> int:
        queued = sum(r.queued_calls for r in inst.snapshot.models.values())
        return queued + inst.ov_calls
