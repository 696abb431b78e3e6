"""The garbage-collector settings of the placing processes once start-up is done (the daemon's
gateway and the pool's endpoint picker: instances are separate processes and keep CPython's
defaults)."""

from __future__ import annotations

import asyncio
import gc
import sys

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


FREEZE_CHECK_S = 1.0
"""How often a placing process looks at how much it has grown (`SurvivorFreezer.check`)."""
FREEZE_GROWTH_BLOCKS = 500_000
"""Growth in allocated memory blocks since the last freeze that makes the next check freeze
(100k new sessions in the endpoint picker are several million)."""


def freeze_survivors() -> None:
    """Collect the young generations, then move every object still tracked into the permanent
    generation (`gc.freeze`), as `settle_gc` does once at start-up. Cost: one pass over the
    young generations (bounded by their thresholds), none over what is already frozen."""
    gc.collect(1)
    gc.freeze()


class SurvivorFreezer:
    """Freezes what survives a burst. Why: the state a burst of sessions leaves (leases, session
    rows, kept reads) otherwise reaches the oldest generation, and each full pass over it stops
    the process for about a second at 100k sessions (docs/pool.md "Scale"). It freezes only
    when the process has grown (allocated blocks, `sys.getallocatedblocks`, O(1)) by
    `growth_blocks` since its last freeze or its smallest size after it, so a steady state
    freezes nothing. The cost: a frozen object is still freed when its last reference goes, but
    a reference cycle among objects alive at a freeze is not collected once garbage (memory
    kept, not measured)."""

    def __init__(self, growth_blocks: int = FREEZE_GROWTH_BLOCKS) -> None:
        self.growth_blocks = growth_blocks
        self.base = sys.getallocatedblocks()
        self.freezes = 0

    def check(self) -> bool:
        """Freeze if grown enough; True when it did."""
        blocks = sys.getallocatedblocks()
        if blocks < self.base:
            self.base = blocks  # state went away: growth counts from here
            return False
        if blocks - self.base < self.growth_blocks:
            return False
        freeze_survivors()
        self.base, self.freezes = sys.getallocatedblocks(), self.freezes + 1
        return True

    async def run(self, interval_s: float = FREEZE_CHECK_S) -> None:
        """`check` every `interval_s` until cancelled (a task of the placing process)."""
        while True:
            await asyncio.sleep(interval_s)
            self.check()
