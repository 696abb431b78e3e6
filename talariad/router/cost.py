"""The reference (§3.3): Eq. (1), the filters, Eq. (2) and Algorithm 1's cost placement, as plain
functions over named inputs, in seconds.

- Eq. (1) (`score`): ΔR_req (queue + prefill + decode) + C_KV (restore or recompute the prefix)
  + C_act (switch or open); deadline risk inflates queue and base load by (1 + risk);
- filters: round admission (Eq. 5) of R_i with the call, and HBM;
- Eq. (2) (`passes_eq2`): a fresh replica only if gain > T_swap + μ_j·ΔW_m + ν_m;
- Algorithm 1 (`rank_all`): the cheapest feasible by `CandidateCost.rank_s`.
`search/` makes it fast. Design: docs/internals.md.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from talariad.router.knobs import RouterKnobs
from talariad.router.messages import CallRequest, CandidateCost, ModelResidency, ModelState
from talariad.router.profiles import switch_estimate
from talariad.types import KVState, LatencyProfile, Pool

if TYPE_CHECKING:  # the books and the search: what `rank_all` is handed, never imported
    from talariad.router.profiles import DemandTracker
    from talariad.router.search.costmodel import CostModel
    from talariad.router.sessions import KVRecord
    from talariad.router.telemetry import InstanceBook, InstanceState

GIB = float(1 << 30)
_ACTIVE, _RESIDENT = ModelState.ACTIVE.value, ModelState.RESIDENT.value
_ABSENT_RES = ModelResidency(ModelState.ABSENT)

# The cost row: what Eq. (1) reads of one instance's snapshot for one model, and nothing of the
# call. A plain tuple of plain values read by these indices (`cost_row` builds it): explanations
# keep the rows of many snapshots, and the collector stops walking a tuple that holds nothing it
# tracks (so the row holds the model's state as its value, not the enum member).
(
    EPOCH,  # the profile epoch it was computed under (`ProfileBook.epoch`)
    QUEUED,  # the model's queued tokens there
    RUNNING,  # the model's running calls there: its decode batch
    STATE,  # the model's `ModelState` value there
    ACTIVATION,  # C_act
    NEEDS_REPLICA,  # a placement there opens a fresh replica (Eq. (2) applies)
    ADDED_BYTES,  # weight bytes such a placement adds (ΔW_m)
    RISK,  # 1 + deadline risk
    SLOT_WAIT,  # the wait for the model's next slot (0 on a hot instance)
    ROUND_LOAD,  # the snapshot's predicted round load
    RESTORE_RATE,  # H2D restore seconds per token (measured, else profiled)
    TAKEN_AT,  # when the snapshot was taken
    HBM_FREE,  # free HBM bytes (None: not measured, no HBM check)
    KV_OCCUPANCY,  # what μ_j reads: KV occupancy and staging slack (`replica_facts`)
    STAGING_SLACK,
    OTHER_CALLS,  # other models' calls a call of this one would delay (None: adds no slot)
) = range(16)


def cost_row(snap, model: str, prof: LatencyProfile, epoch: int) -> tuple:
    """The cost row of `model` on the instance whose snapshot is `snap`."""
    res = snap.models.get(model, _ABSENT_RES)
    activation, needs_replica = activation_s(prof, res, res.state)
    rate = snap.restore_s_per_token
    rate = prof.restore_s_per_token if rate is None else rate  # measured beats profiled
    slot_wait = res.slot_wait_s
    if slot_wait is None:
        slot_wait = snap.slot_wait_s()
    return (
        epoch,
        res.queued_tokens,
        res.running_calls,
        res.state.value,
        activation,
        needs_replica,
        added_weights(prof, res.state),
        1.0 + max(snap.deadline_risk, 0.0),
        slot_wait,
        snap.round_load_s,
        rate,
        snap.taken_at,
        snap.hbm_free_bytes,
        snap.kv_occupancy,
        snap.staging_slack_bytes,
        other_calls(snap, model, res),
    )


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


class Inputs(NamedTuple):
    """One instance's side of Eq. (1) for one call, captured at placement time."""

    instance: str
    row: tuple  # the instance's cost row for the model (`cost_row`)
    ov: tuple[int, int, int] | None  # overlay for the model: new tokens, calls, opening calls
    kv_state: KVState
    kv_len: int
    leased_s: float  # admission budget the live leases on the instance hold for this model
    leased_all_s: float  # for all models
    ov_work_s: float
    ov_hbm: int
    retired: bool  # the model is resident there but retired from its rotation
    contenders: float  # other models' calls its slots would delay there


