"""Eq. (1) cost terms, the round-admission and HBM feasibility filters, and Eq. (2).

Cost(r, i) = ΔR_req + C_KV + C_act, each charged once, in seconds:
- ΔR_req: queue (wait for the model's slot, its queued prefill, and same-model lease charges)
  + prefill of the new suffix + decode of `max_tokens` at the instance's decode batch;
- C_KV: 0 for a device-resident prefix, the H2D restore cost for a host-restorable one, and the
  recompute of whatever part of the prefix is not reusable there;
- C_act: 0 if active, the advertised switch cost if resident/staged (partial staging lowers the
  estimate), the full-open cost if absent.
Deadline risk inflates the instance's queue and base round load by (1 + risk).

Round admission (Eq. 5) simulates R_i = base load (snapshot round load + overlay + live lease
charges) + this call's prefill, recovery and activation; its decode is protected budget spread
over rounds (Eq. 4) and already part of the instance's own round prediction. An instance with no
base load admits any single call, so a call whose own prefill exceeds γ·TTFT is not starved.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import defaultdict
from typing import NamedTuple

from talariad.router.search.bounds import BoundIndex, BoundOrder
from talariad.router.knobs import RouterKnobs
from talariad.router.search.logged import LoggedDict
from talariad.router.messages import CallRequest, CandidateCost, ModelResidency, ModelState
from talariad.router.profiles import DemandTracker, ProfileBook, switch_estimate
from talariad.router.sessions import KVRecord, LeaseBook, SessionTable
from talariad.router.telemetry import InFlight, InstanceBook, InstanceState
from talariad.types import KVState, LatencyProfile, Pool

GIB = float(1 << 30)
_OPEN = (ModelState.ACTIVE, ModelState.RESIDENT)
_ABSENT_RES = ModelResidency(ModelState.ABSENT)
# a cost row holds the model's state as its value: a tuple of values the collector does not
# track is one it stops walking (explanations keep the rows of many snapshots)
_ACTIVE, _RESIDENT = ModelState.ACTIVE.value, ModelState.RESIDENT.value


class CallPlan(NamedTuple):
    """Per-call quantities shared by every instance's evaluation (a NamedTuple: hot path)."""

    call: CallRequest
    profile: LatencyProfile
    suffix: int  # prompt tokens no instance can reuse
    prefill_s: float  # prefill of the suffix
    key: tuple[str, str] | None  # (session, model)
    kv_record: KVRecord | None  # where the session's last completion left its prefix
    decode_s: float  # max_tokens decode steps at batch 0 (per-sequence part added per instance)
    kv_bytes: int  # KV footprint of the whole call if nothing is on device
    now: float | None  # placement time: replica retirement is judged then (None: not judged)


class GainFacts(NamedTuple):
    """What Eq. (2)'s gain reads at placement time (`CostModel.gain_facts`)."""

    open_replicas: int  # k, over healthy instances
    queued: int  # their queued tokens
    rotation: tuple[str, ...] | None  # the instances in rotation (None: no placement time)
    arriving: float  # the arrivals' work over the last window plus the model's lease charges


class Inputs(NamedTuple):
    """One instance's side of Eq. (1) for one call, captured at placement time."""

    instance: str
    row: tuple  # the cached snapshot/profile row (`CostModel._row`)
    ov: tuple[int, int, int] | None  # overlay for the model: new tokens, calls, opening calls
    kv_state: KVState
    kv_len: int
    leased_s: float  # admission budget the live leases on the instance hold for this model
    leased_all_s: float  # for all models
    ov_work_s: float
    ov_hbm: int
    retired: bool  # the model is resident there but retired from its rotation (`CostModel.retired`)
    contenders: float  # other models' calls its slots would delay there (`CostModel.contenders`)


