"""The one mapping from an operator's config (`talaria.yaml`) to what the cores run with: the
router's and the scheduler's knobs, each model's latency profile, and a `sim` instance's memory.
The daemon, its instance processes and the simulator (`compare --config`) all build from here, so
a policy knob means the same in production and in simulation.
"""

from __future__ import annotations

import dataclasses

from talariad.cold_sched import SchedKnobs
from talariad.config import AblationConfig, PlannerConfig, PolicyConfig, TalariaConfig
from talariad.perfmodel.profiles import ModelSpec, ProfileSet, available, find_model
from talariad.planner import PlannerKnobs
from talariad.router import RouterKnobs
from talariad.types import LatencyProfile

DEFAULT_PROFILE = "tiny"


def router_knobs(policy: PolicyConfig, ablations: AblationConfig, **overrides) -> RouterKnobs:
    p, a = policy, ablations
    knobs = RouterKnobs(
        tau_s=p.tau_s if a.reservations else 0.0,
        gamma=p.gamma,
        ttft_target_s=p.ttft_target_s,
        admission_unit_s=p.admission_unit_s,
        replica_penalty_s=p.replica_penalty_s,
        retire_window_s=p.retire_window_s,
        staleness_s=p.staleness_s,
        heartbeat_s=heartbeat_s(p),
        overload=p.overload,
        queue_limit=p.queue_limit,
        queue_timeout_s=p.queue_timeout_s,
        reservations=a.reservations,
        residency_terms=a.residency_terms,
        session_idle_s=p.session_idle_s,
        max_sessions=p.max_sessions,
    )
    return dataclasses.replace(knobs, **overrides) if overrides else knobs


def heartbeat_s(p: PolicyConfig) -> float:
    """Silence after which an instance counts as having missed its heartbeat: the staleness bound,
    and at least three telemetry polls."""
    return max(p.staleness_s, 3 * p.telemetry_interval_s)


def sched_knobs(
    policy: PolicyConfig,
    ablations: AblationConfig,
    kv_capacity_tokens: int | None = None,
    **overrides,
) -> SchedKnobs:
    """The slot hold follows the lease lifetime τ: a slot waits for returns as long as leases
    do."""
    p, a = policy, ablations
    knobs = SchedKnobs(
        gamma=p.gamma,
        ttft_target_s=p.ttft_target_s,
        tpot_target_s=p.tpot_target_s,
        sp=a.sp,
        host_kv=a.host_kv,
        d2d=a.d2d,
        sp_hold_s=p.tau_s,
    )
    if kv_capacity_tokens:
        overrides["kv_capacity_tokens"] = kv_capacity_tokens
    return dataclasses.replace(knobs, **overrides) if overrides else knobs


def config_router_knobs(cfg: TalariaConfig) -> RouterKnobs:
    return router_knobs(cfg.policy, cfg.ablations)


def config_sched_knobs(cfg: TalariaConfig, kv_capacity_tokens: int | None = None) -> SchedKnobs:
    return sched_knobs(cfg.policy, cfg.ablations, kv_capacity_tokens)


# ---- profiles and memory --------------------------------------------------------------------


def model_spec(cfg: TalariaConfig, model: str) -> tuple[ProfileSet, ModelSpec]:
    """The bundled profile a config model names (`profile:`, default `tiny`), with its set's box;
    ValueError naming the bundled sets when there is none."""
    name = cfg.model(model).profile or DEFAULT_PROFILE
    found = find_model(name)
    if found is None:
        raise ValueError(
            f"model {model!r}: no bundled latency profile named {name!r} "
            f"(sets: {', '.join(available())})"
        )
    return found


def model_profile(cfg: TalariaConfig, model: str) -> LatencyProfile:
    """The latency profile placement and scheduling start from (refined by measurement)."""
    return model_spec(cfg, model)[1].profile


def profile_set(cfg: TalariaConfig, models: list[str]) -> ProfileSet:
    """The named profiles of `models` as one set, on the box of the first one's set."""
    specs = {m: model_spec(cfg, m) for m in models}
    box = specs[models[0]][0].box
    return ProfileSet(
        "config", box, {m: dataclasses.replace(spec, name=m) for m, (_, spec) in specs.items()}
    )


def planner_knobs(planner: PlannerConfig, policy: PolicyConfig) -> PlannerKnobs:
    """The planner's knobs; its round cap is the scheduler's round bound γ·T_TTFT (Eq. 5)."""
    return PlannerKnobs(
        window_s=planner.window_s,
        smoothing=planner.smoothing,
        persistence=planner.persistence,
        horizon_s=planner.horizon_s,
        margin=planner.margin,
        min_gain=planner.min_gain,
        dwell_s=planner.dwell_s,
        warmup_windows=planner.warmup_windows,
        round_cap_s=policy.gamma * policy.ttft_target_s,
    )
