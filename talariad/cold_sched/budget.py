"""Round and slot budgets: Eq. (3) round composition, Eq. (4) decode share, Eq. (5) round bound,
and the predicted cost of a prefill batch (prefill + restore, the SP_{m,k} term of Eq. (3))."""

from __future__ import annotations

import math
from dataclasses import dataclass

from talariad.types import LatencyProfile

from .messages import PrefillItem


def decode_iterations(round_s: float, tpot_s: float, step_s: float) -> int | None:
    """Least d_m with d_m * (T_TPOT - t_D) >= R - d_m * t_D (Eq. 4); None if T_TPOT <= t_D."""
    if tpot_s <= step_s:
        return None
    # NOTE: this is d_m * T_TPOT >= R: the average time per token R / d_m stays <= T_TPOT.
    return max(1, math.ceil(round_s / tpot_s - 1e-9))


def prefill_batch_s(items: list[PrefillItem], profile: LatencyProfile) -> float:
    """Predicted time of one batched prefill: one base cost, per-token compute and restore."""
    recompute = sum(item.recompute_tokens for item in items)
    restore = sum(item.restore_tokens for item in items)
    return profile.prefill_s(recompute) + profile.restore_s(restore)


def restore_batch_s(items: list[PrefillItem], profile: LatencyProfile) -> float:
    return profile.restore_s(sum(item.restore_tokens for item in items))


@dataclass(frozen=True)
class SlotPlan:
    """The budget of one slot: its share of the round bound and its protected decode iterations."""

    budget_s: float
    decode_iters: int
    step_s: float
    feasible: bool
    """False when the decode reservations and switches alone break Eq. (4) or Eq. (5)."""

    @property
    def decode_reserve_s(self) -> float:
        return min(self.budget_s, self.decode_iters * self.step_s)

    @property
    def prefill_budget_s(self) -> float:
        return max(0.0, self.budget_s - self.decode_reserve_s)


def plan_slot(
    round_bound_s: float,
    n_active: int,
    switch_s: float,
    tpot_s: float,
    step_s: float,
    max_switch_share: float = 0.5,
) -> SlotPlan:
    """Split the Eq. (5) bound equally among the active models after the round's switch costs.

    Infeasible plans are marked, not hidden: switches above max_switch_share of the bound grow the
    round; a decode reservation larger than the share leaves no prefill budget."""
    round_s = max(round_bound_s, switch_s / max_switch_share)
    share = (round_s - switch_s) / max(n_active, 1)
    budget = max(share, step_s)  # a slot always fits one decode step, or nothing would progress
    iters = decode_iterations(round_s, tpot_s, step_s)
    if iters is None:  # TPOT infeasible for this profile: decode takes the whole slot
        return SlotPlan(budget, math.ceil(budget / step_s), step_s, False)
    feasible = share >= iters * step_s and round_s <= round_bound_s
    return SlotPlan(budget, iters, step_s, feasible)
