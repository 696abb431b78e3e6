"""Named simulator configurations: box layout + router policy/knobs + scheduler knobs, all built
from one profile set (no per-trace tuning).

Suites: `ablations` (§5.1: one TP=8 cold instance, the `cold_sched.ablation` variants and a
fair-share reference), `router` (§5.3: two cold workers, every registered router policy, low /
medium / high load, models opened on demand), `tau` (§5.4: the Talaria router at medium load
with τ in 0, 0.5, 1, 2, 5 s). Design: docs/internals.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from talariad.cold_sched import SchedKnobs, ablation
from talariad.config import AblationConfig, PolicyConfig, TalariaConfig
from talariad.knobs import (
    config_router_knobs,
    config_sched_knobs,
    profile_set,
    router_knobs,
    sched_knobs,
)
from talariad.perfmodel.memory import memory_spec
from talariad.perfmodel.profiles import ProfileSet
from talariad.router import POLICIES, RouterKnobs
from talariad.types import Pool

ABLATION_NAMES = {
    "Talaria": "talaria",
    "no-SP": "no-sp",
    "no-HKVR": "no-hkvr",
    "H2D-only": "h2d-only",
    "Round-only": "round-only",
}
LOADS = {"low": 30.0, "medium": 10.0, "high": 2.0}  # seconds between session starts
TAUS = (0.0, 0.5, 1.0, 2.0, 5.0)
FIRST_POLICIES = ("talaria", "least-pressure", "session-sticky")
SUITES = ("ablations", "router", "tau")


@dataclass(frozen=True)
class InstanceSpec:
    name: str
    models: tuple[str, ...]
    pool: Pool = Pool.COLD

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError(f"instance {self.name!r}: models must not be empty")
        if self.pool is Pool.HOT and len(self.models) != 1:
            raise ValueError(f"instance {self.name!r}: a hot instance pins exactly one model")


@dataclass(frozen=True)
class SimConfig:
    name: str
    instances: tuple[InstanceSpec, ...]
    sched: SchedKnobs = sched_knobs(PolicyConfig(), AblationConfig())
    router: RouterKnobs = router_knobs(PolicyConfig(), AblationConfig())
    policy: str = "talaria"
    start_interval_s: float = 0.0  # session i starts at i * interval
    prewarm: bool = True
    heartbeat_s: float = 0.25  # telemetry period (virtual seconds)
    load: str | None = None  # labels for the report and plots
    tau_s: float | None = None
    overhead_free: bool = False
    """The fair-share reference: the same scheduler with zero switch, open and restore cost and
    unlimited device and host KV (what multiplexing alone costs, with no mechanism overhead)."""

    def __post_init__(self) -> None:
        if not self.instances:
            raise ValueError(f"config {self.name!r}: instances must not be empty")
        if self.heartbeat_s <= 0:
            raise ValueError(
                f"config {self.name!r}: heartbeat_s must be > 0, got {self.heartbeat_s}"
            )
        if self.start_interval_s < 0:
            raise ValueError(f"config {self.name!r}: start_interval_s must be >= 0")
        POLICIES.get(self.policy)  # ValueError naming the valid policies


def kv_capacity_tokens(pset: ProfileSet, models) -> int | None:
    """Device KV capacity in tokens for the tightest model (None: the profiles carry no KV size)."""
    spec = memory_spec(pset)
    caps = [
        (spec.hbm_bytes - spec.weight_bytes[m]) // spec.kv_bytes_per_token[m]
        for m in models
        if spec.kv_bytes_per_token.get(m)
    ]
    return max(int(min(caps)), 1) if caps else None


def base_knobs(pset: ProfileSet, models: tuple[str, ...], tau_s: float = 1.0) -> SchedKnobs:
    """Scheduler knobs of the default policy on the box (the config defaults, as the daemon's)."""
    capacity = kv_capacity_tokens(pset, models)
    return sched_knobs(PolicyConfig(tau_s=tau_s), AblationConfig(), capacity)


FAIR_SHARE = "fair-share"


def ablation_configs(pset: ProfileSet, models: tuple[str, ...]) -> list[SimConfig]:
    box = (InstanceSpec("tp8", models),)
    base = base_knobs(pset, models)
    router = router_knobs(PolicyConfig(), AblationConfig(), overload="spill")
    rows = [
        SimConfig(name, box, ablation(key, base), router) for name, key in ABLATION_NAMES.items()
    ]
    unlimited = dataclasses.replace(ablation("talaria", base), kv_capacity_tokens=1 << 40)
    return [*rows, SimConfig(FAIR_SHARE, box, unlimited, router, overhead_free=True)]


def router_box(models: tuple[str, ...]) -> tuple[InstanceSpec, ...]:
    return (InstanceSpec("w0", models), InstanceSpec("w1", models))


def policy_order() -> list[str]:
    return [*FIRST_POLICIES, *(p for p in POLICIES.names() if p not in FIRST_POLICIES)]


def router_configs(pset: ProfileSet, models: tuple[str, ...]) -> list[SimConfig]:
    knobs = base_knobs(pset, models)
    router = router_knobs(PolicyConfig(), AblationConfig())
    return [
        SimConfig(
            f"{policy}@{load}",
            router_box(models),
            knobs,
            router,
            policy,
            interval,
            prewarm=False,
            load=load,
        )
        for load, interval in LOADS.items()
        for policy in policy_order()
    ]


def tau_configs(pset: ProfileSet, models: tuple[str, ...]) -> list[SimConfig]:
    return [
        SimConfig(
            f"tau={tau:g}s",
            router_box(models),
            base_knobs(pset, models, tau),
            router_knobs(PolicyConfig(tau_s=tau), AblationConfig()),
            "talaria",
            LOADS["medium"],
            prewarm=False,
            tau_s=tau,
        )
        for tau in TAUS
    ]


def suite(name: str, pset: ProfileSet, models: tuple[str, ...]) -> list[SimConfig]:
    builders = {"ablations": ablation_configs, "router": router_configs, "tau": tau_configs}
    if name not in builders:
        raise ValueError(f"unknown suite {name!r}; choose from {SUITES} or 'all'")
    return builders[name](pset, models)


def with_knobs(cfg: SimConfig, **changes) -> SimConfig:
    """A copy with scheduler knobs changed (tests and what-if runs)."""
    return dataclasses.replace(cfg, sched=dataclasses.replace(cfg.sched, **changes))


# ---- an operator's config ---------------------------------------------------------------------


def config_box(cfg: TalariaConfig) -> tuple[InstanceSpec, ...]:
    return tuple(InstanceSpec(i.name, tuple(i.models), Pool(i.pool)) for i in cfg.instances)


def from_config(cfg: TalariaConfig, suite_name: str) -> tuple[list[SimConfig], ProfileSet]:
    """A suite over exactly the config's instances, models, pools and policy knobs, with the latency
    profiles its models name (ablations: the config's knobs with the §5.1 switches flipped)."""
    models = [m.name for m in cfg.models]
    pset = profile_set(cfg, models)
    base = config_sched_knobs(cfg, kv_capacity_tokens(pset, models))
    router, box, beat = config_router_knobs(cfg), config_box(cfg), cfg.policy.telemetry_interval_s
    if suite_name == "ablations":
        rows = [
            SimConfig(name, box, ablation(key, base), router, cfg.policy.router, heartbeat_s=beat)
            for name, key in ABLATION_NAMES.items()
        ]
        unlimited = dataclasses.replace(ablation("talaria", base), kv_capacity_tokens=1 << 40)
        fair = SimConfig(
            FAIR_SHARE,
            box,
            unlimited,
            router,
            cfg.policy.router,
            heartbeat_s=beat,
            overhead_free=True,
        )
        return [*rows, fair], pset
    if suite_name == "router":
        return [
            SimConfig(
                f"{policy}@{load}",
                box,
                base,
                router,
                policy,
                interval,
                prewarm=False,
                heartbeat_s=beat,
                load=load,
            )
            for load, interval in LOADS.items()
            for policy in policy_order()
        ], pset
    if suite_name == "tau":
        return [
            SimConfig(
                f"tau={tau:g}s",
                box,
                dataclasses.replace(base, sp_hold_s=tau),
                dataclasses.replace(router, tau_s=tau),
                cfg.policy.router,
                LOADS["medium"],
                prewarm=False,
                heartbeat_s=beat,
                tau_s=tau,
            )
            for tau in TAUS
        ], pset
    raise ValueError(f"unknown suite {suite_name!r}; choose from {SUITES} or 'all'")


def config_models(cfg: TalariaConfig) -> list[str]:
    """Models the config's instances serve, in order of first appearance."""
    return list(dict.fromkeys(m for i in cfg.instances for m in i.models))


def map_models(trace_models: list[str], served: list[str]) -> dict[str, str]:
    """Trace model -> served model: a served model keeps its name; the others take the remaining
    served models in order (cycling), as the paper maps its large models onto the router
    testbed's (§5.1)."""
    spare = [m for m in served if m not in trace_models] or served
    out, k = {}, 0
    for m in trace_models:
        if m in served:
            out[m] = m
        else:
            out[m], k = spare[k % len(spare)], k + 1
    return out
