"""KV page allocator of the active model's pool (pure): low addresses first, skipping rows that a
host-to-device staging write is filling (§4.4)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable


class PageAllocator:
    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self._free = list(range(num_pages))  # a heap, so the lowest free row comes first
        self._owner: dict[int, str] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    def is_free(self, page: int) -> bool:
        return 0 <= page < self.num_pages and page not in self._owner

    def owner(self, page: int) -> str | None:
        return self._owner.get(page)

    def pages_of(self, owner: str) -> list[int]:
        return sorted(p for p, o in self._owner.items() if o == owner)

    def can_allocate(self, n: int, skip: frozenset[int] = frozenset()) -> bool:
        return sum(1 for p in self._free if p not in skip) >= n

    def allocate(self, owner: str, n: int, skip: frozenset[int] = frozenset()) -> list[int] | None:
        """The `n` lowest free pages not in `skip`, or None when there are not enough."""
        if n < 0 or not self.can_allocate(n, skip):
            return None
        taken, held = [], []
        while len(taken) < n:
            page = heapq.heappop(self._free)
            (held if page in skip else taken).append(page)
        for page in held:
            heapq.heappush(self._free, page)
        for page in taken:
            self._owner[page] = owner
        return taken

    def free(self, pages: Iterable[int]) -> None:
        for page in pages:
            if self._owner.pop(page, None) is not None:
                heapq.heappush(self._free, page)

    def reassign(self, pages: Iterable[int], owner: str) -> None:
        """Hand owned pages to another owner (e.g. a copy still reading them)."""
        for page in pages:
            if page in self._owner:
                self._owner[page] = owner

    def free_owner(self, owner: str) -> list[int]:
        pages = self.pages_of(owner)
        self.free(pages)
        return pages

    def check_integrity(self) -> None:
        free = set(self._free)
        if len(free) != len(self._free):
            raise AssertionError("a page is on the free list twice")
        if free & self._owner.keys():
            raise AssertionError(f"pages both free and owned: {sorted(free & self._owner.keys())}")
        if len(free) + len(self._owner) != self.num_pages:
            raise AssertionError(f"free {len(free)} + owned {len(self._owner)} != {self.num_pages}")
