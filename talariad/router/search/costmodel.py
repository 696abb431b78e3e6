"""The cost model over the router's books: reads snapshots, the in-flight overlay, leases,
sessions and placed work into the reference's named inputs (`cost.Inputs`, `cost.GainFacts`)
and keeps what the search reads fast: each instance's cost rows, keep costs and bound orders.

The arithmetic is the reference's (`talariad.router.cost`); what is here decides what each input
is at placement time (the retirement rule, contention, the gain's windows) and caches it.
"""

from __future__ import annotations

import math

from talariad.router.cost import (
    ACTIVATION,
    EPOCH,
    OTHER_CALLS,
    STATE,
    TAKEN_AT,
    CallPlan,
    GainFacts,
    Inputs,
    added_weights,
    contenders_of,
    cost_row,
    gain_of,
    keep_cost_s,
    replica_facts,
    score,
    spare_of,
)
from talariad.router.cost import (
    passes_eq2 as _passes_eq2,
)
from talariad.router.knobs import RouterKnobs
from talariad.router.messages import CallRequest, CandidateCost, ModelState
from talariad.router.profiles import DemandTracker, ProfileBook
from talariad.router.search.bounds import BoundIndex, BoundOrder
from talariad.router.search.placed import PlacedWork
from talariad.router.sessions import KVRecord, LeaseBook, SessionTable
from talariad.router.telemetry import InFlight, InstanceBook, InstanceState
from talariad.types import KVState, LatencyProfile, Pool

_RESIDENT = ModelState.RESIDENT.value  # as a cost row holds it


