"""One simulated instance: the real `ColdScheduler` (time-shared cold or pinned hot), the action
in flight and when it ends, the memory bookkeeping (`SimMemory`) and the telemetry snapshot the
router reads. The virtual-time twin of `talariad.engine.worker.Worker` with a `sim` executor: it
decides nothing itself; it only times the scheduler's actions (`costs.action_seconds`) and
tells the scheduler what the substrate did (switch path, prefixes saved or evicted).

Rotation bookkeeping: a model the instance has opened before is RESIDENT (a switch away), one it
never opened is ABSENT (a full open, `open_s`, over H2D); a hot instance's model is always
ACTIVE. `prewarm` counts every model as opened at t=0 and makes the very first activation free:
the paper's runs exclude warm-up (§5.1).
"""

from __future__ import annotations

from dataclasses import dataclass

from talariad.cold_sched import ColdScheduler, Completion, Decode, Idle, Prefill, SchedKnobs, SubmittedCall, Switch
from talariad.cold_sched.snapshot import (deadline_risk_share, queued_suffix_tokens, round_load_s,
                                          round_remaining_s, switch_path)
from talariad.router import InstanceSnapshot, ModelResidency, ModelState, RoundMeasurement, SessionKV
from talariad.sim.costs import action_seconds, decode_seconds
from talariad.sim.memory import SimMemory
from talariad.types import KVState, LatencyProfile, Pool, SwitchPath



@dataclass(slots=True)
class SwitchDone:
    """A finished logical switch, for the run's switch records (first activations excluded)."""

    at_s: float
    from_model: str | None
    to_model: str
    path: SwitchPath
    latency_s: float


