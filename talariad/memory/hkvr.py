"""Host KV registry metadata (§4.3, App. B, App. C; pure bookkeeping, one per TP rank).

Blocks are keyed by (model, cumulative prefix hash) at page granularity and live in slabs of the
shared `SlabPool`. Invariants (App. B): DMA pins are counted apart from radix references and only
unpinned blocks are evicted; a block is committed to the `PrefixAgreement` only once its copy
completed, and a prefix is exposed only as far as every TP rank agrees; `pending(model)` lists a
model's in-flight saves for a switch to drain. Per-call work and memory stay bounded.
Design: docs/internals.md.
"""

from __future__ import annotations

import enum
import hashlib
import heapq
from dataclasses import dataclass, field

from talariad.memory.kv_layout import KVLayout
from talariad.memory.slabs import SlabPool
from talariad.memory.transfer import slabs_per_block

Key = tuple[str, str]  # (model, cumulative prefix hash)


def prefix_hashes(token_ids: list[int], page_size: int, model: str = "") -> list[str]:
    """Cumulative prefix hash at every full page boundary (the key the registry and ranks share)."""
    out, h = [], hashlib.blake2b(model.encode(), digest_size=16)
    for end in range(page_size, len(token_ids) + 1, page_size):
        h.update(
            b"".join(t.to_bytes(8, "little", signed=True) for t in token_ids[end - page_size : end])
        )
        out.append(h.copy().hexdigest())
    return out


class BlockState(str, enum.Enum):
    PENDING = "pending"  # D2H copy in flight
    READY = "ready"


@dataclass(frozen=True, slots=True)
class BlockDesc:
    """The compact layout descriptor each entry carries (App. C)."""

    model: str
    tp_rank: int
    prefix_hash: str
    tokens: int
    page_size: int
    dtype: str
    family: str
    slab_count: int


@dataclass(slots=True)
class Block:
    key: Key
    desc: BlockDesc
    slabs: list[int]
    state: BlockState = BlockState.PENDING
    dma_pins: int = 0
    radix_refs: set[str] = field(default_factory=set)
    last_use: int = 0


class PrefixAgreement:
    """Which (model, hash) pages every TP rank has committed; shared by the ranks of an instance."""

    def __init__(self, tp_size: int = 1) -> None:
        if tp_size < 1:
            raise ValueError(f"tp_size={tp_size} must be >= 1")
        self.tp_size = tp_size
        self._ranks: dict[Key, set[int]] = {}

    def commit(self, rank: int, key: Key) -> None:
        self._ranks.setdefault(key, set()).add(rank)

    def retract(self, rank: int, key: Key) -> None:
        ranks = self._ranks.get(key)
        if ranks is not None:
            ranks.discard(rank)
            if not ranks:
                del self._ranks[key]

    def committed(self, rank: int, key: Key) -> bool:
        return rank in self._ranks.get(key, ())

    def agreed(self, key: Key) -> bool:
        return len(self._ranks.get(key, ())) == self.tp_size

    def agreed_prefix(self, model: str, hashes: list[str]) -> int:
        """Length of the longest page-aligned prefix of `hashes` every rank committed."""
        n = 0
        while n < len(hashes) and self.agreed((model, hashes[n])):
            n += 1
        return n


