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


YOUNG_PASS_EVERY = 64
"""Installs and picks between the endpoint picker's young passes (`PacedCollector`)."""
OLDER_GEN_THRESHOLD = 2
"""Young passes between generation-1 passes in the endpoint picker (CPython's default is 10)."""


class PacedCollector:
    """The endpoint picker's collector: passes of bounded length at any pool size and after any
    burst (docs/pool.md "At agent scale"). Why not CPython's own trigger: it counts allocations
    minus deallocations of tracked objects, and the picker's steady state is net zero (a box's
    install frees its previous one, a decision the log's oldest), so a young pass comes late and
    walks everything allocated since: 27k objects, 12-28 ms of CPU, at 1,000 boxes; and a
    generation-1 pass (every 10 young ones) walked 40-80k, 15-46 ms. So:
    - a young pass every `every` installs and picks (the picker's work units; run at an
      install, `tick`, not in a pick, `count`), and a generation-1 pass instead every
      `older`-th: each walks about `every` units' objects;
    - what survives a generation-1 pass, explicit or CPython's own (a burst grows the process:
      its own trigger still fires), is frozen (`gc.freeze`): nothing reaches the oldest
      generation, and no full pass walks a burst's state (1.4-1.5 s at 100k sessions) or the
      boxes' installs (a full pass after them took 98 ms at 1,000 boxes).
    The cost: a frozen object is still freed when its last reference goes, but a reference
    cycle among objects that survived two young passes is never collected once garbage. The
    picker's placements made none (no pass collected anything over 100k sessions and their
    expiry, and after 5 x 100k sessions through one picker a full pass with everything unfrozen
    found nothing unreachable: docs/pool.md); a cycle that `talariad epp`'s server (grpc.aio,
    asyncio) leaves after two young passes would be kept (not measured)."""

    def __init__(self, every: int = YOUNG_PASS_EVERY, older: int = OLDER_GEN_THRESHOLD) -> None:
        self.every, self.older = every, older
        self.left, self.young = every, 0
        self.freezes = 0  # after generation-1 passes, CPython's own included
        self._thresholds: tuple[int, int, int] | None = None

    def start(self) -> None:
        """Take over from `settle_gc` (called after it): CPython's own passes stay for what
        grows the process, a generation-1 pass every `older` young ones, each frozen after."""
        self._thresholds = gc.get_threshold()
        gc.set_threshold(self._thresholds[0], self.older, self._thresholds[2])
        gc.callbacks.append(self._collected)

    def stop(self) -> None:
        """Undo `start` (tests; a picker that stops)."""
        if self._collected in gc.callbacks:
            gc.callbacks.remove(self._collected)
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)

    def count(self) -> None:
        """One pick done: counted, its pass left to the next `tick` (a pass in a pick sets the
        picks' p99: one in `every`)."""
        self.left -= 1

    def tick(self) -> None:
        """One box install (or answer) done: the pass due after `every` installs and picks."""
        self.left -= 1
        if self.left > 0:
            return
        self.left = self.every
        self.young += 1
        gc.collect(1 if self.young % self.older == 0 else 0)

    @classmethod
    def started(cls) -> PacedCollector:
        """`talariad epp`'s collector once start-up is done: `settle_gc`, then one started."""
        settle_gc()
        collector = cls()
        collector.start()
        return collector

    def _collected(self, phase: str, info: dict) -> None:
        if phase == "stop" and info["generation"] >= 1:
            gc.freeze()  # the survivors of two young passes: out of every later pass
            self.freezes += 1
