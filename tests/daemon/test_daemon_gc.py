"""The daemon's collector settings after start-up (what bench/router_bench.py measures under)."""

from __future__ import annotations

import gc

from talariad.gc_tuning import GC_GEN0_THRESHOLD, PacedCollector, settle_gc


def test_settle_gc_freezes_start_up_objects_and_spaces_young_passes():
    before = gc.get_threshold()
    try:
        settle_gc()
        assert gc.get_threshold() == (GC_GEN0_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_the_paced_collector_runs_a_pass_every_few_units_and_freezes_what_survives_two():
    passes: list[int] = []

    def seen(phase: str, info: dict) -> None:
        if phase == "stop":
            passes.append(info["generation"])

    before = gc.get_threshold()
    collector = PacedCollector(every=3, older=2)
    gc.callbacks.append(seen)
    try:
        gc.unfreeze()
        collector.start()
        assert gc.get_threshold() == (before[0], 2, before[2])
        gc.disable()  # only the collector's own passes from here
        held = [[i] for i in range(1_000)]  # state that outlives the passes
        collector.tick()
        collector.count()  # a pick: counted, never a pass
        collector.count()
        assert passes == [] and gc.get_freeze_count() == 0
        collector.tick()  # the fourth unit, an install: the pass due at the third
        assert passes == [0] and gc.get_freeze_count() == 0
        for _ in range(3):
            collector.tick()  # the second pass: generation 1, its survivors frozen
        assert passes == [0, 1] and collector.freezes == 1
        assert gc.get_freeze_count() >= len(held)
    finally:
        gc.enable()
        gc.callbacks.remove(seen)
        collector.stop()
        gc.unfreeze()
    assert gc.get_threshold() == before and collector._collected not in gc.callbacks
