"""Build an instance's worker and executor from the config."""

from __future__ import annotations

from pathlib import Path

from talariad.config import InstanceConfig, TalariaConfig
from talariad.engine.executors import sim
from talariad.sim.profiles import available, named_profile
from talariad.engine.worker import Worker
from talariad.types import LatencyProfile


def model_profile(cfg: TalariaConfig, model: str) -> LatencyProfile:
    """The latency profile placement and scheduling start from (instances refine it by measurement)."""
    name = cfg.model(model).profile or "tiny"
    found = named_profile(name)
    if found is None:
        raise ValueError(f"model {model!r}: no bundled latency profile named {name!r} (sets: {', '.join(available())})")
    return found


def build_executor(cfg: TalariaConfig, inst: InstanceConfig, profiles: dict, config_dir: Path | None = None):
    if inst.executor == "sim":
        return sim.SimExecutor(profiles, inst.time_scale)
    if inst.executor == "torch":
        from talariad.engine.executors.torch_engine.factory import build_torch_executor  # torch only when used

        return build_torch_executor(cfg, inst, config_dir)
    raise ValueError(f"instance {inst.name!r}: executor {inst.executor!r} is not available in this build")


def build_worker(cfg: TalariaConfig, inst: InstanceConfig, config_dir: Path | None = None) -> Worker:
    """config_dir: where relative model paths start (the config file's folder)."""
    profiles = {m: model_profile(cfg, m) for m in inst.models}
    return Worker(cfg, inst, build_executor(cfg, inst, profiles, config_dir), profiles)
