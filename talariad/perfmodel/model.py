"""The one cost and memory model of a `sim` instance, shared by the simulator (virtual time) and the
real-time `sim` executor (which sleeps what it charges). Sans-IO: every call takes `now`.

`begin(plan, now)` prices an action: a switch's path from `SimMemory.plan_switch`, a first open in
full, a prewarmed instance's first activation free (§5.1). `end(plan, now)` says what the memory
did, as a `StepResult`: KV a switch or an over-budget prefill moves off the device (to the host
arena, or dropped). Design: docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Mapping

from talariad.cold_sched import Decode, Switch
from talariad.cold_sched.rounds import staging_target
from talariad.instance.calls import InstanceCall
from talariad.instance.contract import KVLocation, MemoryStats, StepPlan, StepResult
from talariad.perfmodel.costs import action_seconds, decode_seconds
from talariad.perfmodel.memory import SimMemory, SwitchPlan
from talariad.types import KVState, LatencyProfile, SwitchPath

Key = tuple[str, str]
_DECODED = StepResult(calls=None, kv_updates=[])
"""A decode step's result: one token per call, no KV moved (shared: never modified)."""


class SimModel:
    def __init__(
        self,
        profiles: dict[str, LatencyProfile],
        memory: SimMemory,
        models: list[str],
        pinned: bool = False,
        prewarm: bool = False,
    ) -> None:
        self.profiles, self.mem, self.prewarm = profiles, memory, prewarm
        self.loaded: set[str] = set()
        """Models whose weights a switch reaches without a full open (the resident set)."""
        for model in models if prewarm or pinned else ():
            self._open(model)
        self.active: str | None = models[0] if pinned else None
        self.models = list(models)
        """The rotation its staging rule follows (the admin API may unload some)."""
        self.configured = list(models)
        self.hbm_by_round: dict[int, int] = {}
        self.hbm_peak = 0
        self._ledger = None
        self._live: Mapping[str, InstanceCall] | None = None  # the calls as of the last step
        self._switch: tuple[SwitchPath, float, dict | None] | None = None

    @property
    def staging(self) -> str | None:
        """The model whose weights are being staged: the scheduler's rotation rule."""
        return self.mem.stage_target

    @staging.setter
    def staging(self, model: str | None) -> None:
        self.mem.stage_target = model

    @property
    def kv_capacity_tokens(self) -> int | None:
        """Device KV tokens the tightest model's budget holds (None: profiles carry no KV size)."""
        s = self.mem.spec
        caps = [
            (s.hbm_bytes - s.weight_bytes.get(m, 0)) // s.kv_bytes_per_token[m]
            for m in self.profiles
            if s.kv_bytes_per_token.get(m)
        ]
        return max(int(min(caps)), 1) if caps else None

    # ---- one action -----------------------------------------------------------------------

    def begin(self, plan: StepPlan, now: float) -> float:
        """Seconds the action takes, started at `now`."""
        self._ledger = plan.ledger
        self._live = plan.live
        action = plan.action
        if isinstance(action, Decode):  # the common step first
            return decode_seconds(action, self.profiles[action.model])
        if isinstance(action, Switch):
            return self._begin_switch(plan, action, now)
        restore = 0
        for item in action.calls:
            if item.restore_tokens:
                restore += item.restore_tokens
                call = plan.calls[item.call_id]
                self.mem.touch((call.session_id, call.model))
        if restore:  # HKVR restores share the H2D link with staging
            self.mem.note_restore(self.profiles[action.model].restore_s(restore))
        return action_seconds(action, self.profiles)

    def end(self, plan: StepPlan, now: float) -> StepResult:
        """What the action did, at its end `now` (before the scheduler hears of it)."""
        action = plan.action
        kind = action.__class__
        if kind is Decode:
            return _DECODED
        if kind is Switch:
            return self._end_switch(plan, action, now)
        updates = self._relieve(plan, now)
        self.mem.note_kv(self.device_kv_bytes())  # KV growth dirties staged chunks for good
        return StepResult(calls=None, kv_updates=updates)

    # ---- switches -------------------------------------------------------------------------

    def _begin_switch(self, plan: StepPlan, action: Switch, now: float) -> float:
        first = action.to_model not in self.loaded
        free = action.from_model is None and self.prewarm
        kv = self.device_kv_bytes()
        self._note_hbm(
            plan.round_index, self.mem.footprint(action.from_model, action.to_model, kv, now)
        )
        fallback = False
        if free:
            sw = SwitchPlan(SwitchPath.D2D, 0.0, 0)
        elif first:
            sw = SwitchPlan(SwitchPath.H2D, 1.0, 0)
        elif self.staging not in (None, action.to_model):  # another model was staged
            sw, fallback = SwitchPlan(SwitchPath.H2D, 1.0, 0), self.mem.d2d
        else:
            sw = self.mem.plan_switch(action.from_model, action.to_model, kv, now)
            fallback = self.mem.d2d and sw.path is SwitchPath.H2D
        phases = None if free else self.mem.switch_phases(action.to_model, sw)
        if free:
            seconds = 0.0
        elif phases is not None:
            seconds = sum(phases)
        else:
            seconds = action_seconds(
                action,
                self.profiles,
                sw.path,
                sw.uncovered if sw.path is SwitchPath.PARTIAL else None,
                first_open=first,
                fallback=fallback,
            )
        report = (
            None
            if phases is None
            else {
                "path": sw.path.value,
                "phase_s": list(phases),
                "staged_bytes": sw.staged_bytes if sw.path is not SwitchPath.H2D else 0,
                "dirty_bytes": sw.dirty_bytes,
            }
        )
        self._switch = (sw.path, seconds, report)
        return seconds

    def _end_switch(self, plan: StepPlan, action: Switch, now: float) -> StepResult:
        path, seconds, report = self._switch
        old = action.from_model
        # calls parked mid-decode keep their rows on device (ColdScheduler._parked_sessions)
        parked = {c.session_id for c in plan.live.values() if c.model == old and c.generated > 0}
        demoted = (
            [
                (k, e.kv_len)
                for k, e in plan.ledger.entries.items()
                if k[1] == old and e.state is KVState.DEVICE and k[0] not in parked
            ]
            if old
            else []
        )
        evicted = self._open(action.to_model)
        self.active = action.to_model
        waiting = {c.model for c in plan.live.values()}
        keeps = self.mem.keeps_weights  # every resident model's weights stay: nothing to stage
        target = (
            None if keeps else staging_target(self.models, action.to_model, waiting.__contains__)
        )
        kv_bytes = self.mem.kv_bytes
        left = self.device_kv_bytes() - sum(kv_bytes(k[1], n) for k, n in demoted)
        self.mem.switched(now, target, left)
        lost = KVState.HOST if self.mem.host_kv else KVState.MISSING
        after = {k: lost for k, _ in demoted}  # the scheduler demotes them at the switch
        updates = self._forget(self.mem.save(demoted), plan, after)
        return StepResult(
            kv_updates=updates,
            switch_path=path,
            seconds=seconds,
            staging=self.staging if self.mem.d2d and not keeps else None,
            evicted=evicted,
            switch_report=report,
        )

    def _open(self, model: str) -> tuple[str, ...]:
        """`model` joins the resident set; the models its weights pushed out (resident weights
        only: otherwise every model once opened stays reachable by a switch)."""
        self.loaded.add(model)
        if not self.mem.keeps_weights:
            return ()
        evicted = self.mem.make_resident(model)
        self.loaded.difference_update(evicted)
        return tuple(evicted)

    # ---- device KV pressure and host KV -----------------------------------------------------

    def _relieve(self, plan: StepPlan, now: float) -> list[KVLocation]:
        """Device KV over the active model's budget once this prefill's tokens land: idle
        prefixes of the active model leave the device first, then rows of calls parked in other
        models' slots, least recently used first (to host with HKVR, else dropped)."""
        model, ledger = self.active, plan.ledger
        grown: dict[Key, int] = {}  # this batch, as the scheduler records it after the step
        ending = set()
        for cid in plan.action.call_ids:
            c = plan.calls[cid]
            grown[(c.session_id, c.model)] = c.prompt_tokens + c.generated + 1
            if c.abandoned or c.generated + 1 >= c.max_tokens:
                ending.add(cid)
        kv_bytes, entries = self.mem.kv_bytes, ledger.entries
        used = self.device_kv_bytes()  # the ledger's running totals: O(models), not O(sessions)
        for key, n in grown.items():
            entry = entries.get(key)
            held = entry.kv_len if entry is not None and entry.state is KVState.DEVICE else 0
            used += kv_bytes(key[1], n) - kv_bytes(key[1], held)
        over = used - self.mem.kv_budget_bytes(model)
        if over <= 0:
            return []
        device = [
            (k[1] != model, e.updated_at, k, e.kv_len)
            for k, e in entries.items()
            if e.state is KVState.DEVICE and k not in grown
        ]
        device += [(False, now, k, n) for k, n in grown.items()]
        busy = {
            c.session_id for cid, c in plan.live.items() if cid not in ending and c.model == model
        }
        state = KVState.HOST if self.mem.host_kv else KVState.MISSING
        updates, moved = [], []
        for _, _, key, kv_len in sorted(
            x for x in device if not (x[2][1] == model and x[2][0] in busy)
        ):
            if over <= 0:
                break
            over -= self.mem.kv_bytes(key[1], kv_len)
            updates.append(KVLocation(key[0], key[1], state, kv_len))
            moved.append((key, kv_len))
        after = {k: state for k, _ in moved} | {
            k: KVState.DEVICE for k in grown if k not in dict(moved)
        }
        return updates + self._forget(self.mem.save(moved), plan, after)

    def _forget(
        self, evicted: list[Key], plan: StepPlan, after: dict[Key, KVState]
    ) -> list[KVLocation]:
        """Host copies the arena evicted: a prefix that lived only there is gone."""
        out = []
        for key in evicted:
            state = after.get(key) or plan.ledger.get(*key).state
            if state is KVState.HOST:
                out.append(KVLocation(key[0], key[1], KVState.MISSING, 0))
        return out

    def device_kv_bytes(self) -> int:
        """Device KV of every model: the active model's and the rows of calls parked in other
        models' slots, which the layout keeps across switches."""
        if self._ledger is None:
            return 0
        kv_bytes = self.mem.kv_bytes  # linear in tokens: a model's total prices its entries
        return sum(kv_bytes(m, n) for m, n in self._ledger.device_tokens.items())

    def _note_hbm(self, rnd: int, nbytes: int) -> None:
        self.hbm_by_round[rnd] = max(self.hbm_by_round.get(rnd, 0), nbytes)
        self.hbm_peak = max(self.hbm_peak, nbytes)

    def memory(self) -> MemoryStats:
        kv = self.device_kv_bytes()
        budget = self.mem.kv_budget_bytes(self.active) if self.active else self.mem.spec.hbm_bytes
        live = self._live.values() if self._live else ()
        in_use = {c.model for c in live}
        # idle sessions' device KV is cache the substrate moves to host under pressure
        # (`_relieve`): only the rows of calls on the instance hold HBM against a new call
        entries = self._ledger.entries if self._ledger is not None else {}
        kv_held = 0
        for key in {(c.session_id, c.model) for c in live}:  # the calls', not the whole ledger
            e = entries.get(key)
            if e is not None and e.state is KVState.DEVICE:
                kv_held += self.mem.kv_bytes(key[1], e.kv_len)
        free = self.mem.reclaimable_bytes(self.active, in_use, kv_held)
        slack = max(budget - kv, 0)  # HBM that new weights take without displacing anything
        return MemoryStats(free, slack, min(kv / budget, 1.0) if budget else 0.0)

    def remember(self, call) -> None:
        """The model keeps no token context: the KV ledger is the whole story."""

    def release(self, call) -> None:
        """Nothing to free: a dropped call never reached the device model."""

    def forget(self, session: str) -> None:
        """Nothing kept per session beyond the KV ledger, which the core clears."""
        return None

    def load(self, model: str) -> None:
        """Stage `model` again when the rotation comes to it."""
        keep = set(self.models) | {model}
        self.models = [m for m in self.configured if m in keep]

    def unload(self, model: str) -> None:
        """Stage `model` no more; bytes staged for it now are replaced at the next switch."""
        self.models = [m for m in self.models if m != model]

    def check_integrity(self) -> None:
        self.mem.check_integrity()
