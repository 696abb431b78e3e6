"""BlockTables: one block table per request, in tokens, over the KV pool's page allocator (the
memory substrate's `PageAllocator`, the one page accounting there is).

Pure bookkeeping (no torch): the pool tensor itself lives elsewhere (see attention.py).
"""

from __future__ import annotations

from collections.abc import Hashable

from talariad.memory.pages import PageAllocator


class BlockTables:
    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages <= 0 or page_size <= 0:
            raise ValueError(f"{num_pages=} and {page_size=} must be positive")
        self.num_pages = num_pages
        self.page_size = page_size
        self.pages = PageAllocator(num_pages)
        self.block_tables: dict[Hashable, list[int]] = {}

    @property
    def num_free_pages(self) -> int:
        return self.pages.num_free

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def missing_pages(self, req_id: Hashable, num_tokens: int) -> int:
        """Pages the request still needs to hold `num_tokens` tokens."""
        return max(0, self.pages_for(num_tokens) - len(self.block_tables.get(req_id, ())))

    def can_allocate(self, req_id: Hashable, num_tokens: int) -> bool:
        return self.pages.can_allocate(self.missing_pages(req_id, num_tokens))

    def allocate(self, req_id: Hashable, num_tokens: int) -> list[int] | None:
        """Grow the block table to cover `num_tokens`; None (and no change) if it can't."""
        got = self.pages.allocate(req_id, self.missing_pages(req_id, num_tokens))
        if got is None:
            return None
        table = self.block_tables.setdefault(req_id, [])
        table.extend(got)
        return table

    def block_table(self, req_id: Hashable) -> list[int] | None:
        return self.block_tables.get(req_id)

    def free(self, req_id: Hashable) -> int:
        """Return the request's pages to the pool; the number freed (0 if unknown)."""
        table = self.block_tables.pop(req_id, [])
        self.pages.free(table)
        return len(table)

    def check_integrity(self) -> None:
        """Every page is either free or in exactly one block table, owned by that request."""
        self.pages.check_integrity()
        for req_id, table in self.block_tables.items():
            if any(self.pages.owner(p) != req_id for p in table):
                raise RuntimeError(
                    f"page accounting broken: {req_id!r}'s table holds pages it does not own"
                )
        if sum(map(len, self.block_tables.values())) != self.num_pages - self.pages.num_free:
            raise RuntimeError("page accounting broken: owned pages outside every block table")
