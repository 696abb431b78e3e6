"""Build a torch instance's executor from the config: device, substrate sizes, hosted models."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from talariad.config import InstanceConfig, TalariaConfig
from talariad.engine.executors.torch_engine.hosted import HostedModel, load_hosted
from talariad.engine.executors.torch_exec import TorchExecutor
from talariad.engine.model.tokenizer import FALLBACK_CHAT_TEMPLATE
from talariad.memory import Substrate, SubstrateConfig
from talariad.memory.layout import align_up
from talariad.memory.torch_device import TorchDevice
from talariad.modelfiles import CHATML_TOOLS, resolve_model_path

PAGE_SIZE = 16
MIB = 1 << 20


def instance_device(inst: InstanceConfig) -> str:
    if inst.devices == "cpu":
        return "cpu"
    if len(inst.devices) != 1:
        raise ValueError(
            f"instance {inst.name!r}: devices: the torch executor runs on one device "
            f"(no tensor parallelism), got {inst.devices}"
        )
    if not torch.cuda.is_available() or inst.devices[0] >= torch.cuda.device_count():
        raise ValueError(
            f"instance {inst.name!r}: devices: CUDA device {inst.devices[0]} is not available"
        )
    return f"cuda:{inst.devices[0]}"


def load_models(
    cfg: TalariaConfig,
    inst: InstanceConfig,
    device: str,
    config_dir: Path | None,
    dtype: torch.dtype | None = None,
) -> dict[str, HostedModel]:
    """`dtype` overrides every model's own `dtype`."""
    out = {}
    for name in inst.models:
        spec = cfg.model(name)
        path = None if spec.path is None else resolve_model_path(spec.path, config_dir)
        out[name] = load_hosted(
            name,
            path=path,
            profile=spec.profile,
            seed=spec.seed,
            device=device,
            dtype=dtype or (spec.dtype and getattr(torch, spec.dtype)),
            chat_template=chat_template_text(spec.chat_template, config_dir),
        )
    return out


def chat_template_text(template: str | None, config_dir: Path | None) -> str | None:
    """A model's `chat_template` setting as template text (None: the model's own)."""
    if template is None:
        return None
    if template == CHATML_TOOLS:
        return FALLBACK_CHAT_TEMPLATE
    return ((config_dir or Path.cwd()) / template).read_text()


def substrate_config(
    cfg: TalariaConfig, inst: InstanceConfig, device: str, models: dict[str, HostedModel]
) -> SubstrateConfig:
    weights = max(_nbytes(m) for m in models.values())
    if inst.memory_gib is not None:
        capacity = int(inst.memory_gib * (1 << 30))
    elif device == "cpu":
        capacity = 2 * weights + 128 * MIB
    else:
        capacity = int(
            cfg.policy.mem_fraction_bump * torch.cuda.mem_get_info(torch.device(device))[0]
        )
    component = max(m.kv_layout(PAGE_SIZE).component_bytes for m in models.values())
    return SubstrateConfig(
        capacity_bytes=align_up(capacity, 256),
        host_kv_bytes=int(inst.host_kv_gib * (1 << 30)),
        slab_bytes=align_up(component, 256),
        chunk_bytes=(1 if device == "cpu" else 64) * MIB,
    )


def _nbytes(model: HostedModel) -> int:
    return sum(align_up(t.numel() * t.element_size(), 256) for t in model.params.values())


def build_substrate(
    cfg: TalariaConfig, inst: InstanceConfig, device: str, models: dict[str, HostedModel]
) -> Substrate:
    config = substrate_config(cfg, inst, device, models)
    if config.capacity_bytes < 2 * max(_nbytes(m) for m in models.values()):
        raise ValueError(
            f"instance {inst.name!r}: memory_gib is too small for its largest model's weights"
        )
    return Substrate(TorchDevice(device), config)


def build_torch_executor(
    cfg: TalariaConfig,
    inst: InstanceConfig,
    config_dir: Path | None = None,
    dtype: torch.dtype | None = None,
) -> TorchExecutor:
    """The executor of a `torch` instance of the config (weights loaded, hot model opened)."""
    device = instance_device(inst)
    models = load_models(cfg, inst, device, config_dir, dtype)
    substrate = build_substrate(cfg, inst, device, models)
    executor = TorchExecutor(
        substrate,
        models,
        page_size=PAGE_SIZE,
        host_kv=cfg.ablations.host_kv,
        d2d=cfg.ablations.d2d,
        pinned=inst.pool == "hot",
        threads=inst.torch_threads,
    )
    trim_heap()
    return executor


def trim_heap() -> None:
    """Hand the heap pages freed while loading back to the OS. glibc keeps them otherwise: the
    float32 copies a GGUF is dequantized through stayed resident for a bfloat16 SmolLM2
    (742 MiB against 520 MiB after the trim)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim this way
        pass