class CostModel:
    """Scores one call against one instance; shared by Talaria and the cost-aware baselines."""

    def __init__(
        self, knobs: RouterKnobs, profiles: ProfileBook, leases: LeaseBook, sessions: SessionTable
    ) -> None:
        self.knobs, self.profiles, self.leases, self.sessions = knobs, profiles, leases, sessions
        # work forwarded per (instance, model) and per model over the retirement window
        self.placed = PlacedWork(knobs.retire_window_s)
        self._keep: dict[tuple[str, str], tuple] = {}  # `keep_cost_on`'s cache
        self._bounds = BoundIndex()

    def plan(self, call: CallRequest, now: float | None = None) -> CallPlan:
        prof, suffix = self.profiles.get(call.model), call.prompt_tokens - call.prefix_tokens
        sid = call.session_id
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
        if row[3] != _RESIDENT or inst.snapshot.pool is Pool.HOT:
            return False
        if inst.opening(model) > 0 or self.placed.work_s(model, now) <= 0.0:
            return False
        kept = self.placed.work_s((inst.name, model), now)  # type: ignore[arg-type]
        return kept < self.keep_cost_on(inst, model, prof, row)

    def contenders(self, plan: CallPlan, inst: InstanceState, row: tuple) -> float:
        """How many other models' calls a call of the model would delay on a cold instance where
        the model has no work yet: time-sharing adds its slots to every round while it runs
        (ΔR_req's "incremental work introduced by r", felt by the calls already there). Those
        running or queued now (snapshot and forwards since), or, when more, the share of the
        last window that other models' forwarded work kept the instance busy (a new session
        makes more calls than this one: the contention it will meet, not only what runs now).
        A live lease is a return about to run there: its model's work, like a running call."""
        model, name = plan.call.model, inst.name
        if not self.adds_slot(inst, model, row):
            return 0.0
        calls = row[15] + sum(r[1] for m, r in inst.ov_model.items() if m != model)
        calls += self.leases.count(name)  # none of them is the model's (`adds_slot`)
        if plan.now is None:
            return contenders_of(calls, None, self.knobs.retire_window_s)
        work = self.placed.work_s
        busy = work((name, None), plan.now) - work((name, model), plan.now)  # type: ignore[arg-type]
        return contenders_of(calls, busy, self.knobs.retire_window_s)

    def adds_slot(self, inst: InstanceState, model: str, row: tuple) -> bool:
        """A call of `model` would add its slots to `inst`'s rounds: a cold instance where the
        model has no call running, queued, forwarded or leased (`_other_calls` is None else)."""
        if row[15] is None or self.leases.count(inst.name, model):
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
            kept = (row, prof, self.knobs, self.keep_cost_s(model, prof, facts, row[4]))
            self._keep[key] = kept
        return kept[3]

    def keep_cost_s(self, model: str, prof: LatencyProfile, facts: tuple, switch_s: float) -> float:
        """What keeping `model` in an instance's rotation costs over a window: one switch, its
        weights' HBM at μ_j, and ν_m; the right side of Eq. (2) with the whole weights."""
        return self._price(model, facts, prof.weight_bytes, switch_s)

    def kv_on(self, inst: InstanceState, call: CallRequest) -> tuple[KVState, int]:
        """Newest word on the session's prefix there: a later completion beats the snapshot."""
        sid = call.session_id
        rec = self.sessions.kv_record(sid, call.model) if sid is not None else None
        return _kv_lookup(inst, (sid, call.model) if sid is not None else None, rec)

    def model_state(self, inst: InstanceState, model: str) -> ModelState:
        if inst.opening(model) > 0:
            return ModelState.ACTIVE  # an in-flight forward is already opening it there
        return inst.snapshot.residency(model).state  # type: ignore[union-attr]

    def evaluate(self, plan: CallPlan, inst: InstanceState) -> CandidateCost:
        """Eq. (1) plus the round-admission and HBM checks for one placeable instance."""
        return self.score(plan, self.inputs(plan, inst))

    def inputs(self, plan: CallPlan, inst: InstanceState) -> Inputs:
        """What `score` reads about `inst` now, as immutable values: a score rendered from them
        later (a lazy explanation) equals the one `evaluate` gives now."""
        # NOTE: runs for every scored instance: `row`, and the cheap exits of `retired` (not
        # resident) and `contenders` (no slot added), inlined
        model = plan.call.model
        row = inst.rows.get(model)
        if row is None or row[0] != self.profiles.epoch:
            row = self._row(inst, model, plan.profile)
        ov = inst.ov_model.get(model)
        rec, kv_state, kv_len = plan.kv_record, KVState.MISSING, 0
        if rec is not None and rec.instance == inst.name and rec.at > row[11]:
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
            row[3] == _RESIDENT and self.retired(plan, inst, row),
            0.0 if row[15] is None else self.contenders(plan, inst, row),
        )

    def prime(self, inst: InstanceState, every: InstanceBook) -> None:
        """Compute a new snapshot's cost rows and bounds now rather than in the next
        placements (`inst` just took the snapshot that made `every`'s latest generation)."""
        for model in inst.allowed:
            prof = self.profiles.get(model)
            row = self._row(inst, model, prof)
            if row[3] == _RESIDENT:  # what the retirement rule compares with
                self.keep_cost_on(inst, model, prof, row)
        keys = {model: self._bound_key(model) for model in self._bounds.models()}
        self._bounds.update(inst, every, keys)

    def bound_order(self, model: str, every: InstanceBook) -> BoundOrder:
        """The instances allowed `model` in ascending order of their lower bound of Eq. (1)."""
        prof = self.profiles.get(model)
        return self._bounds.get(
            model, self._bound_key(model), every, lambda inst: self.row(inst, model, prof)
        )

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
        if row is None or row[0] != self.profiles.epoch:
            row = self._row(inst, model, prof)
        return row

    def score(self, plan: CallPlan, x: Inputs) -> CandidateCost:
        """Eq. (1) and the round/HBM checks from captured inputs (pure: no state is read).

        NOTE: the per-instance inner loop of place(), written flat on purpose."""
        call, prof, k = plan.call, plan.profile, self.knobs
        prefix = call.prefix_tokens
        (
            _,
            queued,
            batch,
            state,
            activation,
            needs_replica,
            added,
            risk,
            slot_wait,
            base_load,
            restore_rate,
            _,
            hbm_free,
            _,
            _,
            _,
        ) = x.row
        if x.ov is not None:
            queued, batch = queued + x.ov[0], batch + x.ov[1]
            if x.ov[2]:  # an in-flight forward already opens it there
                state, activation, needs_replica, added = _ACTIVE, 0.0, False, 0
        if x.retired:
            needs_replica = True  # reopening a retired replica passes Eq. (2) like a fresh one
        kv_state, kv_len = x.kv_state, x.kv_len
        reusable = 0 if kv_state is KVState.MISSING else (kv_len if kv_len < prefix else prefix)
        recovery = _recompute_s(plan, prefix - reusable)
        hbm_need = plan.kv_bytes + added
        if kv_state is KVState.HOST:
            recovery += restore_rate * reusable
        elif kv_state is KVState.DEVICE:
            hbm_need -= prof.kv_bytes_per_token * reusable  # that much KV is already there
        if state == _ACTIVE and reusable > 0:
            slot_wait = 0.0  # SP admits a continuation with reusable KV mid-slot (§3.4)
        if not k.residency_terms:
            recovery, activation, needs_replica = 0.0, 0.0, False
        queue = risk * (slot_wait + prof.prefill_s_per_token * queued + x.leased_s)
        decode = plan.decode_s + call.max_tokens * prof.decode_s_per_seq * (batch + 1)
        base = risk * (base_load + x.ov_work_s + x.leased_all_s)
        prefill = plan.prefill_s
        round_load = base + prefill + recovery + activation
        if base > 0.0 and round_load > k.round_budget_s:
            reason = "round"
        elif hbm_free is not None and hbm_need > hbm_free - x.ov_hbm:
            reason = "hbm"
        else:
            reason = "ok"
        total = queue + prefill + decode + recovery + activation
        # the others wait out its time on the instance, not its own wait for a slot
        contention = x.contenders * (total - queue) if k.residency_terms else 0.0
        replica = 0.0
        if needs_replica and k.residency_terms:  # a retired replica keeps its whole weights
            replica = self._memory_s(added or prof.weight_bytes, x.row[13], x.row[14])
            if base > 0.0 or x.contenders > 0.0:  # it would time-share a busy instance
                replica += k.replica_penalty(call.model)
        return CandidateCost(
            x.instance,
            queue,
            prefill,
            decode,
            recovery,
            activation,
            total,
            reason == "ok",
            reason,
            kv_state,
            needs_replica,
            round_load,
            None,
            replica,
            contention,
        )

    def _row(self, inst: InstanceState, model: str, prof: LatencyProfile) -> tuple:
        """Snapshot- and profile-only parts of Eq. (1) for one model on one instance."""
        snap = inst.snapshot
        res = snap.models.get(model, _ABSENT_RES)
        activation, needs_replica = _activation(prof, res, res.state)
        rate = snap.restore_s_per_token
        rate = prof.restore_s_per_token if rate is None else rate  # measured beats profiled
        risk = 1.0 + max(snap.deadline_risk, 0.0)
        slot_wait = 0.0 if snap.pool is Pool.HOT else snap.round_remaining_s
        row = (
            self.profiles.epoch,
            res.queued_tokens,
            res.running_calls,
            res.state.value,  # a str, not the member (see `_RESIDENT`)
            activation,
            needs_replica,
            _added_weights(prof, res.state),
            risk,
            slot_wait,
            snap.round_load_s,
            rate,
            snap.taken_at,
            snap.hbm_free_bytes,
            snap.kv_occupancy,
            snap.staging_slack_bytes,
            _other_calls(snap, model, res),
        )
        inst.set_row(model, row)
        return row

    def passes_eq2(
        self, plan: CallPlan, inst: InstanceState, cand: CandidateCost, gain: float
    ) -> bool:
        """Eq. (2): open a fresh replica only if gain > T_swap + μ_j·ΔW_m + ν_m."""
        snap = inst.snapshot
        return self.passes_eq2_on(
            plan,
            replica_facts(snap),
            self.model_state(inst, plan.call.model),
            cand,
            min(gain, self.spare_s(inst.name, plan.now)),
        )

    def passes_eq2_on(
        self, plan: CallPlan, facts: tuple, state: ModelState, cand: CandidateCost, gain: float
    ) -> bool:
        """Eq. (2) from `replica_facts` and the model's state there (pure: lazy explanations).
        `gain` is already capped by what the instance can absorb (`spare_s`): a replica on an
        instance that its other work keeps busy reduces no queued demand of the model."""
        model, prof = plan.call.model, plan.profile
        if state is not ModelState.ABSENT:  # a retired replica: keeping it is what it costs
            return gain > self.keep_cost_s(model, prof, facts, cand.activation_s)
        return gain > self._replica_cost(model, prof, state, facts, cand.activation_s)

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
        return self.gain_of(plan, facts, self.placed.busy)

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
        return GainFacts(open_replicas, queued, rotation, arriving)

    def gain_of(self, plan: CallPlan, facts: GainFacts, busy: dict[str, float] | None) -> float:
        """`replica_gain` from its facts and the (instance, None) window sums of that moment
        (`PlacedWork.busy` once advanced; None without a placement time)."""
        open_replicas = facts.open_replicas
        if open_replicas == 0:
            return math.inf
        spare = 0.0
        if facts.rotation is not None:
            window = self.knobs.control_window_s
            spare = spare_total(sorted(facts.rotation), busy, window)  # type: ignore[arg-type]
            open_replicas = max(1, min(open_replicas, len(facts.rotation)))
        # arrivals (and leased returns) that the replicas in rotation can absorb over the next
        # window never queue: only the rest spills; what is queued now is backlog already
        backlog = plan.profile.prefill_s_per_token * facts.queued
        backlog += max(facts.arriving - spare, 0.0)
        return backlog / (open_replicas * (open_replicas + 1))

    def _in_rotation(self, model: str, instances: InstanceBook, now: float) -> tuple[str, ...]:
        """The instances `model`'s forwards kept busy over the retirement window. While no
        forward kept any busy, every open replica is in rotation (nothing is retired then:
        `retired`; O(instances), read only when Eq. (2) must decide)."""
        names = self.placed.busy_names(model, instances, now)
        if names:
            return tuple(names)
        return tuple([i.name for i in instances.all() if model in i.open_share])

    def _replica_cost(
        self, model: str, prof: LatencyProfile, state: ModelState, facts: tuple, activation: float
    ) -> float:
        """Right side of Eq. (2): T_swap + μ_j·ΔW_m + ν_m; μ_j rises with KV occupancy and with
        the share of ΔW that the instance's staging slack cannot cover."""
        return self._price(model, facts, _added_weights(prof, state), activation)

    def _price(self, model: str, facts: tuple, added: int, activation: float) -> float:
        """T_swap + μ_j·ΔW + ν_m for `added` bytes of weights."""
        kv_occupancy, staging_slack = facts
        memory = self._memory_s(added, kv_occupancy, staging_slack)
        return activation + memory + self.knobs.replica_penalty(model)

    def _memory_s(self, added: int, kv_occupancy: float, staging_slack: int) -> float:
        """μ_j·ΔW: μ_j rises with KV occupancy and with the share of ΔW that the instance's free
        HBM (its staging slack) cannot take without displacing KV or other weights."""
        u = min(max(kv_occupancy, 0.0), 0.95)
        uncovered = max(added - staging_slack, 0) / added if added > 0 else 0.0
        mu = self.knobs.hbm_price_s_per_gib * (1.0 + u / (1.0 - u)) * (1.0 + uncovered)
        return mu * added / GIB


