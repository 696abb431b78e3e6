"""BlockTables: block tables grow, free returns pages, 'can't' is None, integrity always holds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talariad.engine.model import BlockTables


def test_allocate_grows_block_table_and_free_returns_pages():
    alloc = BlockTables(num_pages=8, page_size=4)
    assert alloc.allocate("a", 5) == [0, 1]
    assert alloc.allocate("a", 8) == [0, 1]
    assert alloc.allocate("a", 9) == [0, 1, 2]
    assert alloc.allocate("b", 1) == [3]
    assert alloc.num_free_pages == 4
    assert alloc.free("a") == 3 and alloc.free("a") == 0
    assert alloc.num_free_pages == 7
    assert alloc.block_table("a") is None and alloc.block_table("b") == [3]
    alloc.check_integrity()


def test_cannot_allocate_answers_none_and_changes_nothing():
    alloc = BlockTables(num_pages=2, page_size=4)
    alloc.allocate("a", 4)
    assert not alloc.can_allocate("b", 9)
    assert alloc.allocate("b", 9) is None
    assert alloc.block_table("b") is None and alloc.num_free_pages == 1
    assert alloc.can_allocate("a", 8)


def test_check_integrity_detects_double_ownership():
    alloc = BlockTables(num_pages=4, page_size=2)
    alloc.allocate("a", 2)
    alloc.block_tables["b"] = [alloc.block_table("a")[0]]  # a page in two tables
    with pytest.raises(RuntimeError, match="page accounting"):
        alloc.check_integrity()


def test_bad_sizes_are_value_errors():
    with pytest.raises(ValueError, match="num_pages"):
        BlockTables(0, 4)


ops = st.lists(st.tuples(st.sampled_from("af"), st.integers(0, 4), st.integers(1, 40)), max_size=40)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_random_operations_keep_pages_disjoint(seq):
    alloc = BlockTables(num_pages=16, page_size=4)
    for op, req, tokens in seq:
        if op == "a":
            before = alloc.num_free_pages
            table = alloc.allocate(req, tokens)
            assert table is None or len(table) >= alloc.pages_for(tokens)
            assert table is not None or alloc.num_free_pages == before
        else:
            alloc.free(req)
        alloc.check_integrity()