class GainFacts(NamedTuple):
    """What Eq. (2)'s gain reads at placement time (`CostModel.gain_facts`)."""

    open_replicas: int  # k, over healthy instances
    queued: int  # their queued tokens
    rotation: tuple[str, ...] | None  # the instances in rotation (None: no placement time)
    arriving: float  # the arrivals' work over the last window plus the model's lease charges
    running: int = 0  # their running calls, where decode contention counts (else 0)


def score(plan: CallPlan, x: Inputs, k: RouterKnobs) -> CandidateCost:
    """Eq. (1) for one instance, and the round-admission (Eq. 5) and HBM filters."""
    call, prof, row = plan.call, plan.profile, x.row
    queued, batch, state = row[QUEUED], row[RUNNING], row[STATE]
    activation, needs_replica, added = row[ACTIVATION], row[NEEDS_REPLICA], row[ADDED_BYTES]
    if x.ov is not None:  # the router's own forwards since the snapshot (§4.1)
        queued, batch = queued + x.ov[0], batch + x.ov[1]
        if x.ov[2]:  # one of them already opens the model there
            state, activation, needs_replica, added = _ACTIVE, 0.0, False, 0
    if x.retired:
        needs_replica = True  # reopening a retired replica passes Eq. (2) like a fresh one
    reusable, recovery, on_device = kv_terms(plan, x.kv_state, x.kv_len, row[RESTORE_RATE])
    hbm_need = plan.kv_bytes + added - on_device
    slot_wait = row[SLOT_WAIT]
    if state == _ACTIVE and reusable > 0:
        slot_wait = 0.0  # SP admits a continuation with reusable KV mid-slot (§3.4)
    if not k.residency_terms:
        recovery, activation, needs_replica = 0.0, 0.0, False
    # ΔR_req: the queue ahead of the call (inflated by deadline risk), its prefill, its decode
    risk, prefill = row[RISK], plan.prefill_s
    queue = risk * (slot_wait + prof.prefill_s_per_token * queued + x.leased_s)
    decode = plan.decode_s + call.max_tokens * prof.decode_s_per_seq * (batch + 1)
    base = risk * (row[ROUND_LOAD] + x.ov_work_s + x.leased_all_s)
    round_load = base + prefill + recovery + activation  # R_i of Eq. (5) with the call
    if base > 0.0 and round_load > k.round_budget_s:
        reason = "round"
    elif row[HBM_FREE] is not None and hbm_need > row[HBM_FREE] - x.ov_hbm:
        reason = "hbm"
    else:
        reason = "ok"
    total = queue + prefill + decode + recovery + activation  # Eq. (1)
    # the others wait out its time on the instance, not its own wait for a slot
    contention = x.contenders * (total - queue) if k.residency_terms else 0.0
    replica = 0.0
    if needs_replica and k.residency_terms:  # a retired replica keeps its whole weights
        replica = memory_s(k, added or prof.weight_bytes, row[KV_OCCUPANCY], row[STAGING_SLACK])
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
        x.kv_state,
        needs_replica,
        round_load,
        None,
        replica,
        contention,
    )


def kv_terms(plan: CallPlan, kv_state: KVState, kv_len: int, restore_rate: float):
    """C_KV: (prefix tokens reusable there, their recovery: restore what is on the host and
    recompute the rest, KV bytes already on the device)."""
    prefix = plan.call.prefix_tokens
    reusable = 0 if kv_state is KVState.MISSING else (kv_len if kv_len < prefix else prefix)
    recovery = recompute_s(plan, prefix - reusable)
    if kv_state is KVState.HOST:
        return reusable, recovery + restore_rate * reusable, 0
    if kv_state is KVState.DEVICE:
        return reusable, recovery, plan.profile.kv_bytes_per_token * reusable
    return reusable, recovery, 0


def recompute_s(plan: CallPlan, missing: int) -> float:
    """Prefill of the part of the prefix that must be recomputed (the suffix already paid the
    prefill base cost when there is one)."""
    prof = plan.profile
    if plan.suffix > 0 or missing == 0:
        return prof.prefill_s_per_token * missing
    return prof.prefill_s(missing)


