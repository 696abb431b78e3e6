"""Copy plans between the device KV pool and HKVR slabs (App. C; pure).

A host block is one page in page-first form; the device side is the pool's own order (layer-first
or page-first), translated by the strides of each `ViewSpec`. `run_copies` merges what
`block_copies` plans page by page, so a save or restore issues a few large copies instead of one
strided fragment per (page, component). How the merge works: docs/internals.md.
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
            f"slab_bytes={slab_bytes} is smaller than one KV fragment ({layout.fragment_bytes} bytes)"
        )
    return per


def slabs_per_block(layout: KVLayout, slab_bytes: int) -> int:
    per = layers_per_slab(layout, slab_bytes)
    return len(layout.components) * -(-layout.num_layers // per)


def block_copies(
    geometry: KVGeometry, page: int, slabs: list[int], slab_bytes: int
) -> list[SlabCopy]:
    """The copies that move one page between the pool and its slabs (same list both ways)."""
    lay = geometry.layout
    per = layers_per_slab(lay, slab_bytes)
    runs = [
        (c, first, min(per, lay.num_layers - first))
        for c in range(len(lay.components))
        for first in range(0, lay.num_layers, per)
    ]
    if len(runs) != len(slabs):
        raise ValueError(f"block needs {len(runs)} slabs, got {len(slabs)}")
    return [
        SlabCopy(geometry.layers_spec(page, c, first, count), slab * slab_bytes)
        for (c, first, count), slab in zip(runs, slabs, strict=False)
    ]


@dataclass(frozen=True, slots=True)
class RunCopy:
    """`pages` pages of one copy shape: page k's device rows are `device` moved by k·`page_stride`
    bytes, its host bytes (contiguous, `device.nbytes`) start at `host_offset` + k·`host_stride`."""

    device: ViewSpec
    host_offset: int
    pages: int = 1
    page_stride: int = 0
    host_stride: int = 0


MAX_RUN_BYTES = 64 << 20  # a strided device side may be gathered into a temporary this large


def run_copies(
    geometry: KVGeometry, pages: list[int], slab_lists: list[list[int]], slab_bytes: int
) -> list[RunCopy]:
    """The copies that move `pages` (page i to or from the slabs in `slab_lists[i]`), merged.

    Pages join a run only while the host side stays one contiguous range, so every copy can be a
    single DMA from or into pinned host memory."""
    per_page = [
        _merge_adjacent(block_copies(geometry, page, slabs, slab_bytes))
        for page, slabs in zip(pages, slab_lists, strict=False)
    ]
    out: list[RunCopy] = []
    start = 0
    while start < len(per_page):
        first = per_page[start]
        end, dev_step = start + 1, 0
        if len(first) == 1:
            nbytes = first[0].device.nbytes
            while end < len(per_page) and (end - start + 1) * nbytes <= MAX_RUN_BYTES:
                step = _page_step(per_page[end - 1], per_page[end])
                if step is None or step[1] != nbytes or (dev_step and step[0] != dev_step):
                    break
                dev_step, end = step[0], end + 1
        out += [
            RunCopy(cp.device, cp.host_offset, end - start, dev_step, cp.device.nbytes)
            for cp in first
        ]
        start = end
    return out


def _merge_adjacent(copies: list[SlabCopy]) -> list[SlabCopy]:
    """Join copies whose rows continue each other on the device and whose host bytes are adjacent."""
    out: list[SlabCopy] = []
    for cp in copies:
        if out:
            last, d = out[-1], cp.device
            ld = last.device
            if (
                d.width == ld.width
                and d.stride == ld.stride
                and d.offset == ld.offset + ld.rows * ld.stride
                and cp.host_offset == last.host_offset + ld.nbytes
            ):
                out[-1] = SlabCopy(
                    ViewSpec(ld.offset, ld.rows + d.rows, ld.width, ld.stride), last.host_offset
                )
                continue
        out.append(cp)
    return out


def _page_step(prev: list[SlabCopy], cur: list[SlabCopy]) -> tuple[int, int] | None:
    """(device, host) byte steps from one page's copies to the next's when every copy moves alike
    (and forward: strided views cannot step backwards); None when they do not."""
    if len(prev) != len(cur) or not prev:
        return None
    dev_step = cur[0].device.offset - prev[0].device.offset
    host_step = cur[0].host_offset - prev[0].host_offset
    if dev_step <= 0 or host_step <= 0:
        return None
    for a, b in zip(prev, cur, strict=False):
        da, db = a.device, b.device
        if (
            (da.rows, da.width, da.stride) != (db.rows, db.width, db.stride)
            or db.offset - da.offset != dev_step
            or b.host_offset - a.host_offset != host_step
        ):
            return None
    return dev_step, host_step