class SimInstance:
    def __init__(self, name: str, pool: Pool, models: list[str], knobs: SchedKnobs,
                 profiles: dict[str, LatencyProfile], memory: SimMemory, prewarm: bool = True) -> None:
        self.name, self.pool, self.models = name, pool, list(models)
        self.profiles, self.mem, self.prewarm = profiles, memory, prewarm
        mode = "pinned" if pool is Pool.HOT else "time_shared"
        self.sched = ColdScheduler(knobs, profiles, self.models, mode=mode)
        self.opened: set[str] = set(self.models) if prewarm or mode == "pinned" else set()
        self.loaded: set[str] = set(self.opened)  # models whose weights this instance has opened
        self.action = None
        self.end_s = 0.0
        self.version = 0  # bumped on every change; snapshots are published when it moved
        self.published = 0  # snapshot version counter
        self.published_at = float("-inf")
        self.published_version = -1
        self.kv_source: dict[str, str] = {}
        self.switches: list[SwitchDone] = []
        self.hbm_by_round: dict[int, int] = {}
        self.hbm_peak = 0
        self._switch: tuple[SwitchPath, float, bool] | None = None
        self._measured = 0.0
        self._meas: dict[str, list[float]] = {}
        self._rounds_sent = 0

    # ---- calls ----------------------------------------------------------------------------

    def submit(self, call_id: str, session: str, model: str, prompt: int, prefix: int,
               max_tokens: int, now: float) -> None:
        """Like Worker._submit: the reusable prefix is what this instance's ledger still holds."""
        entry = self.sched.ledger.get(session, model)
        reuse = max(min(prefix, entry.kv_len, prompt - 1), 0)
        self.sched.submit(SubmittedCall(
            call_id, session, model, prompt, reuse, entry.state if reuse > 0 else KVState.MISSING,
            max_tokens, now, entry.kv_len > 0), now)
        self.opened.add(model)
        self.version += 1

    @property
    def busy(self) -> bool:
        return self.action is not None

    # ---- the action loop ------------------------------------------------------------------

    def start(self, now: float) -> tuple[float | None, float | None]:
        """Ask the scheduler for the next action: (end time, None) if one started, else
        (None, wake-up time or None)."""
        action = self.sched.next_action(now)
        if action.__class__ is Decode:  # most actions: the same seconds as action_seconds()
            seconds = decode_seconds(action, self.profiles[action.model])
            self.action, self.end_s, self._measured = action, now + seconds, seconds
            return self.end_s, None
        if isinstance(action, Idle):
            return None, action.until
        if isinstance(action, Switch):
            seconds = self._begin_switch(action, now)
        else:
            seconds = action_seconds(action, self.profiles)
            if isinstance(action, Prefill):
                self._begin_prefill(action)
        self.action, self.end_s, self._measured = action, now + seconds, seconds
        return self.end_s, None

    def finish(self, now: float) -> list[Completion]:
        action, self.action = self.action, None
        measured = self._measured
        self.version += 1
        kind = action.__class__
        if kind is Switch:
            return self._finish_switch(action, now)
        done = self.sched.finish(action, now, measured)
        self._measure(action, measured)
        if kind is Prefill:
            self._relieve_device(now)
        return done

    # ---- switches -------------------------------------------------------------------------

    def _begin_switch(self, action: Switch, now: float) -> float:
        first = action.to_model not in self.loaded
        free = action.from_model is None and self.prewarm
        kv = self.device_kv_bytes(action.from_model)
        self._note_hbm(self.mem.footprint(action.from_model, action.to_model, kv, now))
        if free:
            path, seconds = SwitchPath.D2D, 0.0
        elif first:
            path = SwitchPath.H2D
            seconds = action_seconds(action, self.profiles, path, first_open=True)
        else:
            plan = self.mem.plan_switch(action.from_model, action.to_model, kv, now)
            path = plan.path
            seconds = action_seconds(action, self.profiles, path, plan.uncovered)
        self._switch = (path, seconds, free)
        return seconds

    def _finish_switch(self, action: Switch, now: float) -> list[Completion]:
        path, seconds, free = self._switch
        old = action.from_model
        demoted = [(k, e.kv_len) for k, e in self.sched.ledger.entries.items()
                   if k[1] == old and e.state is KVState.DEVICE] if old else []
        self.sched.finish(action, now, seconds, switch_path=path)
        self.loaded.add(action.to_model)
        self.mem.switched(now)
        self._forget(self.mem.save(demoted), now)
        if not free:
            self.switches.append(SwitchDone(now - seconds, old, action.to_model, path, seconds))
            self._meas.setdefault(action.to_model, [0.0] * 6 + [None, None])[6:8] = [path, seconds]
        return []

    # ---- prefill, KV pressure, host KV ------------------------------------------------------

    def _begin_prefill(self, action: Prefill) -> None:
        recs = self.sched.table.records
        for item in action.calls:
            call = recs[item.call_id].call
            if item.restore_tokens:
                self.mem.touch((call.session_id, call.model))
            self.kv_source.setdefault(item.call_id, _source(item, call))

    def device_kv_bytes(self, model: str | None) -> int:
        if model is None:
            return 0
        tokens = sum(e.kv_len for k, e in self.sched.ledger.entries.items()
                     if k[1] == model and e.state is KVState.DEVICE)
        return self.mem.kv_bytes(model, tokens)

    def _relieve_device(self, now: float) -> None:
        """Device KV over its budget: idle prefixes leave the device, least recently used first."""
        model = self.sched.active
        over = self.device_kv_bytes(model) - self.mem.kv_budget_bytes(model)
        if over <= 0:
            return
        busy = {r.call.session_id for r in self.sched.table.records.values()}
        idle = sorted((e.updated_at, k, e.kv_len) for k, e in self.sched.ledger.entries.items()
                      if k[1] == model and e.state is KVState.DEVICE and k[0] not in busy)
        moved = []
        for _, key, kv_len in idle:
            if over <= 0:
                break
            over -= self.mem.kv_bytes(model, kv_len)
            state = KVState.HOST if self.sched.knobs.host_kv else KVState.MISSING
            self.sched.set_kv_state(key[0], model, state, kv_len, now)
            moved.append((key, kv_len))
        self._forget(self.mem.save(moved), now)

    def _forget(self, evicted: list[tuple[str, str]], now: float) -> None:
        for session, model in evicted:
            if self.sched.ledger.get(session, model).state is KVState.HOST:
                self.sched.set_kv_state(session, model, KVState.MISSING, 0, now)

    def _note_hbm(self, nbytes: int) -> None:
        rnd = self.sched.rounds.next_index()
        self.hbm_by_round[rnd] = max(self.hbm_by_round.get(rnd, 0), nbytes)
        self.hbm_peak = max(self.hbm_peak, nbytes)

    # ---- measurements for the router's profile EWMA ----------------------------------------

    def _measure(self, action: Prefill | Decode, seconds: float) -> None:
        m = self._meas.get(action.model)
        if m is None:
            m = self._meas[action.model] = [0.0] * 6 + [None, None]
        if action.__class__ is Decode:
            m[2] += 1
            m[3] += seconds
            return
        prof = self.profiles[action.model]
        restore_tokens = sum(i.restore_tokens for i in action.calls)
        restore_s = prof.restore_s(restore_tokens)
        m[0] += sum(i.recompute_tokens for i in action.calls)
        m[1] += seconds - restore_s
        m[4] += restore_tokens
        m[5] += restore_s

    def round_measurements(self) -> list[tuple[str, RoundMeasurement]]:
        """Per-model measurements since the last closed round (pinned: since the last call)."""
        closed = len(self.sched.rounds.closed)
        if self.sched.mode == "time_shared" and closed == self._rounds_sent:
            return []
        self._rounds_sent = closed
        out = [(model, RoundMeasurement(int(m[0]), m[1], int(m[2]), m[3], int(m[4]), m[5], m[6], m[7]))
               for model, m in sorted(self._meas.items())]
        self._meas = {}
        return out

    # ---- telemetry ------------------------------------------------------------------------

    def snapshot(self, now: float) -> InstanceSnapshot:
        s = self.sched
        active = s.active
        kv = self.device_kv_bytes(active)
        budget = self.mem.kv_budget_bytes(active) if active else self.mem.spec.hbm_bytes
        self.published += 1
        self.published_at, self.published_version = now, self.version
        return InstanceSnapshot(
            instance=self.name, version=self.published, taken_at=now, pool=self.pool, healthy=True,
            allowed_models=frozenset(self.models), models={m: self._residency(m) for m in self.models},
            sessions={k: SessionKV(e.state, e.kv_len) for k, e in s.ledger.entries.items()
                      if e.state is not KVState.MISSING},
            round_remaining_s=round_remaining_s(s, now) if s.mode == "time_shared" else 0.0,
            round_load_s=self.round_load_s(), deadline_risk=self.deadline_risk(),
            kv_occupancy=min(kv / budget, 1.0) if budget else 0.0,
            hbm_free_bytes=max(budget - kv, 0), staging_slack_bytes=max(budget - kv, 0))

    def _residency(self, model: str) -> ModelResidency:
        s = self.sched
        if model == s.active:
            state = ModelState.ACTIVE
        else:
            state = ModelState.RESIDENT if model in self.loaded else ModelState.ABSENT
        waiting = len(s.table.waiting[model])
        running = len(s.table.running) if model == s.active else 0
        # the scheduler's own prediction (measured EWMA, else the profile): the path it will take
        return ModelResidency(state, 0.0, queued_suffix_tokens(s, model), waiting, running,
                              s.switch_costs.predict(model, switch_path(s)))

    def round_load_s(self) -> float:
        return round_load_s(self.sched)

    def deadline_risk(self) -> float:
        return deadline_risk_share(self.sched)

    def check_integrity(self) -> None:
        self.sched.check_integrity()
        self.mem.check_integrity()


def _source(item, call: SubmittedCall) -> str:
    if item.restore_tokens:
        return "host"
    if item.cached_device_tokens:
        return "device"
    return "none"  # the simulator tells "recompute" (a continuation that reused nothing) apart
