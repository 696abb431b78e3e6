"""Admission mechanics: how one call's prompt is obtained here (cached / restored / recomputed) and
the bounded prefill batch that fits a time budget, the running-batch cap and device KV capacity."""

from __future__ import annotations

from collections.abc import Callable

from talariad.types import KVState, LatencyProfile

from .budget import prefill_batch_s
from .calls import CallProgress, SessionLedger
from .knobs import SchedKnobs
from .messages import PrefillItem


def plan_item(rec: CallProgress, ledger: SessionLedger, host_kv: bool) -> PrefillItem:
    """Split the call's context into device-cached, host-restored and recomputed tokens."""
    call = rec.call
    target = rec.kv_len if rec.resumed else call.prompt_tokens
    limit = target if rec.resumed else call.prefix_tokens
    entry = ledger.reusable(call.session_id, call.model, host_kv)
    # NOTE: at least one token is always computed: the engine needs logits for the next token.
    reuse = 0 if entry.state is KVState.MISSING else max(0, min(limit, entry.kv_len, target - 1))
    cached = reuse if entry.state is KVState.DEVICE else 0
    return PrefillItem(call.call_id, reuse - cached, target - reuse, cached)


def has_reusable_prefix(rec: CallProgress, ledger: SessionLedger, host_kv: bool) -> bool:
    item = plan_item(rec, ledger, host_kv)
    return item.cached_device_tokens + item.restore_tokens > 0


BudgetFn = Callable[[int], float]
"""Prefill seconds still available if the running batch would hold this many sequences."""


class BatchBuilder:
    """Greedy FIFO selection of a bounded batch; stops at the first call that does not fit, so a
    large call at the head is not overtaken forever by small ones behind it."""

    def __init__(
        self, knobs: SchedKnobs, profile: LatencyProfile, running: int, kv_used: int, max_items: int
    ) -> None:
        self.knobs, self.profile = knobs, profile
        self.running, self.kv_used = running, kv_used
        self.max_items = min(max_items, knobs.max_batch - running)
        self.items: list[PrefillItem] = []
        self.kv_added = 0

    def predicted_s(self, items: list[PrefillItem] | None = None) -> float:
        return prefill_batch_s(self.items if items is None else items, self.profile)

    def can_add(self, rec: CallProgress, item: PrefillItem, budget: BudgetFn) -> bool:
        if len(self.items) >= self.max_items:
            return False
        if self.kv_used + self.kv_added + rec.kv_reservation > self.knobs.kv_capacity_tokens:
            return False
        tokens = sum(i.recompute_tokens + i.restore_tokens for i in self.items)
        if (
            self.items
            and tokens + item.recompute_tokens + item.restore_tokens > self.knobs.max_prefill_tokens
        ):
            return False
        trial = [*self.items, item]
        return self.predicted_s(trial) <= budget(self.running + len(trial)) + 1e-9

    def add(self, rec: CallProgress, item: PrefillItem) -> None:
        self.items.append(item)
        self.kv_added += rec.kv_reservation

    def fill(
        self, recs: list[CallProgress], ledger: SessionLedger, budget: BudgetFn
    ) -> list[PrefillItem]:
        for rec in recs:
            item = plan_item(rec, ledger, self.knobs.host_kv)
            if not self.can_add(rec, item, budget):
                break
            self.add(rec, item)
        return self.items