def activation_s(prof: LatencyProfile, res: ModelResidency, state: ModelState):
    """C_act, and whether the instance needs a fresh replica of the model."""
    if state is ModelState.ACTIVE:
        return 0.0, False
    if state is ModelState.ABSENT:
        return (prof.open_s if res.open_cost_s is None else res.open_cost_s), True
    advertised = res.switch_cost_s
    cost = switch_estimate(prof, res.staged_fraction) if advertised is None else advertised
    return cost, False


def added_weights(prof: LatencyProfile, state: ModelState) -> int:
    """ΔW_m: the weights a placement adds (all of them where the model is absent)."""
    return prof.weight_bytes if state is ModelState.ABSENT else 0


def other_calls(snap, model: str, res: ModelResidency) -> int | None:
    """Calls of other models running or queued on a cold instance where `model` has none (None:
    a hot instance, or `model` has work there, so a call of it adds no slot to the rounds)."""
    if snap.pool is Pool.HOT or res.running_calls or res.queued_calls:
        return None
    return sum(r.running_calls + r.queued_calls for m, r in snap.models.items() if m != model)


def contenders_of(calls: int, others_busy_s: float | None, window_s: float) -> float:
    """How many other models' calls a call's slots would delay: those there now, or, when more,
    the share of the window their work kept the instance busy (None: no placement time)."""
    if others_busy_s is None:
        return float(calls)
    return max(float(calls), min(others_busy_s / window_s, 1.0))


# --- Eq. (2) -------------------------------------------------------------------------------
def replica_facts(snap) -> tuple[float, int]:
    """What μ_j reads of a snapshot: its KV occupancy and staging slack (the row keeps them)."""
    return snap.kv_occupancy, snap.staging_slack_bytes


def memory_s(k: RouterKnobs, added: int, kv_occupancy: float, staging_slack: int) -> float:
    """μ_j·ΔW: μ_j rises with KV occupancy and with the share of ΔW that the instance's free
    HBM (its staging slack) cannot take without displacing KV or other weights."""
    u = min(max(kv_occupancy, 0.0), 0.95)
    uncovered = max(added - staging_slack, 0) / added if added > 0 else 0.0
    mu = k.hbm_price_s_per_gib * (1.0 + u / (1.0 - u)) * (1.0 + uncovered)
    return mu * added / GIB


def replica_price(k: RouterKnobs, model: str, facts: tuple, added: int, switch_s: float) -> float:
    """The right side of Eq. (2), T_swap + μ_j·ΔW + ν_m, for `added` bytes of weights."""
    kv_occupancy, staging_slack = facts
    memory = memory_s(k, added, kv_occupancy, staging_slack)
    return switch_s + memory + k.replica_penalty(model)


def keep_cost_s(k: RouterKnobs, model: str, prof: LatencyProfile, facts: tuple, switch_s: float):
    """What keeping `model` in an instance's rotation costs over a window: Eq. (2)'s right side
    with its whole weights (the retirement rule compares the work placed there with it)."""
    return replica_price(k, model, facts, prof.weight_bytes, switch_s)


def passes_eq2(
    k: RouterKnobs, plan: CallPlan, facts: tuple, state: ModelState, cand, gain: float
) -> bool:
    """Eq. (2) for `cand`, with the model in `state` there. `gain` is already capped by what the
    instance can absorb (`spare_of`): a replica on an instance that its other work keeps busy
    reduces no queued demand of the model."""
    model, prof = plan.call.model, plan.profile
    if state is not ModelState.ABSENT:  # a retired replica: keeping it is what it costs
        return gain > keep_cost_s(k, model, prof, facts, cand.activation_s)
    return gain > replica_price(k, model, facts, added_weights(prof, state), cand.activation_s)


