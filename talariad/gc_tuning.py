"""The garbage-collector settings of the placing processes once start-up is done (the daemon's
gateway and the pool's endpoint picker: instances are separate processes and keep CPython's
defaults)."""

from __future__ import annotations

import gc

GC_GEN0_THRESHOLD = 5_000
"""Allocations between young-generation passes (CPython's default is 700)."""


def settle_gc() -> None:
    """Collect start-up garbage, then move what survives out of the collector's generations
    (`gc.freeze`: start-up objects never die), and run young passes about 7x less often. A young
    pass walks the snapshots and decisions made since the last one and frees almost nothing; at
    the default threshold one lands in about 1% of placements and sets the router's p99. Fewer
    passes are each longer: `bench/router_bench.py` prints p99.9 and the maximum beside p99.
    (The ratio holds for CPython's generational collector, 3.11 to 3.13.)"""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])
