"""Named simulator configurations: box layout + router policy/knobs + scheduler knobs, all built
from one profile set (no per-trace tuning).

Suites:
- `ablations`: the §5.1 fixed-replay box, one TP=8 cold instance time-sharing every model, under
  Talaria, no-SP, no-HKVR, H2D-only and Round-only (`cold_sched.ablation`). The router is the full
  Talaria router; with one instance there is nowhere else to go, so its overload mode is "spill"
  (the instance's own rounds do admission) rather than holding calls at the gateway.
- `router`: §5.3, two cold workers that may each host every model, every registered router
  policy, at low/medium/high offered load (sessions start every 30 / 10 / 2 s), models opened on
  demand (no prewarm: opens are the metric). The bundled profiles are the TP=8 ones; the paper's
  TP=4 testbed ran 32B-class models that have no profile here, so this suite reuses the TP=8
  profiles on two instances (an assumption, stated in the report).
- `tau`: §5.4, the Talaria router on the router box at medium load with τ in 0, 0.5, 1, 2, 5 s
  (the lease lifetime and the scheduler's matching slot hold `sp_hold_s`, as the daemon sets).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from talariad.cold_sched import SchedKnobs, ablation
from talariad.router import POLICIES, RouterKnobs
from talariad.sim.memory import MEM_FRACTION, MemorySpec
from talariad.sim.profiles import ProfileSet
from talariad.types import Pool

ABLATIONS = {"Talaria": "talaria", "no-SP": "no-sp", "no-HKVR": "no-hkvr", "H2D-only": "h2d-only",
             "Round-only": "round-only"}
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
    sched: SchedKnobs = SchedKnobs()
    router: RouterKnobs = RouterKnobs()
    policy: str = "talaria"
    start_interval_s: float = 0.0  # session i starts at i * interval
    prewarm: bool = True
    heartbeat_s: float = 0.25  # telemetry period (virtual seconds)
    load: str | None = None  # labels for the report and plots
    tau_s: float | None = None

    def __post_init__(self) -> None:
        if not self.instances:
            raise ValueError(f"config {self.name!r}: instances must not be empty")
        if self.heartbeat_s <= 0:
            raise ValueError(f"config {self.name!r}: heartbeat_s must be > 0, got {self.heartbeat_s}")
        if self.start_interval_s < 0:
            raise ValueError(f"config {self.name!r}: start_interval_s must be >= 0")
        POLICIES.get(self.policy)  # ValueError naming the valid policies


def memory_spec(pset: ProfileSet) -> MemorySpec:
    """Per-GPU managed HBM and the host KV arena (host memory minus every model's host weights)."""
    box = pset.box
    weights = {m: s.weight_bytes_per_gpu or s.profile.weight_bytes for m, s in pset.models.items()}
    kv = {m: s.kv_bytes_per_token_per_gpu or s.profile.kv_bytes_per_token for m, s in pset.models.items()}
    host_kv = box.host_memory_bytes - box.tp * sum(weights.values())
    return MemorySpec(int(box.hbm_per_gpu_bytes * MEM_FRACTION), max(host_kv, 0), box.tp,
                      box.h2d_bytes_per_s, weights, kv)


def base_knobs(pset: ProfileSet, models: tuple[str, ...], tau_s: float = 1.0) -> SchedKnobs:
    """Scheduler knobs from the box: device KV capacity in tokens for the tightest model."""
    spec = memory_spec(pset)
    caps = [(spec.hbm_bytes - spec.weight_bytes[m]) // spec.kv_bytes_per_token[m]
            for m in models if spec.kv_bytes_per_token.get(m)]
    cap = int(min(caps)) if caps else SchedKnobs().kv_capacity_tokens
    return SchedKnobs(kv_capacity_tokens=max(cap, 1), sp_hold_s=tau_s)


def ablation_configs(pset: ProfileSet, models: tuple[str, ...]) -> list[SimConfig]:
    box = (InstanceSpec("tp8", models),)
    base = base_knobs(pset, models)
    router = RouterKnobs(overload="spill")
    return [SimConfig(name, box, ablation(key, base), router) for name, key in ABLATIONS.items()]


def router_box(models: tuple[str, ...]) -> tuple[InstanceSpec, ...]:
    return (InstanceSpec("w0", models), InstanceSpec("w1", models))


def policy_order() -> list[str]:
    return [*FIRST_POLICIES, *(p for p in POLICIES.names() if p not in FIRST_POLICIES)]


def router_configs(pset: ProfileSet, models: tuple[str, ...]) -> list[SimConfig]:
    knobs = base_knobs(pset, models)
    return [SimConfig(f"{policy}@{load}", router_box(models), knobs, RouterKnobs(), policy,
                      interval, prewarm=False, load=load)
            for load, interval in LOADS.items() for policy in policy_order()]


def tau_configs(pset: ProfileSet, models: tuple[str, ...]) -> list[SimConfig]:
    return [SimConfig(f"tau={tau:g}s", router_box(models), base_knobs(pset, models, tau),
                      RouterKnobs(tau_s=tau), "talaria", LOADS["medium"], prewarm=False, tau_s=tau)
            for tau in TAUS]


def suite(name: str, pset: ProfileSet, models: tuple[str, ...]) -> list[SimConfig]:
    builders = {"ablations": ablation_configs, "router": router_configs, "tau": tau_configs}
    if name not in builders:
        raise ValueError(f"unknown suite {name!r}; choose from {SUITES} or 'all'")
    return builders[name](pset, models)


def with_knobs(cfg: SimConfig, **changes) -> SimConfig:
    """A copy with scheduler knobs changed (tests and what-if runs)."""
    return dataclasses.replace(cfg, sched=dataclasses.replace(cfg.sched, **changes))