def gain_of(plan: CallPlan, facts: GainFacts, busy: dict[str, float] | None, window_s: float):
    """gain(m, ·) of Eq. (2): how much one more replica shrinks the per-replica backlog of m
    over the next control window, D / (k (k + 1)), with D = the queued prefill work of m on its
    k open replicas (those in rotation, when the placement time is known) + the part of the
    arrivals' work and m's lease charges that those replicas cannot absorb (`spare_total` of
    `busy`, each instance's work over the last window) + where `facts.running` counts, their
    running calls' decode contention (`decode_contention_s`). No open replica: infinite gain."""
    open_replicas = facts.open_replicas
    if open_replicas == 0:
        return math.inf
    spare = 0.0
    if facts.rotation is not None:
        spare = spare_total(sorted(facts.rotation), busy, window_s)  # type: ignore[arg-type]
        open_replicas = max(1, min(open_replicas, len(facts.rotation)))
    # arrivals (and leased returns) that the replicas in rotation can absorb over the next
    # window never queue: only the rest spills; what is queued now is backlog already
    backlog = plan.profile.prefill_s_per_token * facts.queued
    backlog += max(facts.arriving - spare, 0.0)
    backlog += decode_contention_s(plan, facts.running)
    return backlog / (open_replicas * (open_replicas + 1))


def decode_contention_s(plan: CallPlan, running: int) -> float:
    """The decode work that `running` calls of the model cost each other on its open replicas,
    as Eq. (1) counts a call's decode: each of a replica's b calls decodes `max_tokens` steps
    `decode_s_per_seq` slower for each of the others. Over k replicas with b = running / k that
    sums to D / k with D = decode_s_per_seq x running^2 x max_tokens, so one more replica saves
    D / (k (k + 1)), the form of the queued backlog's gain (`RouterKnobs.replica_gain_decode`)."""
    return plan.profile.decode_s_per_seq * running * running * plan.call.max_tokens


def spare_of(busy_s: float, window_s: float) -> float:
    """What an instance busy `busy_s` over the last window can absorb over the next one."""
    return max(window_s - busy_s, 0.0)


_ZEROS = itertools.repeat(0.0)  # the default of every `busy` read


def spare_total(names: list[str], busy: dict[str, float], window_s: float) -> float:
    """`sum(spare_of(max(busy.get(name, 0.0), 0.0), window_s) for name in names)`, in one pass."""
    spare = [window_s - (0.0 if 0.0 > b else b) for b in map(busy.get, names, _ZEROS)]
    return sum([0.0 if 0.0 > s else s for s in spare])  # `spare_of`, inlined


# --- Algorithm 1, cost placement ----------------------------------------------------------
class Ranking(NamedTuple):
    best: CandidateCost | None  # the cheapest feasible candidate
    candidates: Sequence[CandidateCost]  # every eligible instance, in name order
    cheapest: str | None  # the cheapest candidate ignoring feasibility (where a spill goes)
    retired: CandidateCost | None = None
    """With no feasible candidate: the cheapest one refused only as a retired replica (the one
    that reopens when the replicas in rotation are infeasible)."""


def rank_all(
    cost: CostModel,
    plan: CallPlan,
    insts: list[InstanceState],
    every: InstanceBook,
    demand: DemandTracker,
    now: float,
) -> Ranking:
    """Algorithm 1, lines 11-24: every eligible instance scored, Eq. (2) applied to those that
    open a replica, the cheapest feasible one kept (ties by name)."""
    cands = [cost.evaluate(plan, inst) for inst in insts]
    if cost.knobs.residency_terms and any(c.needs_replica and c.feasible for c in cands):
        gain = cost.replica_gain(plan, every, demand, now)
        if not math.isinf(gain):
            cands = [
                c._replace(feasible=False, reason=gate(cost, inst, plan))
                if c.needs_replica and c.feasible and not cost.passes_eq2(plan, inst, c, gain)
                else c
                for c, inst in zip(cands, insts, strict=False)
            ]
    best = min((c for c in cands if c.feasible), key=rank_key, default=None)
    retired = None
    if best is None:
        retired = min((c for c in cands if c.reason == "retired"), key=rank_key, default=None)
    return Ranking(
        best, tuple(cands), min(cands, key=rank_key).instance if cands else None, retired
    )


def gate(cost: CostModel, inst: InstanceState, plan: CallPlan) -> str:
    """Which Eq. (2) gate a candidate failed: a fresh replica's, or a retired one's reopening."""
    return "eq2" if cost.model_state(inst, plan.call.model) is ModelState.ABSENT else "retired"


def rank_key(c: CandidateCost) -> tuple[float, str]:
    return (c.rank_s, c.instance)
