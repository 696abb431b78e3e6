"""The host slab pool (pure): fixed-size slabs of one host arena shared by every model and
attention family, so host memory is not partitioned per model (§4.3)."""

from __future__ import annotations

import heapq


class SlabPool:
    def __init__(self, num_slabs: int, slab_bytes: int) -> None:
        if num_slabs < 0 or slab_bytes <= 0:
            raise ValueError(f"num_slabs={num_slabs} and slab_bytes={slab_bytes} must be positive")
        self.num_slabs = num_slabs
        self.slab_bytes = slab_bytes
        self._free = list(range(num_slabs))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def offset(self, slab: int) -> int:
        return slab * self.slab_bytes

    def can_alloc(self, n: int) -> bool:
        return 0 <= n <= len(self._free)

    def alloc(self, n: int) -> list[int] | None:
        """The `n` lowest free slabs (neighbours stay neighbours), or None."""
        if not self.can_alloc(n):
            return None
        slabs = [heapq.heappop(self._free) for _ in range(n)]
        self._used.update(slabs)
        return slabs

    def free(self, slabs: list[int]) -> None:
        for slab in slabs:
            if slab in self._used:
                self._used.remove(slab)
                heapq.heappush(self._free, slab)

    def check_integrity(self) -> None:
        free = set(self._free)
        if len(free) != len(self._free) or free & self._used:
            raise AssertionError("a slab is free twice or both free and used")
        if len(free) + len(self._used) != self.num_slabs:
            raise AssertionError(f"free {len(free)} + used {len(self._used)} != {self.num_slabs}")
