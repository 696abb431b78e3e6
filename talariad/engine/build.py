"""Build an instance's worker and executor from the config."""

from __future__ import annotations

from talariad.config import InstanceConfig, TalariaConfig
from talariad.engine.executors import sim
from talariad.engine.worker import Worker
from talariad.types import LatencyProfile


def model_profile(cfg: TalariaConfig, model: str) -> LatencyProfile:
    """The latency profile placement and scheduling start from (instances refine it by measurement)."""
    name = cfg.model(model).profile or "tiny"
    if name not in sim.PROFILES:
        raise ValueError(f"model {model!r}: unknown sim profile {name!r} (known: {', '.join(sorted(sim.PROFILES))})")
    return sim.PROFILES[name]


def build_worker(cfg: TalariaConfig, inst: InstanceConfig) -> Worker:
    if inst.executor != "sim":
        raise ValueError(f"instance {inst.name!r}: executor {inst.executor!r} is not available in this build")
    profiles = {m: model_profile(cfg, m) for m in inst.models}
    return Worker(cfg, inst, sim.SimExecutor(profiles, inst.time_scale), profiles)
