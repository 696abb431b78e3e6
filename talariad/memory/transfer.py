"""Copy plans between the device KV pool and HKVR slabs (App. C; pure).

A host block is one page in page-first form: per component, whole layer fragments packed into
slabs. The device side is the pool's own order (layer-first or page-first), so the same registry
view is translated to either device layout by the strides of each `ViewSpec`.
"""

from __future__ import annotations

from dataclasses import dataclass

from talariad.memory.kv_layout import KVGeometry, KVLayout, ViewSpec


@dataclass(frozen=True, slots=True)
class SlabCopy:
    """One copy between a device view and `spec.nbytes` contiguous host bytes at `host_offset`."""

    device: ViewSpec
    host_offset: int


def layers_per_slab(layout: KVLayout, slab_bytes: int) -> int:
    per = slab_bytes // layout.fragment_bytes
    if per < 1:
        raise ValueError(
            f"slab_bytes={slab_bytes} is smaller than one KV fragment ({layout.fragment_bytes} bytes)")
    return per


def slabs_per_block(layout: KVLayout, slab_bytes: int) -> int:
    per = layers_per_slab(layout, slab_bytes)
    return len(layout.components) * -(-layout.num_layers // per)


def block_copies(geometry: KVGeometry, page: int, slabs: list[int], slab_bytes: int) -> list[SlabCopy]:
    """The copies that move one page between the pool and its slabs (same list both ways)."""
    lay = geometry.layout
    per = layers_per_slab(lay, slab_bytes)
    runs = [(c, first, min(per, lay.num_layers - first))
            for c in range(len(lay.components)) for first in range(0, lay.num_layers, per)]
    if len(runs) != len(slabs):
        raise ValueError(f"block needs {len(runs)} slabs, got {len(slabs)}")
    return [SlabCopy(geometry.layers_spec(page, c, first, count), slab * slab_bytes)
            for (c, first, count), slab in zip(runs, slabs)]
