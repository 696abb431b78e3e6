"""Build an `executor: sglang` instance's executor from the config (no torch, no sglang import)."""

from __future__ import annotations

from pathlib import Path

from talariad.config import InstanceConfig, TalariaConfig
from talariad.engine.executors.sglang.executor import GIB, Hosted, SGLangExecutor
from talariad.engine.model.tokenizer import TextTokenizer


def nvml_probe(devices: list[int]):
    """Free bytes on the fullest GPU of the group (NVML indexes), or None where NVML cannot say."""
    handles: list | None = None

    def free() -> int | None:
        nonlocal handles
        try:
            import pynvml

            if handles is None:
                pynvml.nvmlInit()
                handles = [pynvml.nvmlDeviceGetHandleByIndex(d) for d in devices]
            return min(pynvml.nvmlDeviceGetMemoryInfo(h).free for h in handles) if handles else None
        except Exception:  # no driver or no such device (pynvml raises NVMLError_*): cannot measure
            return None

    return free


def build_sglang_executor(
    cfg: TalariaConfig, inst: InstanceConfig, config_dir: Path | None, probe=None
) -> SGLangExecutor:
    hosted = {}
    for name in inst.models:
        spec = cfg.model(name)
        if spec.path is None:
            raise ValueError(
                f"model {name!r}: the sglang executor needs `path:` (the checkpoint directory)"
            )
        path = (config_dir or Path.cwd()) / spec.path
        hosted[name] = Hosted(
            name, str(path), TextTokenizer.from_dir(path), int(spec.size_gib * GIB)
        )
    devices = [] if inst.devices == "cpu" else list(inst.devices)
    storage = inst.pool == "cold" and inst.sglang.kv_host == "storage" and cfg.ablations.host_kv
    return SGLangExecutor(
        inst,
        hosted,
        ready_timeout_s=cfg.supervisor.ready_timeout_s,
        stop_timeout_s=cfg.supervisor.stop_timeout_s,
        probe=probe or nvml_probe(devices),
        host_kv=storage,
    )
