"""The daemon's collector settings after start-up (what bench/router_bench.py measures under)."""

from __future__ import annotations

import gc

from talariad.gc_tuning import GC_GEN0_THRESHOLD, settle_gc


def test_settle_gc_freezes_start_up_objects_and_spaces_young_passes():
    before = gc.get_threshold()
    try:
        settle_gc()
        assert gc.get_threshold() == (GC_GEN0_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