class HostKVRegistry:
    def __init__(
        self,
        slabs: SlabPool,
        agreement: PrefixAgreement,
        rank: int = 0,
        max_sessions: int | None = None,
    ) -> None:
        """`max_sessions`: sessions remembered at once (default: one per slab, at least 64)."""
        self.pool = slabs
        self.agreement = agreement
        self.rank = rank
        self.blocks: dict[Key, Block] = {}
        # (model, session) -> page hashes, least recently saved first
        self.sessions: dict[tuple[str, str], list[str]] = {}
        self.max_sessions = max_sessions or max(slabs.num_slabs, 64)
        self._tick = 0
        self._pinned_slabs = 0  # slabs of blocks with a DMA pin: what eviction cannot free
        # eviction order (referenced, last_use, key); stale entries are skipped when popped
        self._lru: list[tuple[bool, int, Key]] = []
        self._shrunk: dict[tuple[str, str], int] = {}

    # ---- lookup ------------------------------------------------------------------------
    def restorable(self, model: str, hashes: list[str], family: str = "mha") -> int:
        """Pages of `hashes` a restore may expose: the all-rank agreed, completed prefix. For
        Mamba-style state only the deepest agreed boundary matters (it summarises the prefix)."""
        n = self.agreement.agreed_prefix(model, hashes)
        return n if family != "mamba" else self._deepest_agreed(model, hashes)

    def _deepest_agreed(self, model: str, hashes: list[str]) -> int:
        agreed = [i + 1 for i, h in enumerate(hashes) if self.agreement.agreed((model, h))]
        return max(agreed, default=0)

    def session_hashes(self, model: str, session: str) -> list[str]:
        return self.sessions.get((model, session), [])

    def pending(self, model: str | None = None) -> list[Block]:
        return [
            b
            for b in self.blocks.values()
            if b.state is BlockState.PENDING and model in (None, b.key[0])
        ]

    # ---- save ------------------------------------------------------------------------------
    def begin_save(
        self, model: str, session: str, hashes: list[str], layout: KVLayout
    ) -> list[tuple[int, Block]]:
        """Reference the session's pages and create pinned PENDING blocks for the new ones.

        Returns (page index, block) pairs to copy; stops at the first page the pool cannot hold
        even after evicting, so what is saved is always a prefix.
        """
        self._set_session(model, session, hashes)
        self._touch(model, hashes)
        held = [b for h in hashes if (b := self.blocks.get((model, h))) is not None]
        self.pin(held)  # so evicting for a new page never punches a hole in this prefix
        todo = []
        # Mamba-style state summarises the whole prefix: only the deepest boundary is saved.
        first = 0 if layout.family != "mamba" else max(len(hashes) - 1, 0)
        for i, h in enumerate(hashes[first:], start=first):
            block = self.blocks.get((model, h)) or self._new_block(model, h, i, layout)
            if block is None:
                break
            self._ref(block, session)
            if block.state is BlockState.PENDING and block.dma_pins == 0:
                self._pin(block, 1)
                todo.append((i, block))
        self.unpin(held)
        self._touch(model, hashes)
        return todo

    def _new_block(self, model: str, h: str, index: int, layout: KVLayout) -> Block | None:
        n = slabs_per_block(layout, self.pool.slab_bytes)
        slabs = self.pool.alloc(n) if self.pool.can_alloc(n) else self._evict_for(n)
        if slabs is None:
            return None
        desc = BlockDesc(
            model,
            self.rank,
            h,
            (index + 1) * layout.page_size,
            layout.page_size,
            layout.dtype,
            layout.family,
            n,
        )
        block = Block((model, h), desc, slabs)
        self.blocks[block.key] = block
        self._queue(block)
        return block

    def complete_save(self, block: Block) -> None:
        """The block's D2H copy finished: unpin it and commit it for agreement."""
        self._pin(block, -1)
        block.state = BlockState.READY
        self.agreement.commit(self.rank, block.key)

    # ---- restore -------------------------------------------------------------------------
    def pin(self, blocks: list[Block]) -> None:
        for b in blocks:
            self._pin(b, 1)

    def unpin(self, blocks: list[Block]) -> None:
        for b in blocks:
            self._pin(b, -1)

    def _pin(self, block: Block, delta: int) -> None:
        before = block.dma_pins > 0
        block.dma_pins += delta
        if (block.dma_pins > 0) != before and self.blocks.get(block.key) is block:
            self._pinned_slabs += len(block.slabs) if not before else -len(block.slabs)

    def blocks_for(self, model: str, hashes: list[str]) -> list[Block]:
        out = []
        for h in hashes:
            block = self.blocks.get((model, h))
            if block is None or block.state is not BlockState.READY:
                break
            out.append(block)
        self._touch(model, hashes)
        return out

    # ---- sessions, LRU -----------------------------------------------------------------
    def _set_session(self, model: str, session: str, hashes: list[str]) -> None:
        self.drop_session(model, session)
        self._shrunk.pop((model, session), None)
        self.sessions[(model, session)] = list(hashes)
        while len(self.sessions) > self.max_sessions:
            self._forget_oldest_session()

    def _forget_oldest_session(self) -> None:
        model, session = next(iter(self.sessions))
        self.drop_session(model, session)
        self._shrunk[(model, session)] = 0

    def drop_session(self, model: str, session: str) -> None:
        for h in self.sessions.pop((model, session), []):
            block = self.blocks.get((model, h))
            if block is not None:
                self._unref(block, session)

    def take_shrunk(self) -> dict[tuple[str, str], int]:
        """(model, session) -> pages still listed, for sessions cut back since the last call
        (their pages were evicted, or the session was forgotten to keep the bound)."""
        shrunk = self._shrunk
        if shrunk:
            self._shrunk = {}
        return shrunk

    def _ref(self, block: Block, session: str) -> None:
        if not block.radix_refs:
            block.radix_refs.add(session)
            self._queue(block)
        else:
            block.radix_refs.add(session)

    def _unref(self, block: Block, session: str) -> None:
        if session in block.radix_refs:
            block.radix_refs.discard(session)
            if not block.radix_refs:
                self._queue(block)

    def _touch(self, model: str, hashes: list[str]) -> None:
        # Deeper pages get older stamps so LRU eviction trims prefixes from the tail.
        for h in reversed(hashes):
            self._tick += 1
            if (block := self.blocks.get((model, h))) is not None:
                block.last_use = self._tick
                self._queue(block)

    def _queue(self, block: Block) -> None:
        """Enter the block's current eviction rank; its older entries go stale."""
        heapq.heappush(self._lru, (bool(block.radix_refs), block.last_use, block.key))
        if len(self._lru) > 4 * len(self.blocks) + 1024:
            self._lru = [(bool(b.radix_refs), b.last_use, b.key) for b in self.blocks.values()]
            heapq.heapify(self._lru)

    def _evict_for(self, n: int) -> list[int] | None:
        """Free slabs by evicting unpinned blocks, unreferenced before referenced, least recently
        used first; None (nothing evicted) when even that cannot make room."""
        if self.pool.num_slabs - self._pinned_slabs < n:
            return None
        skipped = []
        while not self.pool.can_alloc(n):
            entry = heapq.heappop(self._lru)
            referenced, last_use, key = entry
            block = self.blocks.get(key)
            if block is None or block.last_use != last_use or bool(block.radix_refs) != referenced:
                continue  # stale: the block moved in the order or is gone
            if block.dma_pins:
                skipped.append(entry)
                continue
            self.evict(block)
        for entry in skipped:
            heapq.heappush(self._lru, entry)
        return self.pool.alloc(n)

    def evict(self, block: Block) -> bool:
        if block.dma_pins:
            return False
        self.agreement.retract(self.rank, block.key)
        self.pool.free(block.slabs)
        del self.blocks[block.key]
        for session in block.radix_refs:
            self._cut_session(block, session)
        block.radix_refs = set()
        return True

    def _cut_session(self, block: Block, session: str) -> None:
        """The session's prefix now ends before `block`: drop its refs from the deeper pages."""
        model, h = block.key
        hashes = self.sessions.get((model, session), [])
        index = block.desc.tokens // block.desc.page_size - 1
        if index >= len(hashes) or hashes[index] != h:
            index = hashes.index(h) if h in hashes else len(hashes)
        for deeper in hashes[index + 1 :]:
            if (other := self.blocks.get((model, deeper))) is not None:
                self._unref(other, session)
        if index:
            self.sessions[(model, session)] = hashes[:index]
        else:
            self.sessions.pop((model, session), None)
        self._shrunk[(model, session)] = index

    def check_integrity(self) -> None:
        self.pool.check_integrity()
        owned = [s for b in self.blocks.values() for s in b.slabs]
        if len(owned) != len(set(owned)):
            raise AssertionError("a slab belongs to two blocks")
        if len(owned) != self.pool.num_slabs - self.pool.num_free:
            raise AssertionError(
                f"blocks own {len(owned)} slabs, pool says {self.pool.num_slabs - self.pool.num_free}"
            )
        for b in self.blocks.values():
            if b.dma_pins < 0 or (b.state is BlockState.PENDING and b.dma_pins < 1):
                raise AssertionError(f"block {b.key} {b.state.value} with {b.dma_pins} pins")
            if self.agreement.committed(self.rank, b.key) != (b.state is BlockState.READY):
                raise AssertionError(f"block {b.key} committed before (or without) its copy")
        if self._pinned_slabs != sum(len(b.slabs) for b in self.blocks.values() if b.dma_pins):
            raise AssertionError(f"pinned slab count {self._pinned_slabs} is stale")
        if len(self.sessions) > self.max_sessions:
            raise AssertionError(
                f"{len(self.sessions)} sessions over the bound {self.max_sessions}"
            )
