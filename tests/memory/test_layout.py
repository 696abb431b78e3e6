import pytest

from talariad.memory import BumpLayout, KVGeometry, KVLayout
from talariad.memory.kv_layout import take_bytes


def test_regions_tile_the_buffer_and_kv_pool_is_the_gap():
    lay = BumpLayout(1 << 20, alignment=256)
    assert lay.reserve_high("runtime", 1000, "runtime").offset == (1 << 20) - 1024
    assert lay.reserve_high("graph_pool", 4096, "graphs").end == (1 << 20) - 1024
    lay.resize_weights("m", 10_000)
    pool = lay.kv_pool
    assert pool.offset == 10_240 and pool.end == (1 << 20) - 1024 - 4096 and pool.owner == "m"
    lay.check_integrity()
    assert [r[0] for r in lay.report()] == ["weights", "kv_pool", "graph_pool", "runtime"]


def test_weights_that_cannot_fit_answer_none_and_leave_layout_unchanged():
    lay = BumpLayout(1 << 16)
    lay.reserve_high("runtime", 1 << 14)
    lay.resize_weights("a", 1 << 15)
    assert lay.resize_weights("b", (1 << 16) - (1 << 14) + 1) is None
    assert lay.weights.owner == "a"
    assert lay.reserve_high("big", 1 << 15) is None
    assert lay.resize_high("runtime", (1 << 15) + 256) is None


def test_integrity_rejects_staged_region_outside_pool():
    from talariad.memory.layout import Region

    lay = BumpLayout(1 << 16)
    lay.resize_weights("a", 1024)
    with pytest.raises(AssertionError):
        lay.check_integrity([Region("staged[0]", 0, 10, "x")])


def test_invalid_config_raises_value_error_naming_field():
    with pytest.raises(ValueError, match="alignment"):
        BumpLayout(1024, alignment=3)
    with pytest.raises(ValueError, match="family"):
        KVLayout(num_layers=2, family="rnn")
    with pytest.raises(ValueError, match="dtype"):
        KVLayout(num_layers=2, dtype="float7")


@pytest.mark.parametrize("order", ["layer_first", "page_first"])
def test_rows_specs_cover_exactly_the_rows_bytes(order):
    lay = KVLayout(
        num_layers=3, num_kv_heads=2, head_dim=4, page_size=2, dtype="float16", order=order
    )
    geo = KVGeometry(lay, 1000, lay.row_bytes * 10 + 7)
    assert geo.num_pages == 10
    specs = geo.rows_specs(6, 3)
    covered = {
        s.offset + r * s.stride + i for s in specs for r in range(s.rows) for i in range(s.width)
    }
    expected = {
        geo.fragment_offset(p, c, layer) + i
        for p in range(6, 9)
        for c in range(2)
        for layer in range(3)
        for i in range(lay.fragment_bytes)
    }
    assert covered == expected
    assert sum(s.nbytes for s in take_bytes(specs, 100)) == 100
