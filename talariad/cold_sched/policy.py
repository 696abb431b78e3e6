"""The time-shared decision list of the cold-pool scheduler (§3.4): which slot is open, what P and
SP may admit, when the slot closes and which model is next. Mixed into ColdScheduler, which owns
the state and issues the actions (_prefill, _decode, _step, _builder)."""

from __future__ import annotations

import math

from talariad.types import KVState, LatencyProfile

from .admission import has_reusable_prefix
from .budget import SlotPlan, decode_iterations, plan_slot, prefill_batch_s
from .calls import CallProgress, CallTable, SessionLedger
from .knobs import SchedKnobs
from .messages import Action, Idle, PrefillItem, Switch
from .rounds import RoundLog, SwitchCosts, rotation
from .slot import Slot, SlotPhase
from .telemetry import RiskCounters


class SlotPolicy:
    """Rounds of slots P -> D1 -> (SP -> D)* -> Dfin; switches only between slots."""

    knobs: SchedKnobs
    profiles: dict[str, LatencyProfile]
    models: list[str]
    table: CallTable
    ledger: SessionLedger
    risk: RiskCounters
    rounds: RoundLog
    switch_costs: SwitchCosts
    active: str | None
    skipped: str | None
    slot: Slot | None
    sp_parked: int
    decode_parked: int

    def _next_time_shared(self, now: float) -> Action:
        self._end_hold(now)
        for _ in range(3):
            if self.slot is None and (action := self._open_next(now)) is not None:
                return action
            if (action := self._slot_action(now)) is not None:
                return action
            self._close_slot(now)
        raise RuntimeError("no action after closing the slot")  # pragma: no cover

    def _slot_action(self, now: float) -> Action | None:
        """A slot's decision list: P, then SP at decode boundaries, then decode; None: close it."""
        slot = self.slot
        if slot.phase is SlotPhase.P:
            if items := self._p_batch(now):
                return self._prefill(items, "P")
            slot.end_p()
        if self.can_admit_sp(now) and (items := self._sp_batch(now)):
            return self._prefill(items, "SP")
        if slot.p_pending and (items := self._p_batch(now)):
            return self._prefill(items, "P")  # P work that waited for batch or KV capacity
        step = self._step()
        if self.table.running and (slot.can_decode(now, step) or self._drain_fits(now, step)):
            return self._decode(step)
        if (until := self._hold_until(now)) is not None:
            slot.hold_since = now if slot.hold_since is None else slot.hold_since
            return Idle(until)
        if not self.table.running and not any(self.table.waiting.values()):
            self._close_slot(now)
            self.rounds.close(now)  # no work anywhere: the model stays loaded, no round is open
            return Idle(None)
        return None

    def can_admit_sp(self, now: float) -> bool:
        """An SP opportunity: SP on, a decode boundary after D1 or D, not Dfin, returns waiting."""
        slot = self.slot
        if not self.knobs.sp or slot is None:
            return False
        # an SP batch whose calls all finished at prefill leaves nothing to decode: that is a
        # boundary too, or the next return would wait for the next slot
        drained_sp = slot.phase is SlotPhase.SP and not self.table.running
        if slot.phase not in (SlotPhase.D1, SlotPhase.D) and not drained_sp:
            return False
        at_boundary = slot.decode_steps > 0 or not self.table.running
        if not at_boundary:
            return False
        waiting = self.table.waiting[slot.model]
        if not waiting:  # the usual case at a decode step: no generator to build
            return False
        records = self.table.records
        return any(self.sp_eligible(records[c]) for c in waiting)

    def sp_eligible(self, rec: CallProgress) -> bool:
        """Active model, a continuation arrived after P, prefix on device or host-restorable."""
        return (
            rec.sp_return
            and rec.call.is_continuation
            and rec.call.model == self.active
            and has_reusable_prefix(rec, self.ledger, self.knobs.host_kv)
        )

    def _p_batch(self, now: float) -> list[PrefillItem]:
        """P admits the ordinary work that was waiting when the slot opened (§3.4), capped only by
        the batch size and device KV capacity: prefill is best-effort, and work that runs past the
        round bound is reported as deadline risk, never rolled into a later round. Only SP is
        budget-limited."""
        slot = self.slot
        recs = [self.table.records[c] for c in slot.p_pending]
        items = self._builder(self.knobs.max_batch).fill(recs, self.ledger, lambda n: math.inf)
        if items and prefill_batch_s(items, self.profiles[slot.model]) > slot.prefill_left_s(
            now, self._step(len(self.table.running) + len(items))
        ):
            self.risk.prefill_shortfall += 1
        return items

    def _sp_batch(self, now: float) -> list[PrefillItem]:
        slot = self.slot
        eligible = [r for r in self.table.waiting_records(slot.model) if self.sp_eligible(r)]
        budget = lambda n: slot.prefill_left_s(now, self._step(n))  # noqa: E731
        return self._builder(self.knobs.max_sp_batch).fill(eligible, self.ledger, budget)

    def _open_next(self, now: float) -> Action | None:
        """Next model in rotation: switch to it, or open its slot directly if it is loaded."""
        model = self._next_model()
        if model is None:
            self.rounds.close(now)
            return Idle(None)
        if model == self.active:
            self._open_slot(model, now)
            return None
        path = self.predicted_path(model, now_=True)
        predicted = self.switch_costs.predict(model, path, first_open=self.active is None)
        self.rounds.round_for(model, now).predicted_s += predicted
        return Switch(self.active, model, path, predicted)

    def _next_model(self) -> str | None:
        after = self.active if self.active in self.models else self.skipped
        return next((m for m in rotation(self.models, after) if self.table.has_work(m)), None)

    def _open_slot(self, model: str, now: float) -> None:
        rnd = self.rounds.round_for(model, now)
        plan = self._plan_slot(model)
        self.slot = Slot(model, rnd.index, now, plan, p_pending=list(self.table.waiting[model]))
        rnd.models.append(model)
        rnd.predicted_s += plan.budget_s

    def _plan_slot(self, model: str) -> SlotPlan:
        """Eq. (3)-(5) for the slot about to open: an equal share of gamma*T_TTFT among the models
        with work, after their switches, with d_m protected decode steps (Eq. 4)."""
        busy = [m for m in self.models if self.table.has_work(m)] or [model]
        switches = sum(self.predicted_switch_s(m) for m in busy) if len(busy) > 1 else 0.0
        # a batch that runs on from this model's last slot (_close_slot) is part of this one
        carried = len(self.table.running) if model == self.active else 0
        batch = min(self.knobs.max_batch, max(1, len(self.table.waiting[model]) + carried))
        step = self.profiles[model].decode_s(batch)
        bound, tpot = self.knobs.round_bound_s, self.knobs.tpot_target_s
        plan = plan_slot(bound, len(busy), switches, tpot, step, self.knobs.max_switch_share)
        self.risk.round_bound += not plan.feasible
        if decode_iterations(bound, tpot, step) is None:
            self.risk.tpot_infeasible.add(model)
        return plan

    def _close_slot(self, now: float) -> None:
        """Park the running batch: its KV stays on device, across the switch too (see
        ColdScheduler._parked_sessions), and it resumes first in its model's next slot. Count
        returns that SP could not take, and P work that batch or KV capacity could not fit.
        With no other model's work waiting, the next slot is this model's again, with no switch:
        the batch then runs on into it instead of being parked and prefilled again for nothing."""
        slot, rnd = self.slot, self.rounds.current
        parked = self.table.park_running() if self._others_wait(slot.model) else []
        for rec in parked:
            self.ledger.set(rec.call.session_id, slot.model, KVState.DEVICE, rec.kv_len, now)
        returns = [r for r in self.table.waiting_records(slot.model) if r.sp_return]
        for rec in returns:
            rec.sp_return = False  # next slot it is ordinary P work
        rnd.decode_parked += len(parked)
        rnd.sp_parked += len(returns)
        rnd.deferred += len(slot.p_pending)
        self.decode_parked += len(parked)
        self.sp_parked += len(returns)
        self.risk.deferred += len(slot.p_pending)
        rnd.active_s += now - slot.opened_at
        self.slot = None

    def _others_wait(self, model: str) -> bool:
        """Another model has calls queued here (a slot end then gives it its turn)."""
        return any(self.table.has_work(m) for m in self.models if m != model)

    def _drain_fits(self, now: float, step_s: float) -> bool:
        """Dfin past the slot's share: in-flight decode drains before the switch while the round
        stays within Eq. (5). §3.4: Dfin "spends the remaining protected budget on in-flight
        decode before switching models", and the slot closes "when the round budget is exhausted
        or the scheduler decides to switch". The later slots of this round keep their shares and
        switches; only what the round would leave unused is spent here. A call still decoding
        when the round bound is reached is parked (_close_slot) if another model waits, the same
        rule in every configuration."""
        rnd = self.rounds.current
        if rnd is None or rnd.started_at is None:
            return False
        later = [
            m
            for m in rotation(self.models, self.slot.model)
            if m not in rnd.models and self.table.has_work(m)
        ]
        reserved = sum(self.predicted_switch_s(m) + self.slot.plan.budget_s for m in later)
        return (now - rnd.started_at) + step_s + reserved <= self.knobs.round_bound_s + 1e-9

    def _hold_until(self, now: float) -> float | None:
        """Keep an empty slot open while a session that completed in it may still return (its
        tool gap), as long as an SP could still start; None: nothing worth waiting for."""
        slot, hold = self.slot, self.knobs.sp_hold_s
        if not self.knobs.sp or hold <= 0 or self.table.running:
            return None
        left = slot.prefill_left_s(now, self._step(1))
        busy = {r.call.session_id for r in self.table.waiting_records(slot.model)}
        ends = [t + hold for s, t in slot.completed.items() if s not in busy]
        until = min(max(ends, default=now), now + left)
        return until if until > now + 1e-9 else None

    def _end_hold(self, now: float) -> None:
        slot = self.slot
        if slot is not None and slot.hold_since is not None:
            self._record_seconds("hold", now - slot.hold_since)
            slot.hold_since = None

    def _arrives_mid_slot(self, rec: CallProgress) -> bool:
        slot = self.slot
        return (
            slot is not None
            and slot.model == rec.call.model
            and rec.call.is_continuation
            and has_reusable_prefix(rec, self.ledger, self.knobs.host_kv)
        )
