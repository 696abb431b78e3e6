"""ColdScheduler: the sans-IO instance scheduler (paper §3.4). It decides what the instance does
next (prefill P/SP, decode, switch, idle) and is told what that action did; it never reads a clock.

Time-shared mode runs rounds of slots, P -> D1 -> (SP -> D)* -> Dfin, one slot per active model
per round, switching only at slot boundaries. Pinned mode is plain continuous batching."""

from __future__ import annotations

import math
from typing import Literal

from talariad.types import KVState, LatencyProfile, SwitchPath

from . import snapshot
from .admission import BatchBuilder
from .budget import prefill_batch_s, restore_batch_s
from .calls import CallProgress, CallStatus, CallTable, SessionLedger
from .knobs import SchedKnobs
from .messages import Action, Completion, Decode, Idle, Prefill, PrefillItem, SchedCall, Switch
from .policy import SlotPolicy
from .rounds import RoundLog, SwitchCosts
from .slot import Slot, SlotPhase
from .telemetry import PHASES, RiskCounters, RoundSummary, SchedTelemetry
from .validate import validate_call, validate_setup

Mode = Literal["pinned", "time_shared"]
_NO_CALLS: frozenset[str] = frozenset()  # `finished` when none is given (no set per step)
_LABEL = {phase: phase.value for phase in SlotPhase}  # enum .value is slow on the per-step path


