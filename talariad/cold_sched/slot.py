"""One model slot, P -> D1 -> (SP -> D)* -> Dfin (§3.4, Figure 4), and its budget arithmetic.
Only the slot's own methods move its phase."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .budget import SlotPlan


class SlotPhase(str, enum.Enum):
    P = "P"
    D1 = "D1"
    SP = "SP"
    D = "D"
    DFIN = "Dfin"


@dataclass
class Slot:
    model: str
    round_index: int
    opened_at: float
    plan: SlotPlan
    phase: SlotPhase = SlotPhase.P
    decode_steps: int = 0
    prefill_spent_s: float = 0.0
    """Predicted P and SP time charged to this slot; at most plan.prefill_budget_s."""
    p_pending: list[str] = field(default_factory=list)
    """Calls waiting when the slot opened and not yet admitted: the only work P may take."""
    completed: dict[str, float] = field(default_factory=dict)
    """Sessions whose call completed in this slot, and when: their returns are SP candidates."""
    hold_since: float | None = None
    """Set while the slot idles, holding the model for an expected return."""

    def elapsed(self, now: float) -> float:
        return now - self.opened_at

    def remaining(self, now: float) -> float:
        return self.plan.budget_s - (now - self.opened_at)  # budget - elapsed, inlined: per step

    def protected_s(self, step_s: float) -> float:
        """What is left of the Eq. (4) reservation at the current step: d_m decode iterations per
        slot, of which the steps already run in this slot count (§3.4: Dfin "spends the remaining
        protected budget"), so P and SP may use whatever the clock leaves beyond that."""
        left = max(0, self.plan.decode_iters - self.decode_steps)
        return min(self.plan.budget_s, left * step_s)

    def prefill_left_s(self, now: float, step_s: float) -> float:
        """What P/SP may still use: the prefill share, and what the clock leaves before Dfin."""
        by_share = self.plan.prefill_budget_s - self.prefill_spent_s
        by_clock = self.remaining(now) - self.protected_s(step_s)
        return max(0.0, min(by_share, by_clock))

    def can_decode(self, now: float, step_s: float) -> bool:
        """A decode step that would cross the slot end is not started (the round must not grow),
        except that the Eq. (4) reservation of d_m steps is always honoured: a forced prefill that
        overran the slot must not starve decode, or a call whose KV is lost at every switch would
        gain one token per round. The overrun shows up as round-bound risk, not hidden."""
        return self.remaining(now) >= step_s - 1e-9 or self.decode_steps < self.plan.decode_iters

    def end_p(self) -> None:
        """P has nothing left to admit: the slot moves on to its first decode phase."""
        if self.phase is SlotPhase.P:
            self.phase = SlotPhase.D1

    def charge_prefill(self, predicted_s: float, tag: str) -> None:
        """A P or SP batch was issued: charge its predicted time; an SP batch opens an SP phase."""
        self.prefill_spent_s += predicted_s
        if tag == "SP":
            self.phase = SlotPhase.SP

    def begin_decode(self, now: float, step_s: float) -> SlotPhase:
        """Label the next decode step: D1 after P, D after an SP batch, Dfin once the clock leaves
        no more than the rest of the protected reservation (from then on no SP in this slot)."""
        # less than two steps of slack leaves no room for an SP batch and a decode after it: the
        # tail of the slot is the drain
        drain = self.remaining(now) < self.protected_s(step_s) + 2 * step_s - 1e-9
        if self.phase is SlotPhase.DFIN or drain:
            self.phase = SlotPhase.DFIN
        elif self.phase is SlotPhase.P:
            self.phase = SlotPhase.D1
        elif self.phase is SlotPhase.SP:
            self.phase = SlotPhase.D
        return self.phase

    def after_decode(self) -> None:
        self.decode_steps += 1
