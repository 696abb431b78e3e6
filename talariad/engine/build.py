"""Build an instance's worker and executor from the config (the same checks `check-config` runs)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from talariad.config import InstanceConfig, TalariaConfig
from talariad.engine.worker import Worker
from talariad.knobs import model_profile, profile_set
from talariad.perfmodel.memory import SimMemory, memory_spec
from talariad.perfmodel.model import SimModel

EXECUTOR_PACKAGES = {"torch": "torch"}
"""The Python package an executor needs installed (`sim` needs nothing beyond the core; `sglang`
runs SGLang as separate processes: its checks are `executors.sglang.checks`)."""


def executor_problem(executor: str, devices: object) -> tuple[str, str] | None:
    """(field, why) when this build cannot run `executor` on `devices`; None when it can."""
    package = EXECUTOR_PACKAGES.get(executor)
    if package is not None and importlib.util.find_spec(package) is None:
        return (
            "executor",
            f"executor {executor!r} needs the Python package {package!r}, which is not installed",
        )
    if executor == "torch" and isinstance(devices, list) and len(devices) > 1:
        return "devices", f"{devices}: the torch executor runs on one device (no tensor parallel)"
    if executor == "torch" and isinstance(devices, list) and devices:
        import torch  # only for a GPU group

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if max(devices) >= count:
            have = f"ids 0..{count - 1}" if count else "none"
            return "devices", f"{devices}: the torch executor sees {count} CUDA device(s) ({have})"
    return None


def build_executor(
    cfg: TalariaConfig, inst: InstanceConfig, profiles: dict, config_dir: Path | None = None
):
    problem = executor_problem(inst.executor, inst.devices)
    if problem is not None:
        raise ValueError(f"instance {inst.name!r}: {problem[0]}: {problem[1]}")
    if inst.executor == "sim":
        from talariad.engine.executors.sim import SimExecutor

        memory = SimMemory(
            memory_spec(profile_set(cfg, list(inst.models))),
            cfg.ablations.d2d,
            cfg.ablations.host_kv,
        )
        return SimExecutor(
            SimModel(profiles, memory, list(inst.models), pinned=inst.pool == "hot"),
            inst.time_scale,
        )
    if inst.executor == "sglang":
        from talariad.engine.executors.sglang.factory import build_sglang_executor

        return build_sglang_executor(cfg, inst, config_dir)
    from talariad.engine.executors.torch_engine.factory import (
        build_torch_executor,
    )  # torch only when used

    return build_torch_executor(cfg, inst, config_dir)


def build_worker(
    cfg: TalariaConfig, inst: InstanceConfig, config_dir: Path | None = None
) -> Worker:
    """config_dir: where relative model paths start (the config file's folder)."""
    profiles = {m: model_profile(cfg, m) for m in inst.models}
    return Worker(cfg, inst, build_executor(cfg, inst, profiles, config_dir), profiles)