class ColdScheduler(SlotPolicy):
    """See the module docstring; the time-shared decision list lives in policy.SlotPolicy."""

    def __init__(
        self,
        knobs: SchedKnobs,
        profiles: dict[str, LatencyProfile],
        models: list[str],
        mode: Mode = "time_shared",
    ) -> None:
        validate_setup(profiles, models, mode)
        self.knobs, self.profiles, self.models, self.mode = knobs, profiles, list(models), mode
        self.table = CallTable(self.models)
        self.ledger = SessionLedger()
        self.risk = RiskCounters()
        self.rounds = RoundLog(knobs.round_bound_s, self.risk)
        self.switch_costs = SwitchCosts(profiles)
        self.active: str | None = self.models[0] if mode == "pinned" else None
        self.slot: Slot | None = None
        self.phase_totals = dict.fromkeys(PHASES, 0.0)
        self.sp_admitted = self.sp_parked = self.decode_parked = 0
        self.staged: str | None = None
        """The model the substrate stages for the next switch (None: it does not say)."""
        self.failed_switches = 0
        self.skipped: str | None = None
        """The target of the last failed switch: the rotation resumes after it."""
        self._inflight: Action | None = None
        self._retire: tuple[str, str] | None = None
        self._label = ""
        self._now = -math.inf

    # ---- events from the driver -------------------------------------------------------------

    def submit(self, call: SchedCall, now: float) -> None:
        self._tick(now)
        validate_call(call, self.models, self.knobs, self.table.records)
        rec = self.table.add(call)
        if call.prefix_tokens > 0:  # the substrate's word on this prefix at submission
            self.ledger.set(call.session_id, call.model, call.prefix_state, call.prefix_tokens, now)
        rec.sp_return = self._arrives_mid_slot(rec)

    def set_kv_state(
        self, session: str, model: str, state: KVState, kv_len: int, now: float | None = None
    ) -> None:
        """The substrate moved or evicted a prefix (device -> host, host -> missing, ...)."""
        self.ledger.set(session, model, state, kv_len, max(self._now, 0.0) if now is None else now)

    def set_staging(self, model: str | None) -> None:
        """The substrate's staging telemetry: which model's weights it stages for the next switch
        (§3.4: the switch estimate follows staging, not a static model constant)."""
        self.staged = model

    def predicted_path(self, model: str, now_: bool = False) -> SwitchPath:
        """The path a switch to `model` will take: H2D without staging. A switch issued now
        (`now_`) to a model other than the one being staged can only open over H2D (a fallback).
        Otherwise the path last measured for `model` (by a later switch's turn staging will have
        targeted it), D2D before any measurement. Costs are kept per path (SwitchCosts)."""
        if not self.knobs.d2d:
            return SwitchPath.H2D
        if now_ and self.staged is not None and self.staged != model:
            return SwitchPath.H2D
        return self.switch_costs.last_path.get(model, SwitchPath.D2D)

    def predicted_switch_s(self, model: str) -> float:
        return self.switch_costs.predict(model, self.predicted_path(model))

    def cancel(self, call_id: str, now: float) -> bool:
        """Drop a call that is not in the action in flight; False if it is (retry after finish)."""
        self._tick(now)
        if call_id not in self.table.records or call_id in self._inflight_ids():
            return False
        rec = self.table.records.pop(call_id)
        if rec.status is CallStatus.RUNNING:
            self.table.running.remove(call_id)
        else:
            self.table.waiting[rec.call.model].remove(call_id)
        if self.slot and call_id in self.slot.p_pending:
            self.slot.p_pending.remove(call_id)
        return True

    def retire(self, model: str, to: str) -> None:
        """The operator unloaded the active `model`: once its calls are done, switch to `to` even
        with no work, so its weights leave the device."""
        self._retire = (model, to)

    def _retire_switch(self, now: float) -> Switch | None:
        model, to = self._retire
        if self.active != model:
            self._retire = None
            return None
        if self.table.running or self.table.waiting[model]:
            return None
        if self.slot is not None:
            self._close_slot(now)
        self._retire = None
        path = self.predicted_path(to)
        predicted = self.switch_costs.predict(to, path)
        self.rounds.round_for(to, now).predicted_s += predicted
        return Switch(model, to, path, predicted)

    def next_action(self, now: float) -> Action:
        self._tick(now)
        if self._inflight is not None:
            raise RuntimeError(f"next_action() while {type(self._inflight).__name__} is in flight")
        retiring = self._retire_switch(now) if self._retire is not None else None
        action = retiring or (
            self._next_pinned() if self.mode == "pinned" else self._next_time_shared(now)
        )
        if action.__class__ is not Idle:
            self._inflight = action
        return action

    def finish(
        self,
        action: Action,
        now: float,
        measured_s: float,
        tokens: dict[str, int] | None = None,
        finished: set[str] | None = None,
        switch_path: SwitchPath | None = None,
        switch_failed: bool = False,
    ) -> list[Completion]:
        """The driver ran `action`. tokens: emitted per call (default 1 each); finished: calls
        that hit a stop condition (default: generated >= max_tokens); switch_failed: the switch
        released the outgoing model but could not open the target (its slot is skipped)."""
        self._tick(now)
        kind = action.__class__  # the action classes are final: a class test is an isinstance
        if kind is Idle:
            return []
        if action is not self._inflight:
            raise ValueError(
                f"finish() got {type(action).__name__} that is not the action in flight"
            )
        self._inflight = None
        if kind is Switch:
            if switch_failed:
                self._fail_switch(action, now, measured_s)
            else:
                self._finish_switch(action, now, measured_s, switch_path)
            return []
        self._record_phase(action, measured_s)
        return self._finish_tokens(action, now, tokens, finished or _NO_CALLS)

    # ---- pinned mode: continuous batching, prefill first ------------------------------------

    def _next_pinned(self) -> Action:
        recs = self.table.waiting_records(self.active)
        if items := self._builder(self.knobs.max_batch).fill(recs, self.ledger, lambda n: math.inf):
            return self._prefill(items, "P")
        if self.table.running:
            return self._decode()
        return Idle(None)

    # ---- issuing and finishing actions -------------------------------------------------------

    def _builder(self, max_items: int) -> BatchBuilder:
        running = len(self.table.running)
        return BatchBuilder(
            self.knobs, self.profiles[self.active], running, self.table.kv_used(), max_items
        )

    def _prefill(self, items: list[PrefillItem], tag: Literal["P", "SP"]) -> Prefill:
        predicted = prefill_batch_s(items, self.profiles[self.active])
        for item in items:
            self._admit(self.table.records[item.call_id], item, tag)
        if self.slot is not None:
            self.slot.charge_prefill(predicted, tag)
        self._label = tag
        return Prefill(items, tag, self.active, predicted)

    def _admit(self, rec: CallProgress, item: PrefillItem, tag: str) -> None:
        self.table.start(rec.call.call_id)
        if self.slot is not None and rec.call.call_id in self.slot.p_pending:
            self.slot.p_pending.remove(rec.call.call_id)
        if rec.resumed:  # back from a park: what recovering its context costs
            rec.park_cost_s += prefill_batch_s([item], self.profiles[rec.call.model])
        if rec.admitted_by is None:  # a resumed call keeps how it was first admitted
            rec.admitted_by = tag
            rec.cached_tokens = item.cached_device_tokens + item.restore_tokens
        if self.rounds.current is not None:
            self.rounds.current.sp_admitted += tag == "SP"
            self.rounds.current.p_admitted += tag == "P"
        self.sp_admitted += tag == "SP"

    def _decode(self, step: float | None = None) -> Decode:
        step = self._step() if step is None else step
        self._label = (
            _LABEL[self.slot.begin_decode(self._now, step)] if self.slot is not None else "D"
        )
        return Decode(self.active, list(self.table.running), step)

    def _step(self, batch: int | None = None) -> float:
        n = len(self.table.running) if batch is None else batch
        return self.profiles[self.active].decode_s(n if n > 1 else 1)

    def _finish_tokens(
        self,
        action: Prefill | Decode,
        now: float,
        tokens: dict[str, int] | None,
        finished: set[str] | frozenset[str],
    ) -> list[Completion]:
        done = []
        records, ledger_set, device = self.table.records, self.ledger.set, KVState.DEVICE
        if tokens is None and not finished:  # the per-step case: one token each, no stop hit
            entries, totals = self.ledger.entries, self.ledger.device_tokens
            for cid in action.call_ids:
                rec = records[cid]
                rec.generated = generated = rec.generated + 1
                if rec.first_token_at is None:
                    rec.first_token_at = now
                call = rec.call
                if generated >= call.max_tokens:
                    done.append(self._complete(rec, now))
                    continue
                # `ledger.set(..., DEVICE, prompt + generated, now)` inlined (the length is > 0):
                # every running call's entry moves on every decode step
                kv_len = call.prompt_tokens + generated
                entry = entries.get((call.session_id, call.model))
                if entry is None:
                    ledger_set(call.session_id, call.model, device, kv_len, now)
                else:
                    held = entry.kv_len if entry.state is device else 0
                    entry.state, entry.kv_len, entry.updated_at = device, kv_len, now
                    totals[call.model] = totals.get(call.model, 0) + kv_len - held
            return self._after_tokens(action, done)
        for cid in action.call_ids:
            rec = records[cid]
            rec.generated += 1 if tokens is None else max(0, tokens.get(cid, 0))
            if rec.first_token_at is None and (rec.generated > 0 or cid in finished):
                rec.first_token_at = now
            if cid in finished or rec.generated >= rec.call.max_tokens:
                done.append(self._complete(rec, now))
            else:
                ledger_set(rec.call.session_id, rec.call.model, device, rec.kv_len, now)
        return self._after_tokens(action, done)

    def _after_tokens(self, action: Prefill | Decode, done: list[Completion]) -> list[Completion]:
        if action.__class__ is Decode and self.slot is not None:
            self.slot.after_decode()
            if self.rounds.current is not None:
                self.rounds.current.decode_steps += 1
        return done

    def _complete(self, rec: CallProgress, now: float) -> Completion:
        call = self.table.finish(rec.call.call_id).call
        if self.slot is not None:
            self.slot.completed[call.session_id] = now
        self.ledger.set(call.session_id, call.model, KVState.DEVICE, rec.kv_len, now)
        first = rec.first_token_at
        return Completion(
            call.call_id, call.session_id, call.model, KVState.DEVICE, rec.kv_len,
            ttft_s=first - call.arrived_at, finished_at=now, first_token_at=first,
            prompt_tokens=call.prompt_tokens, cached_tokens=rec.cached_tokens,
            completion_tokens=rec.generated, admitted_by=rec.admitted_by,
            parked_times=rec.parked_times, park_cost_s=rec.park_cost_s,
        )  # fmt: skip

    def _finish_switch(
        self, action: Switch, now: float, measured_s: float, path: SwitchPath | None
    ) -> None:
        if action.from_model is not None:
            self.switch_costs.record(action.to_model, path or action.path, measured_s)
            lost = KVState.HOST if self.knobs.host_kv else KVState.MISSING
            self.ledger.demote(
                action.from_model, lost, now, self._parked_sessions(action.from_model)
            )
        rnd = self.rounds.current
        rnd.switch_s += measured_s
        rnd.switches += 1
        self.active, self.skipped = action.to_model, None
        self._open_slot(action.to_model, now)

    def _fail_switch(self, action: Switch, now: float, measured_s: float) -> None:
        """Nothing is resident now; the target's calls stay queued and rotation moves past it."""
        if action.from_model is not None:
            lost = KVState.HOST if self.knobs.host_kv else KVState.MISSING
            self.ledger.demote(
                action.from_model, lost, now, self._parked_sessions(action.from_model)
            )
        self.rounds.current.switch_s += measured_s
        self.failed_switches += 1
        self.active, self.skipped = None, action.to_model

    def _record_phase(self, action: Prefill | Decode, measured_s: float) -> None:
        if action.__class__ is Decode:  # the per-step case: one phase, no split
            self._record_seconds(self._label, measured_s)
            return
        split = {self._label: measured_s}
        if isinstance(action, Prefill) and action.predicted_s > 0:
            restore = restore_batch_s(action.calls, self.profiles[action.model])
            split["restore"] = measured_s * restore / action.predicted_s
        for phase, seconds in split.items():
            self._record_seconds(phase, seconds)

    def _record_seconds(self, phase: str, seconds: float) -> None:
        self.phase_totals[phase] += seconds
        if self.rounds.current is not None:
            self.rounds.current.phase_s[phase] += seconds

    def _parked_sessions(self, model: str) -> frozenset[str]:
        """Sessions whose call `model`'s slot parked mid-decode. Their KV stays on device across
        the other models' slots: Eq. (4) prices "a sequence that remains active throughout the
        round" at R_i / d_m per token, which holds only if the round does not also recompute or
        restore it, and the bump layout keeps those rows while releasing the rest of the outgoing
        kv_cache region (§4.2). The substrate may still move them under HBM pressure and says so
        through set_kv_state; the rule is the same in every configuration."""
        return frozenset(r.call.session_id for r in self.table.waiting_records(model) if r.resumed)

    # ---- the simulator's shortcut over a run of decode steps ---------------------------------

    def finish_decodes(
        self, action: Decode, end: float, seconds: float, until: float
    ) -> tuple[int, float, float | None]:
        """What finish(action, end, seconds) then next_action(end) do, step after step, for as
        long as each decision is the same decode over the same batch, no call completes and each
        step takes `seconds` and ends before `until` (the simulator's next event). Only the
        simulator calls it: a decode step costs it ~30 calls, this loop ~5.
        Returns (steps finished, the time reached, the end of the decode now in flight or None
        when the last step finished leaves the next decision to next_action)."""
        limit = self._decode_run_limit(action)
        if not limit:
            return 0, end, end
        slot, label, step = self.slot, self._label, self._step()
        totals, split = self.phase_totals, self.rounds.current.phase_s
        steps, now, nxt = 0, end, end
        while steps < limit and nxt < until:
            now = nxt
            totals[label] += seconds  # the same float sums, in the same order, as per step
            split[label] += seconds
            slot.decode_steps += 1
            steps += 1
            if not (slot.can_decode(now, step) or self._drain_fits(now, step)):
                nxt = None  # the slot closes or drains: next_action decides
                break
            label = _LABEL[slot.begin_decode(now, step)]
            nxt = now + seconds
        if steps:
            self._ran_decodes(action, steps, end, now, label, nxt is not None)
        return steps, now, nxt

    def _decode_run_limit(self, action: Action) -> int:
        """Steps of the decode in flight finish_decodes may take: each finished step leaves the
        same decode as the only decision (no P or SP work, no hold, no retirement) and completes
        no call; 0 when it may not take any."""
        slot, table = self.slot, self.table
        if (
            action is not self._inflight
            or action.__class__ is not Decode
            or self.mode != "time_shared"
            or self._retire is not None
            or slot is None
            or slot.hold_since is not None
            or slot.p_pending
            or self.rounds.current is None
            or not table.running
            or table.running != action.call_ids
        ):
            return 0
        # returns waiting at a D1/D boundary are an SP opportunity; Dfin admits none
        if self.knobs.sp and table.waiting[slot.model] and slot.phase is not SlotPhase.DFIN:
            return 0
        records = table.records
        # a step completes a call once it has generated max_tokens
        return min(records[c].call.max_tokens - records[c].generated for c in table.running) - 1

    def _ran_decodes(
        self, action: Decode, steps: int, first: float, last: float, label: str, issued: bool
    ) -> None:
        """What `steps` finished decode steps, from `first` to `last`, left behind that no
        decision between them read: the tokens, the ledger and the round's step count."""
        self._now, self._label = last, label
        self._inflight = action if issued else None
        self.rounds.current.decode_steps += steps
        for cid in action.call_ids:
            rec = self.table.records[cid]
            rec.generated += steps
            if rec.first_token_at is None:
                rec.first_token_at = first
            self.ledger.set(rec.call.session_id, rec.call.model, KVState.DEVICE, rec.kv_len, last)

    # ---- helpers, telemetry, integrity -------------------------------------------------------

    def _inflight_ids(self) -> set[str]:
        return set(getattr(self._inflight, "call_ids", ()))

    def _tick(self, now: float) -> None:
        if now > self._now:
            self._now = now
        elif now < self._now - 1e-9:
            raise ValueError(f"now={now} is earlier than the previous event at {self._now}")

    @property
    def round_summaries(self) -> list[RoundSummary]:
        """Closed rounds, oldest first; the open one is in telemetry()."""
        return list(self.rounds.closed)

    @property
    def in_flight(self) -> Action | None:
        return self._inflight

    def telemetry(self, now: float) -> SchedTelemetry:
        return snapshot.build_telemetry(self, now)

    def check_integrity(self) -> None:
        """Raise RuntimeError if the queues, running batch, slot or rounds disagree."""
        snapshot.check_integrity(self)