class PlacedWork(DemandTracker):
    """The work placed per (instance, model), (instance, None) and model, each counted from its
    forward until a window after its predicted end (`record`'s `until`), which also keeps, as
    dicts whose past states a lazy explanation keeps (`logged.LoggedDict`):
    - `kept[model]`: instance -> its (instance, model) sum, current where it was last read;
    - `busy`: instance -> its (instance, None) sum, current as of the last `advance`
    (`held_kept`, `held_busy`: their states now).

    NOTE: a window sum is a running float sum, and its last bits depend on when it was trimmed;
    a sum whose events all left the window reads exactly 0.0 (`_trim`), so whether an instance
    is busy (kept in rotation) never depends on a residue. The (instance, model) and model sums
    are trimmed exactly when reading them would have trimmed them (`trim_due`: the retirement
    rule's and `CostModel.contenders`' reads); the (instance, None) sums, which spare capacity
    and contention read, are trimmed as time passes (`advance`), which can change only the last
    bits of a sum that still holds events.
    """

    def __init__(self, window_s: float) -> None:
        super().__init__(window_s)
        self._kept: dict[str, LoggedDict] = {}
        self.kept: dict[str, dict[str, float]] = {}  # model -> its `_kept` entry's live dict
        self._logged_busy = LoggedDict()
        self.busy: dict[str, float] = self._logged_busy.live
        self._busy: defaultdict[str, set[str]] = defaultdict(set)  # model -> sum > 0 there
        self._due: defaultdict[str, list[tuple[float, str]]] = defaultdict(list)
        """model -> heap of (its oldest event's end, instance) over the (instance, model) windows"""
        self._head: dict[tuple[str, str], float] = {}  # (instance, model) -> its entry in _due
        self._expiry: list[tuple[float, str]] = []  # heap of (until, instance): (instance, None)

    def record(self, model, now: float, work_s: float, until: float | None = None) -> None:
        if type(model) is tuple and model[1] is None:
            heapq.heappush(self._expiry, (self.end_of(now, until), model[0]))
        super().record(model, now, work_s, until)

    def held_kept(self, model: str) -> tuple | None:
        """The state of `kept[model]` now, for a caller that keeps it (`logged.thaw`)."""
        kept = self._kept.get(model)
        return kept.frozen() if kept is not None else None

    def held_busy(self) -> tuple:
        """The state of `busy` now, for a caller that keeps it (`logged.thaw`)."""
        return self._logged_busy.frozen()

    def advance(self, now: float) -> None:
        """Trim every (instance, None) window to `now`."""
        expiry, cutoff = self._expiry, now - self._window
        while expiry and expiry[0][0] <= cutoff:
            self._trim((heapq.heappop(expiry)[1], None), now)

    def _trim(self, model, now: float) -> None:  # every change of a sum ends here (`record` too)
        super()._trim(model, now)
        if type(model) is tuple:
            self._sync(model)

    def _sync(self, key: tuple) -> None:
        inst, model = key
        total = self._sums[key]
        if model is None:
            if self.busy.get(inst) != total:
                self._logged_busy.set(inst, total)
            return
        if total > 0.0:
            self._busy[model].add(inst)
        else:
            self._busy[model].discard(inst)
        kept = self._kept.get(model)
        if kept is None:
            kept = self._kept[model] = LoggedDict()
            self.kept[model] = kept.live
        if kept.live.get(inst) != total:
            kept.set(inst, total)
        events = self._events[key]
        head = events[0][0] if events else None
        if head is not None and self._head.get(key) != head:
            self._head[key] = head
            heapq.heappush(self._due[model], (head, inst))

    def trim_due(self, model: str, now: float, read) -> None:
        """Trim the (instance, model) windows that reading `work_s((instance, model), now)` for
        every instance with `read(instance)` would trim (those with an event past the window)."""
        due, cutoff, parked = self._due.get(model), now - self._window, []
        while due and due[0][0] <= cutoff:
            head, inst = heapq.heappop(due)
            key = (inst, model)
            if self._head.get(key) != head:
                continue  # that window was trimmed since: a newer entry stands for it
            if not read(inst):
                parked.append((head, inst))  # not read: left as it is
                continue
            del self._head[key]
            self._trim(key, now)  # queues the window's new oldest event
        for entry in parked:
            heapq.heappush(due, entry)  # type: ignore[arg-type]

    def busy_names(self, model: str, instances: InstanceBook, now: float):
        """The names of `instances` with a positive window sum for `model` at `now`: those for
        which `work_s((name, model), now) > 0.0` holds, trims included (a live set or a new
        one: read it, do not keep it)."""
        self.trim_due(model, now, instances.__contains__)
        busy = self._busy.get(model)
        if not busy or instances.names() >= busy:
            return busy or _NO_NAMES
        return {inst for inst in busy if inst in instances}


