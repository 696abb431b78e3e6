import pytest

from talariad.memory import ChunkState, KVGeometry, KVLayout, StagingBitmap
from talariad.memory.pages import PageAllocator

LAY = KVLayout(
    num_layers=2, num_kv_heads=1, head_dim=8, page_size=4, dtype="float16", order="page_first"
)


def make(num_pages=32, chunk_rows=4, offset=0):
    geo = KVGeometry(LAY, offset, LAY.row_bytes * num_pages)
    pages = PageAllocator(num_pages)
    return geo, pages, StagingBitmap(geo, pages, chunk_rows * LAY.row_bytes)


def test_allocator_hands_out_low_addresses_first_and_skips_rows():
    pages = PageAllocator(8)
    assert pages.allocate("s", 3) == [0, 1, 2]
    assert pages.allocate("t", 2, skip=frozenset({3, 4})) == [5, 6]
    pages.free([1])
    assert pages.allocate("u", 2) == [1, 3]
    assert pages.allocate("v", 3) is None
    pages.check_integrity()


def test_staging_fills_high_slots_and_dirty_on_overlap():
    geo, pages, st = make()
    st.target("next", 3 * st.chunk_bytes - 10, weight_end=0)
    writes = [st.next_write() for _ in range(3)]
    assert [w.first_row for w in writes] == [28, 24, 20]  # high tail first
    assert st.blocked_rows() == frozenset(range(20, 32))
    for w in writes:
        st.complete_write(w.index)
    assert pages.allocate("s", 22) is not None  # takes rows 0..21 -> overlaps slot at 20
    dirtied = st.on_rows_allocated(list(range(22)))
    assert (
        dirtied == [2] and st.chunks[2].state is ChunkState.DIRTY and st.chunks[2].first_row is None
    )
    plan = st.gather_plan()
    assert [c.index for c in plan.d2d] == [0, 1] and [c.index for c in plan.h2d] == [2]
    assert plan.dirty_bytes == st.chunks[2].nbytes
    st.check_integrity()


def test_gather_plan_waits_for_writes_and_writing_rows_are_skipped():
    geo, pages, st = make()
    st.target("next", st.chunk_bytes, weight_end=0)
    w = st.next_write()
    assert st.gather_plan() is None
    got = pages.allocate("s", 30, skip=st.blocked_rows())
    assert got is None  # only 28 rows are outside the write
    assert pages.allocate("s", 28, skip=st.blocked_rows()) == list(range(28))
    st.complete_write(w.index)
    assert st.gather_plan().staged_bytes == st.chunk_bytes


def test_slots_never_start_below_the_target_weight_end():
    geo, pages, st = make(offset=0)
    st.target("next", 10 * st.chunk_bytes, weight_end=geo.offset + 20 * LAY.row_bytes)
    firsts = []
    while (w := st.next_write()) is not None:
        firsts.append(w.first_row)
    assert firsts == [28, 24, 20]


def test_slack_counts_free_slots_capped_by_need():
    geo, pages, st = make()
    assert st.slack_bytes() == 8 * st.chunk_bytes
    pages.allocate("s", 5)
    assert st.slack_bytes() == 6 * st.chunk_bytes
    st.target("next", st.chunk_bytes + 1, weight_end=0)
    assert st.slack_bytes() == st.chunk_bytes + 1


def test_chunk_bytes_must_be_positive():
    geo = KVGeometry(LAY, 0, LAY.row_bytes)
    with pytest.raises(ValueError, match="chunk_bytes"):
        StagingBitmap(geo, PageAllocator(1), 0)