class CostModel:
    """Scores one call against one instance from the router's books; shared by Talaria and the
    cost-aware baselines."""

    def __init__(
        self, knobs: RouterKnobs, profiles: ProfileBook, leases: LeaseBook, sessions: SessionTable
    ) -> None:
        self.knobs, self.profiles, self.leases, self.sessions = knobs, profiles, leases, sessions
        # work forwarded per (instance, model) and per model over the retirement window
        self.placed = PlacedWork(knobs.retire_window_s)
        self._keep: dict[tuple[str, str], tuple] = {}  # `keep_cost_on`'s cache
        self._bounds = BoundIndex(leases.charge)
        leases.on_charge = self._recharged

    def plan(self, call: CallRequest, now: float | None = None) -> CallPlan:
        prof, suffix = self.profiles.get(call.model), call.prompt_tokens - call.prefix_tokens
        sid = call.prefix_of or call.session_id  # where the prefix lives
        key = (sid, call.model) if sid is not None else None
        rec = self.sessions.kv_record(sid, call.model) if sid is not None else None
        kv_bytes = prof.kv_bytes_per_token * (call.prompt_tokens + call.max_tokens)
        return CallPlan(
            call,
            prof,
            suffix,
            prof.prefill_s(suffix),
            key,
            rec,
            call.max_tokens * prof.decode_step_s,
            kv_bytes,
            now,
        )

    def record_placed(self, plan: CallPlan, instance: str, now: float) -> None:
        """A forward of `plan` to `instance`: its service work counts as the model's demand
        there until a window after the call would end if it ran at once. Booked at the
        forward, a 30 s decode would leave a 30 s window just as it ends, and its instance
        would read idle while a session on it is still between calls."""
        work = plan.prefill_s + plan.decode_s
        until = now + work
        self.placed.record((instance, plan.call.model), now, work, until)  # type: ignore[arg-type]
        self.placed.record((instance, None), now, work, until)  # type: ignore[arg-type]
        self.placed.record(plan.call.model, now, work, until)

    def spare_s(self, instance: str, now: float | None) -> float:
        """What `instance` can still absorb over the next control window: the window minus the
        work placed on it that ran or runs within the last one (every model; `record_placed`),
        the forecast of its own load."""
        if now is None:
            return math.inf
        busy = self.placed.work_s((instance, None), now)  # type: ignore[arg-type]
        return spare_of(busy, self.knobs.control_window_s)

    def retired(self, plan: CallPlan, inst: InstanceState, row: tuple) -> bool:
        """The retirement rule: a model resident (not active, not being opened) on a cold
        instance is out of that instance's rotation when the work forwarded there for it over
        `retire_window_s` does not cover what keeping it costs: its switch, its weights' HBM and
        ν_m (`keep_cost_s`, the right side of Eq. (2)). While nothing anywhere keeps the model in
        rotation, nothing is retired: a first replica needs no gate (Eq. (2)'s infinite gain)."""
        if plan.now is None:
            return False
        return self._retired_at(plan.call.model, plan.profile, inst, row, plan.now)

    def retired_models(self, inst: InstanceState, now: float) -> tuple[str, ...]:
        """The models the retirement rule takes out of `inst`'s rotation at `now` (admin API)."""
        if inst.snapshot is None:
            return ()
        out = []
        for model in sorted(inst.snapshot.models):
            prof = self.profiles.get(model)
            if self._retired_at(model, prof, inst, self.row(inst, model, prof), now):
                out.append(model)
        return tuple(out)

    def _retired_at(
        self, model: str, prof: LatencyProfile, inst: InstanceState, row: tuple, now: float
    ) -> bool:
        if row[STATE] != _RESIDENT or inst.snapshot.pool is Pool.HOT:
            return False
        if inst.opening(model) > 0 or self.placed.work_s(model, now) <= 0.0:
            return False
        kept = self.placed.work_s((inst.name, model), now)  # type: ignore[arg-type]
        return kept < self.keep_cost_on(inst, model, prof, row)

    def contenders(self, plan: CallPlan, inst: InstanceState, row: tuple) -> float:
        """How many other models' calls a call of the model would delay on a cold instance where
        the model has no work yet (time-sharing adds its slots to every round: ΔR_req's
        "incremental work introduced by r"): those running, queued or leased there now
        (snapshot, forwards since, live leases), or, when more, the share of the last window
        that other models' forwarded work kept the instance busy. Why: docs/internals.md."""
        model, name = plan.call.model, inst.name
        if not self.adds_slot(inst, model, row):
            return 0.0
        calls = row[OTHER_CALLS] + sum(r[1] for m, r in inst.ov_model.items() if m != model)
        calls += self.leases.count(name)  # none of them is the model's (`adds_slot`)
        if plan.now is None:
            return contenders_of(calls, None, self.knobs.retire_window_s)
        work = self.placed.work_s
        busy = work((name, None), plan.now) - work((name, model), plan.now)  # type: ignore[arg-type]
        return contenders_of(calls, busy, self.knobs.retire_window_s)

    def adds_slot(self, inst: InstanceState, model: str, row: tuple) -> bool:
        """A call of `model` would add its slots to `inst`'s rounds: a cold instance where the
        model has no call running, queued, forwarded or leased (`cost.other_calls` is None else)."""
        if row[OTHER_CALLS] is None or self.leases.count(inst.name, model):
            return False
        ov = inst.ov_model.get(model)
        return ov is None or not ov[1]

    def keep_cost_on(
        self, inst: InstanceState, model: str, prof: LatencyProfile, row: tuple
    ) -> float:
        """`keep_cost_s` there, computed once per cost row (a snapshot, a profile) and knobs."""
        key = (inst.name, model)
        kept = self._keep.get(key)
        if kept is None or kept[0] is not row or kept[1] is not prof or kept[2] is not self.knobs:
            facts = replica_facts(inst.snapshot)
            keep = keep_cost_s(self.knobs, model, prof, facts, row[ACTIVATION])
            kept = self._keep[key] = (row, prof, self.knobs, keep)
        return kept[3]

    def kv_on(self, inst: InstanceState, call: CallRequest) -> tuple[KVState, int]:
        """Newest word on the session's prefix there: a later completion beats the snapshot."""
        sid = call.prefix_of or call.session_id
        rec = self.sessions.kv_record(sid, call.model) if sid is not None else None
        return _kv_lookup(inst, (sid, call.model) if sid is not None else None, rec)

    def model_state(self, inst: InstanceState, model: str) -> ModelState:
        if inst.opening(model) > 0:
            return ModelState.ACTIVE  # an in-flight forward is already opening it there
        return inst.snapshot.residency(model).state  # type: ignore[union-attr]

    def evaluate(self, plan: CallPlan, inst: InstanceState) -> CandidateCost:
        """Eq. (1) plus the round-admission and HBM checks for one placeable instance."""
        return score(plan, self.inputs(plan, inst), self.knobs)

    def inputs(self, plan: CallPlan, inst: InstanceState) -> Inputs:
        """What `score` reads about `inst` now, as immutable values: a score rendered from them
        later (a lazy explanation) equals the one `evaluate` gives now."""
        # NOTE: runs for every scored instance: `row`, and the cheap exits of `retired` (not
        # resident) and `contenders` (no slot added), inlined
        model = plan.call.model
        row = inst.rows.get(model)
        if row is None or row[EPOCH] != self.profiles.epoch:
            row = self._row(inst, model, plan.profile)
        ov = inst.ov_model.get(model)
        rec, kv_state, kv_len = plan.kv_record, KVState.MISSING, 0
        if rec is not None and rec.instance == inst.name and rec.at > row[TAKEN_AT]:
            kv_state, kv_len = rec.state, rec.kv_len  # a completion newer than the snapshot
        elif plan.key is not None:
            entry = inst.snapshot.sessions.get(plan.key)
            if entry is not None:
                kv_state, kv_len = entry.state, entry.kv_len
        per_model = self.leases.by_instance.get(inst.name)
        if per_model:
            leased, leased_all = per_model.get(model, 0.0), per_model.get(None, 0.0)
        else:
            leased = leased_all = 0.0
        return Inputs(
            inst.name,
            row,
            (ov[0], ov[1], ov[2]) if ov is not None else None,
            kv_state,
            kv_len,
            leased,
            leased_all,
            inst.ov_work_s,
            inst.ov_hbm,
            row[STATE] == _RESIDENT and self.retired(plan, inst, row),
            0.0 if row[OTHER_CALLS] is None else self.contenders(plan, inst, row),
        )

    def prime(self, inst: InstanceState, every: InstanceBook) -> None:
        """Compute a new snapshot's cost rows and bounds now rather than in the next
        placements (`inst` just took the snapshot that made `every`'s latest generation)."""
        for model in inst.allowed:
            prof = self.profiles.get(model)
            row = self._row(inst, model, prof)
            if row[STATE] == _RESIDENT:  # what the retirement rule compares with
                self.keep_cost_on(inst, model, prof, row)
        keys = {model: self._bound_key(model) for model in self._bounds.models()}
        self._bounds.update(inst, every, keys)

    def bound_order(self, model: str, every: InstanceBook) -> BoundOrder:
        """The instances allowed `model` in ascending order of their lower bound of Eq. (1)."""
        prof = self.profiles.get(model)
        return self._bounds.get(
            model, self._bound_key(model), every, lambda inst: self.row(inst, model, prof)
        )

    def _recharged(self, instance: str, model: str) -> None:
        """A lease was taken or released on `instance`: its bound for `model` moves."""
        prof = self.profiles.get(model)
        self._bounds.recharge(instance, model, lambda inst: self.row(inst, model, prof))

    def _bound_key(self, model: str) -> tuple:
        prof = self.profiles.get(model)
        return (self.profiles.epoch, prof.prefill_s_per_token, self.knobs.residency_terms)

    def check_integrity(self, every: InstanceBook) -> None:
        keys = {model: self._bound_key(model) for model in self._bounds.models()}
        self._bounds.check_integrity(
            every, keys, lambda inst, model: self.row(inst, model, self.profiles.get(model))
        )

    def row(self, inst: InstanceState, model: str, prof: LatencyProfile) -> tuple:
        row = inst.rows.get(model)
        if row is None or row[EPOCH] != self.profiles.epoch:
            row = self._row(inst, model, prof)
        return row

    def _row(self, inst: InstanceState, model: str, prof: LatencyProfile) -> tuple:
        """Compute and cache `model`'s cost row on `inst` (`cost.cost_row`)."""
        row = cost_row(inst.snapshot, model, prof, self.profiles.epoch)
        inst.set_row(model, row)
        return row

    def passes_eq2(
        self, plan: CallPlan, inst: InstanceState, cand: CandidateCost, gain: float
    ) -> bool:
        """Eq. (2): open a fresh replica only if gain > T_swap + μ_j·ΔW_m + ν_m."""
        snap = inst.snapshot
        return _passes_eq2(
            self.knobs,
            plan,
            replica_facts(snap),
            self.model_state(inst, plan.call.model),
            cand,
            min(gain, self.spare_s(inst.name, plan.now)),
        )

    def inflight(
        self, plan: CallPlan, inst: InstanceState, cand: CandidateCost | None, now: float
    ) -> InFlight:
        """The overlay record of forwarding `plan` to `inst` (cand None: score it first, with no
        placement time: the record's work does not depend on it, and so it reads no windows)."""
        if cand is None or cand.instance != inst.name:
            cand = self.evaluate(plan if plan.now is None else plan._replace(now=None), inst)
        call, prof = plan.call, plan.profile
        reusable = 0
        if cand.kv_state is not KVState.MISSING:
            reusable = min(self.kv_on(inst, call)[1], call.prefix_tokens)
        state = self.model_state(inst, call.model)
        opens = state is not ModelState.ACTIVE
        hbm = _hbm_need(call, prof, state, cand.kv_state, reusable)
        work = cand.prefill_s + cand.kv_recovery_s + cand.activation_s
        return InFlight(call, inst.name, now, work, call.prompt_tokens - reusable, hbm, opens)

    def replica_gain(
        self, plan: CallPlan, instances: InstanceBook, demand: DemandTracker, now: float
    ) -> float:
        """gain(m, ·) of Eq. (2): how much one more replica shrinks the per-replica backlog of m
        over the next control window, D / (k (k + 1)) with D = queued prefill work of m on its k
        open replicas (those in rotation, when the placement time is known) + the part of the
        arrivals' work over the last window and m's live lease charges that those replicas cannot
        absorb over the next one (their `spare_s`: what they absorb never queues). No open
        replica (k = 0) means the first one must open: infinite gain. The book keeps k and the
        queued tokens up to date."""
        facts = self.gain_facts(plan, instances, demand, now)
        if facts.rotation is not None:
            self.placed.advance(plan.now)  # type: ignore[arg-type]  # spare capacity as of now
        return gain_of(plan, facts, self.placed.busy, self.knobs.control_window_s)

    def gain_facts(
        self, plan: CallPlan, instances: InstanceBook, demand: DemandTracker, now: float
    ) -> GainFacts:
        """What `replica_gain` reads, taken now (the windows it reads are trimmed now)."""
        model = plan.call.model
        open_replicas, queued = instances.open_replicas(model)
        if open_replicas == 0:
            return GainFacts(0, queued, None, 0.0)
        rotation = None
        if plan.now is not None:  # retired replicas serve nothing: k counts those in rotation
            rotation = self._in_rotation(model, instances, plan.now)
        arriving = demand.work_s(model, now) + self.leases.by_model.get(model, 0.0)
        running = instances.open_running(model) if self.knobs.replica_gain_decode else 0
        return GainFacts(open_replicas, queued, rotation, arriving, running)

    def _in_rotation(self, model: str, instances: InstanceBook, now: float) -> tuple[str, ...]:
        """The instances `model`'s forwards kept busy over the retirement window. While no
        forward kept any busy, every open replica is in rotation (nothing is retired then:
        `retired`; O(instances), read only when Eq. (2) must decide)."""
        names = self.placed.busy_names(model, instances, now)
        if names:
            return tuple(names)
        return tuple([i.name for i in instances.all() if model in i.open_share])


def _kv_lookup(
    inst: InstanceState, key: tuple[str, str] | None, rec: KVRecord | None
) -> tuple[KVState, int]:
    snap = inst.snapshot
    if key is None or snap is None:
        return KVState.MISSING, 0
    if rec is not None and rec.instance == inst.name and rec.at > snap.taken_at:
        return rec.state, rec.kv_len
    entry = snap.sessions.get(key)
    return (entry.state, entry.kv_len) if entry is not None else (KVState.MISSING, 0)


def _hbm_need(
    call: CallRequest,
    prof: LatencyProfile,
    state: ModelState,
    kv_state: KVState,
    reusable: int,
) -> int:
    on_device = reusable if kv_state is KVState.DEVICE else 0
    kv = prof.kv_bytes_per_token * max(call.prompt_tokens + call.max_tokens - on_device, 0)
    return kv + added_weights(prof, state)