_NO_NAMES: frozenset[str] = frozenset()
_ZEROS = itertools.repeat(0.0)  # the default of every `busy` read


def spare_of(busy_s: float, window_s: float) -> float:
    """What an instance busy `busy_s` over the last window can absorb over the next one."""
    return max(window_s - busy_s, 0.0)


def spare_total(names: list[str], busy: dict[str, float], window_s: float) -> float:
    """`sum(spare_of(work_s((name, None), now), window_s) for name in names)` from `busy`,
    `PlacedWork.busy` once advanced to `now` (in one pass: it runs when Eq. (2) decides)."""
    spare = [window_s - (0.0 if 0.0 > b else b) for b in map(busy.get, names, _ZEROS)]
    return sum([0.0 if 0.0 > s else s for s in spare])  # `spare_of`, inlined


def contenders_of(calls: int, others_busy_s: float | None, window_s: float) -> float:
    """`CostModel.contenders` from its inputs: the other models' calls there now, or, when more,
    the share of the window their work kept the instance busy (None: no placement time)."""
    if others_busy_s is None:
        return float(calls)
    return max(float(calls), min(others_busy_s / window_s, 1.0))


def replica_facts(snap) -> tuple[float, int]:
    """What Eq. (2)'s replica cost reads from a snapshot besides the model's state: its KV
    occupancy and staging slack (a cost row keeps them too: `CostModel._row`'s 13 and 14)."""
    return snap.kv_occupancy, snap.staging_slack_bytes


