"""Merged HKVR copies (`run_copies`) move exactly the bytes the page-by-page plan (`block_copies`)
moves, in far fewer copies when pages and slabs are consecutive."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from talariad.memory.kv_layout import KVGeometry, KVLayout
from talariad.memory.transfer import block_copies, run_copies, slabs_per_block


def _plan(lay: KVLayout, pages_n: int, slab_fit: int):
    slab_bytes = lay.fragment_bytes * slab_fit
    geo = KVGeometry(lay, 64, pages_n * lay.row_bytes)
    return geo, slab_bytes


layouts = st.builds(
    KVLayout,
    num_layers=st.integers(1, 6),
    num_kv_heads=st.integers(1, 2),
    head_dim=st.sampled_from([2, 4]),
    page_size=st.sampled_from([1, 2]),
    dtype=st.just("float16"),
    family=st.sampled_from(["mha", "mla"]),
    order=st.sampled_from(["layer_first", "page_first"]),
)


def _host_bytes(geo: KVGeometry, buf: torch.Tensor, copies, host_size: int, merged: bool) -> bytes:
    host = torch.zeros(host_size, dtype=torch.uint8)
    for cp in copies:
        spec = cp.device
        if merged:
            shape, n = (cp.pages, spec.rows, spec.width), cp.pages
            src = buf.as_strided(shape, (cp.page_stride, spec.stride, 1), spec.offset)
            dst = host.as_strided(shape, (cp.host_stride, spec.width, 1), cp.host_offset)
            assert (
                n == 1 or cp.host_stride == spec.nbytes
            )  # the host side stays one contiguous range
        else:
            src = buf.as_strided((spec.rows, spec.width), (spec.stride, 1), spec.offset)
            dst = host.as_strided((spec.rows, spec.width), (spec.width, 1), cp.host_offset)
        dst.copy_(src)
    return host.numpy().tobytes()


@settings(max_examples=80, deadline=None)
@given(layouts, st.integers(2, 12), st.integers(1, 7), st.data())
def test_merged_runs_move_the_same_bytes_as_page_by_page(lay, pages_n, slab_fit, data):
    geo, slab_bytes = _plan(lay, pages_n, slab_fit)
    per_block = slabs_per_block(lay, slab_bytes)
    n = data.draw(st.integers(1, pages_n))
    pages = data.draw(
        st.one_of(
            st.just(list(range(n))),  # a run, the common case
            st.lists(st.integers(0, pages_n - 1), min_size=1, max_size=n, unique=True),
        )
    )
    free = list(range(per_block * len(pages) + 4))
    if data.draw(st.booleans()):
        free = data.draw(st.permutations(free))
    slabs = [free[i * per_block : (i + 1) * per_block] for i in range(len(pages))]
    buf = torch.arange(geo.offset + geo.nbytes, dtype=torch.int64).remainder(251).to(torch.uint8)
    size = len(free) * slab_bytes
    plain = [
        cp for p, s in zip(pages, slabs, strict=False) for cp in block_copies(geo, p, s, slab_bytes)
    ]
    merged = run_copies(geo, pages, slabs, slab_bytes)
    assert _host_bytes(geo, buf, merged, size, True) == _host_bytes(geo, buf, plain, size, False)
    assert sum(cp.pages * cp.device.nbytes for cp in merged) == sum(
        cp.device.nbytes for cp in plain
    )


def test_consecutive_pages_in_consecutive_slabs_become_one_copy_per_layout():
    for order in ("layer_first", "page_first"):
        lay = KVLayout(num_layers=4, num_kv_heads=2, head_dim=8, page_size=4, order=order)
        geo = KVGeometry(lay, 0, 32 * lay.row_bytes)
        per_block = slabs_per_block(lay, lay.component_bytes)
        slabs = [list(range(i * per_block, (i + 1) * per_block)) for i in range(10)]
        merged = run_copies(geo, list(range(3, 13)), slabs, lay.component_bytes)
        assert len(merged) == 1 and merged[0].pages == 10  # 20 strided fragments before
