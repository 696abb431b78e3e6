"""PageAllocator: a free list over the KV pool's pages and one block table per request.

Pure bookkeeping (no torch): the pool tensor itself lives elsewhere (see attention.py).
"""

from __future__ import annotations

from collections.abc import Hashable


class PageAllocator:
    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages <= 0 or page_size <= 0:
            raise ValueError(f"{num_pages=} and {page_size=} must be positive")
        self.num_pages = num_pages
        self.page_size = page_size
        # a stack; pop() hands out low page ids first
        self.free_pages: list[int] = list(range(num_pages - 1, -1, -1))
        self.block_tables: dict[Hashable, list[int]] = {}

    @property
    def num_free_pages(self) -> int:
        return len(self.free_pages)

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def missing_pages(self, req_id: Hashable, num_tokens: int) -> int:
        """Pages the request still needs to hold `num_tokens` tokens."""
        return max(0, self.pages_for(num_tokens) - len(self.block_tables.get(req_id, ())))

    def can_allocate(self, req_id: Hashable, num_tokens: int) -> bool:
        return self.missing_pages(req_id, num_tokens) <= len(self.free_pages)

    def allocate(self, req_id: Hashable, num_tokens: int) -> list[int] | None:
        """Grow the block table to cover `num_tokens`; None (and no change) if it can't."""
        if not self.can_allocate(req_id, num_tokens):
            return None
        table = self.block_tables.setdefault(req_id, [])
        for _ in range(self.missing_pages(req_id, num_tokens)):
            table.append(self.free_pages.pop())
        return table

    def block_table(self, req_id: Hashable) -> list[int] | None:
        return self.block_tables.get(req_id)

    def free(self, req_id: Hashable) -> int:
        """Return the request's pages to the free list; the number freed (0 if unknown)."""
        table = self.block_tables.pop(req_id, [])
        self.free_pages.extend(reversed(table))
        return len(table)

    def check_integrity(self) -> None:
        """Every page is either free or in exactly one block table."""
        used = [p for table in self.block_tables.values() for p in table]
        owned = used + self.free_pages
        if len(owned) != self.num_pages or set(owned) != set(range(self.num_pages)):
            raise RuntimeError(
                f"page accounting broken: {len(used)} used + {len(self.free_pages)} free "
                f"({len(set(owned))} distinct) != {self.num_pages} pages"
            )