def _other_calls(snap, model: str, res: ModelResidency) -> int | None:
    """Calls of other models running or queued on a cold instance where `model` has none (None:
    a hot instance, or `model` has work there, so a call of it adds no slot to the rounds)."""
    if snap.pool is Pool.HOT or res.running_calls or res.queued_calls:
        return None
    return sum(r.running_calls + r.queued_calls for m, r in snap.models.items() if m != model)


def _recompute_s(plan: CallPlan, missing: int) -> float:
    """Prefill of the part of the prefix that must be recomputed (the suffix already paid the
    prefill base cost when there is one)."""
    prof = plan.profile
    if plan.suffix > 0 or missing == 0:
        return prof.prefill_s_per_token * missing
    return prof.prefill_s(missing)


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


def _activation(prof: LatencyProfile, res: ModelResidency, state: ModelState) -> tuple[float, bool]:
    """C_act and whether the instance needs a fresh replica of the model."""
    if state is ModelState.ACTIVE:
        return 0.0, False
    if state is ModelState.ABSENT:
        return (prof.open_s if res.open_cost_s is None else res.open_cost_s), True
    advertised = res.switch_cost_s
    cost = switch_estimate(prof, res.staged_fraction) if advertised is None else advertised
    return cost, False


def _added_weights(prof: LatencyProfile, state: ModelState) -> int:
    if state is ModelState.ABSENT:
        return prof.weight_bytes
    return 0


def _hbm_need(
    call: CallRequest,
    prof: LatencyProfile,
    state: ModelState,
    kv_state: KVState,
    reusable: int,
) -> int:
    on_device = reusable if kv_state is KVState.DEVICE else 0
    kv = prof.kv_bytes_per_token * max(call.prompt_tokens + call.max_tokens - on_device, 0)
    return kv + _added_weights(prof, state)
