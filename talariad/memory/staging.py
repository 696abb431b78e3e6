"""D2D staging bitmap (§4.4; pure): the next model's weights, cut into fixed-size chunks, are
written into page-row slots at the high end of the active KV pool while the current model serves.

A chunk is MISSING, WRITING (an H2D copy is filling its slot; the page allocator skips those rows),
CLEAN (its slot holds exactly its bytes) or DIRTY (a KV allocation took one of its rows; its slot
is given up). At switch time only CLEAN chunks are gathered device-to-device.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from talariad.memory.kv_layout import KVGeometry
from talariad.memory.layout import Region
from talariad.memory.pages import PageAllocator


class ChunkState(str, enum.Enum):
    MISSING = "missing"
    WRITING = "writing"
    CLEAN = "clean"
    DIRTY = "dirty"


@dataclass(slots=True)
class Chunk:
    index: int
    src_offset: int  # byte offset inside the target model's weights
    nbytes: int
    state: ChunkState = ChunkState.MISSING
    first_row: int | None = None


@dataclass(frozen=True, slots=True)
class GatherPlan:
    """How a switch opens the target weights: clean chunks by D2D, the rest by H2D."""

    model: str
    d2d: tuple[Chunk, ...]
    h2d: tuple[Chunk, ...]
    dirty_bytes: int

    @property
    def staged_bytes(self) -> int:
        return sum(c.nbytes for c in self.d2d)

    @property
    def h2d_bytes(self) -> int:
        return sum(c.nbytes for c in self.h2d)


class StagingBitmap:
    def __init__(self, geometry: KVGeometry, pages: PageAllocator, chunk_bytes: int) -> None:
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes={chunk_bytes} must be > 0")
        self.geometry = geometry
        self.pages = pages
        self.chunk_rows = max(1, -(-chunk_bytes // geometry.layout.row_bytes))
        self.chunk_bytes = self.chunk_rows * geometry.layout.row_bytes
        self.model: str | None = None
        self.weight_end = geometry.offset
        self.chunks: list[Chunk] = []
        self.dirtied_bytes = 0

    # ---- target ------------------------------------------------------------------------
    def target(self, model: str, weight_bytes: int, weight_end: int) -> None:
        """Start staging `model`; slots must sit above `weight_end`, where its weights will end, so a
        D2D gather never overwrites a slot it has not read yet."""
        self.model, self.weight_end, self.dirtied_bytes = model, weight_end, 0
        cb = self.chunk_bytes
        self.chunks = [
            Chunk(i, off, min(cb, weight_bytes - off))
            for i, off in enumerate(range(0, weight_bytes, cb))
        ]

    def clear(self) -> None:
        self.model, self.chunks = None, []

    # ---- slots -------------------------------------------------------------------------
    def _slots(self) -> list[int]:
        """First rows of the valid slots, highest first."""
        n, cr = self.geometry.num_pages, self.chunk_rows
        firsts = range(n - cr, -1, -cr)
        return [r for r in firsts if self.geometry.rows_low_address(r) >= self.weight_end]

    def _rows(self, chunk: Chunk) -> range:
        return range(chunk.first_row, chunk.first_row + self.chunk_rows)

    def _taken_slots(self) -> set[int]:
        return {c.first_row for c in self.chunks if c.first_row is not None}

    def _slot_free(self, first: int, taken: set[int]) -> bool:
        rows = range(first, first + self.chunk_rows)
        return first not in taken and all(self.pages.is_free(r) for r in rows)

    def free_slots(self) -> list[int]:
        taken = self._taken_slots()
        return [r for r in self._slots() if self._slot_free(r, taken)]

    def slack_bytes(self) -> int:
        """HBM still usable for staging: free slots, capped by what the target still needs."""
        free = len(self.free_slots()) * self.chunk_bytes
        if self.model is None:
            return free
        need = sum(
            c.nbytes for c in self.chunks if c.state in (ChunkState.MISSING, ChunkState.DIRTY)
        )
        return min(free, need)

    # ---- writes ------------------------------------------------------------------------
    def next_write(self) -> Chunk | None:
        """Claim a free slot for the lowest unstaged chunk and mark it WRITING; None if nothing fits."""
        todo = [c for c in self.chunks if c.state in (ChunkState.MISSING, ChunkState.DIRTY)]
        slots = self.free_slots() if todo else []
        if not slots:
            return None
        chunk = todo[0]
        chunk.state, chunk.first_row = ChunkState.WRITING, slots[0]
        return chunk

    def complete_write(self, index: int) -> None:
        chunk = self.chunks[index]
        if chunk.state is ChunkState.WRITING:
            chunk.state = ChunkState.CLEAN

    def writing(self) -> list[Chunk]:
        return [c for c in self.chunks if c.state is ChunkState.WRITING]

    def blocked_rows(self) -> frozenset[int]:
        """Rows under an active H2D write: the page allocator must skip them."""
        return frozenset(r for c in self.writing() for r in self._rows(c))

    def on_rows_allocated(self, rows: list[int]) -> list[int]:
        """KV took these rows: every clean chunk they overlap becomes dirty and loses its slot."""
        hit = set(rows)
        dirtied = []
        for c in self.chunks:
            if c.state is ChunkState.CLEAN and hit.intersection(self._rows(c)):
                c.state, c.first_row = ChunkState.DIRTY, None
                self.dirtied_bytes += c.nbytes
                dirtied.append(c.index)
        return dirtied

    # ---- switch --------------------------------------------------------------------------
    def gather_plan(self) -> GatherPlan | None:
        """None while writes are in flight: the caller must finish them first."""
        if self.model is None or self.writing():
            return None
        clean = tuple(c for c in self.chunks if c.state is ChunkState.CLEAN)
        rest = tuple(c for c in self.chunks if c.state is not ChunkState.CLEAN)
        dirty = sum(c.nbytes for c in rest if c.state is ChunkState.DIRTY)
        return GatherPlan(self.model, clean, rest, dirty)

    def regions(self) -> list[Region]:
        out = []
        for c in self.chunks:
            if c.first_row is not None:
                specs = self.geometry.rows_specs(c.first_row, self.chunk_rows)
                lo, hi = specs[0].lo, specs[-1].hi
                out.append(
                    Region(f"staged[{c.index}]", lo, hi - lo, f"{self.model}:{c.state.value}")
                )
        return out

    def check_integrity(self) -> None:
        seen: set[int] = set()
        valid = set(self._slots())
        for c in self.chunks:
            placed = c.state in (ChunkState.WRITING, ChunkState.CLEAN)
            if placed != (c.first_row is not None):
                raise AssertionError(f"chunk {c.index} is {c.state.value} with slot {c.first_row}")
            if not placed:
                continue
            if c.first_row in seen or c.first_row not in valid:
                raise AssertionError(f"chunk {c.index} has a shared or invalid slot {c.first_row}")
            seen.add(c.first_row)
            if any(not self.pages.is_free(r) for r in self._rows(c)):
                raise AssertionError(f"{c.state.value} chunk {c.index} overlaps allocated KV rows")
