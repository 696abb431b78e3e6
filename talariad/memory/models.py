"""Model entries (pure): each model's parameters packed at aligned offsets of one byte image, the
same image in the host copy, the weight region and the staged chunks (App. D: after the first open
a model's post-processed layout replaces the raw one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from talariad.memory.kv_layout import KVLayout, dtype_bytes
from talariad.memory.layout import align_up

Shapes = dict[str, tuple[tuple[int, ...], str]]  # name -> (shape, dtype)


@dataclass(frozen=True, slots=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int
    nbytes: int


def pack_params(shapes: Shapes, alignment: int = 256) -> tuple[dict[str, ParamSpec], int]:
    """Lay parameters out in the given order; returns the specs and the image size in bytes."""
    specs, off = {}, 0
    for name, (shape, dtype) in shapes.items():
        if any(d < 0 for d in shape):
            raise ValueError(f"parameter {name!r} has a negative dimension in shape={shape}")
        n = dtype_bytes(dtype)
        for d in shape:
            n *= d
        specs[name] = ParamSpec(name, tuple(shape), dtype, off, n)
        off = align_up(off + n, alignment)
    return specs, off


@dataclass(slots=True)
class ModelEntry:
    name: str
    kv_layout: KVLayout
    params: dict[str, ParamSpec]
    nbytes: int
    host: (
        Any  # the host byte image (pinned on CUDA); the source of every H2D open and staging write
    )
    processed: bool = False
    captured: dict[str, int] | None = field(
        default=None
    )  # region addresses when graphs were captured
