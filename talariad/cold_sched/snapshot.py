"""Read-only views of a ColdScheduler: the telemetry snapshot and the integrity check."""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING

from .telemetry import KVLocation, ModelQueue, SchedTelemetry

if TYPE_CHECKING:
    from .scheduler import ColdScheduler


def build_telemetry(s: ColdScheduler, now: float) -> SchedTelemetry:
    bound = s.knobs.round_bound_s
    waiting = [r for m in s.models for r in s.table.waiting_records(m)]
    return SchedTelemetry(
        now=now,
        mode=s.mode,
        active_model=s.active,
        slot_phase=s.slot.phase.value if s.slot else None,
        slot_remaining_s=max(0.0, s.slot.remaining(now)) if s.slot else 0.0,
        round_index=s.rounds.next_index(),
        round_remaining_s=round_remaining_s(s, now),
        queues={m: model_queue(s, m, now) for m in s.models},
        sp_admitted=s.sp_admitted,
        sp_parked=s.sp_parked,
        decode_parked=s.decode_parked,
        risk_round_bound=s.risk.round_bound,
        risk_round_overrun=s.risk.round_overrun,
        risk_prefill_shortfall=s.risk.prefill_shortfall,
        risk_deferred=s.risk.deferred,
        ttft_at_risk=sum(
            r.first_token_at is None and now - r.call.arrived_at > bound for r in waiting
        ),
        tpot_infeasible=sorted(s.risk.tpot_infeasible),
        kv_used_tokens=s.table.kv_used(),
        kv_capacity_tokens=s.knobs.kv_capacity_tokens,
        sessions=[
            KVLocation(k[0], k[1], e.state, e.kv_len) for k, e in sorted(s.ledger.entries.items())
        ],
        measured_switch_s=s.switch_costs.view(),
        phase_totals_s=dict(s.phase_totals),
    )


def model_queue(s: ColdScheduler, model: str, now: float) -> ModelQueue:
    recs = s.table.waiting_records(model)
    running = sum(s.table.records[c].call.model == model for c in s.table.running)
    return ModelQueue(
        waiting=len(recs),
        sp_eligible=sum(map(s.sp_eligible, recs)) if s.slot and s.slot.model == model else 0,
        parked=sum(r.resumed for r in recs),
        running=running,
        oldest_wait_s=max((now - r.call.arrived_at for r in recs), default=0.0),
    )


def round_remaining_s(s: ColdScheduler, now: float) -> float:
    """Predicted time until the open round ends: this slot's remainder plus a slot and a switch for
    every other model with work that has not had its slot in this round yet."""
    rnd = s.rounds.current
    if rnd is None or s.slot is None:
        return 0.0
    pending = [m for m in s.models if m not in rnd.models and s.table.has_work(m)]
    rest = sum(s.slot.plan.budget_s + s.predicted_switch_s(m) for m in pending)
    return max(0.0, s.slot.remaining(now)) + rest


def queued_suffix_tokens(s: ColdScheduler, model: str) -> int:
    """Prompt tokens still to prefill for `model`'s waiting calls (reusable prefixes excluded)."""
    return sum(r.call.prompt_tokens - r.call.prefix_tokens for r in s.table.waiting_records(model))


def round_load_s(s: ColdScheduler) -> float:
    """Eq. (3) as far as it is known now, for the router's round-admission check: queued prefill
    work of every model plus the predicted switches among the models with work (the time left in
    an open slot's budget is not load, so it is not counted)."""
    busy = [m for m in s.models if s.table.has_work(m)]
    load = sum(s.profiles[m].prefill_s_per_token * queued_suffix_tokens(s, m) for m in busy)
    if s.mode == "time_shared" and len(busy) > 1:
        load += sum(s.predicted_switch_s(m) for m in busy)
    return load


def deadline_risk_share(s: ColdScheduler, window: int = 10) -> float:
    """Share of the last `window` closed rounds whose wall time overran gamma*T_TTFT (the router
    inflates the instance's predicted load by it)."""
    recent = list(islice(reversed(s.rounds.closed), window))
    bound = s.knobs.round_bound_s
    return sum(r.wall_s > bound + 1e-9 for r in recent) / len(recent) if recent else 0.0


def check_integrity(s: ColdScheduler) -> None:
    s.table.check_integrity()
    s.ledger.check_integrity()
    problems = []
    running_models = {s.table.records[c].call.model for c in s.table.running}
    if running_models - {s.active}:
        problems.append(f"running calls of {sorted(running_models)} while {s.active!r} is active")
    if len(s.table.running) > s.knobs.max_batch:
        problems.append(f"running batch {len(s.table.running)} > max_batch {s.knobs.max_batch}")
    if s.table.kv_used() > s.knobs.kv_capacity_tokens:
        problems.append(f"kv reserved {s.table.kv_used()} > capacity {s.knobs.kv_capacity_tokens}")
    if s.slot is not None and (s.slot.model != s.active or s.rounds.current is None):
        problems.append(
            f"slot of {s.slot.model!r} open while {s.active!r} is active or no round is open"
        )
    if s.mode == "pinned" and (s.rounds.closed or s.rounds.current or s.active != s.models[0]):
        problems.append("pinned mode opened a round or changed its model")
    stray = [c for c in getattr(s.in_flight, "call_ids", ()) if c not in s.table.running]
    if stray:
        problems.append(f"in-flight calls {stray} are not in the running batch")
    if s.slot is not None and set(s.slot.p_pending) - set(s.table.waiting[s.slot.model]):
        problems.append("P snapshot lists calls that are no longer waiting")
    if problems:
        raise RuntimeError("cold scheduler integrity: " + "; ".join(problems))
