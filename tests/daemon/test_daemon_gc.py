"""The daemon's collector settings after start-up (what bench/router_bench.py measures under)."""

from __future__ import annotations

import gc
import sys

from talariad.gc_tuning import GC_GEN0_THRESHOLD, SurvivorFreezer, settle_gc


def test_settle_gc_freezes_start_up_objects_and_spaces_young_passes():
    before = gc.get_threshold()
    try:
        settle_gc()
        assert gc.get_threshold() == (GC_GEN0_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_the_survivor_freezer_freezes_only_after_the_process_has_grown():
    freezer = SurvivorFreezer(growth_blocks=50_000)
    try:
        gc.unfreeze()
        assert not freezer.check()  # nothing grew
        assert gc.get_freeze_count() == 0
        held = [[i] for i in range(60_000)]  # a burst's state: tens of thousands of blocks
        assert freezer.check()
        assert freezer.freezes == 1 and gc.get_freeze_count() >= len(held)
        assert not freezer.check()  # counted from the freeze: no growth since
        grown = sys.getallocatedblocks()
        del held[:]
        assert not freezer.check()  # shrunk: growth now counts from the smaller size
        assert freezer.base < grown - 30_000
    finally:
        gc.unfreeze()
