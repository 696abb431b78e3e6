"""HKVR byte movement: asynchronous page checkpoints (D2H) and restores (H2D) between the device
KV pool and the host slab arena, driven by the pure `HostKVRegistry`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from talariad.memory.device import CopyEvent, Device
from talariad.memory.hkvr import Block, HostKVRegistry
from talariad.memory.kv_layout import KVGeometry
from talariad.memory.transfer import run_copies


@dataclass(slots=True)
class PendingRestore:
    model: str
    blocks: list[Block]
    pages: list[int]
    event: CopyEvent


class HostKV:
    def __init__(self, device: Device, registry: HostKVRegistry) -> None:
        self.device = device
        self.registry = registry
        pool = registry.pool
        self.host = device.alloc_host(max(pool.num_slabs * pool.slab_bytes, 1))
        self._saves: list[tuple[Block, CopyEvent]] = []
        self.restores: dict[str, PendingRestore] = {}

    def _copy_pages(
        self, geo: KVGeometry, buffer: Any, pages: list[int], blocks: list[Block], to_host: bool
    ) -> list[CopyEvent]:
        """Copy pages to or from their blocks as merged runs; the event covering each block."""
        events: list[CopyEvent] = []
        for cp in run_copies(geo, pages, [b.slabs for b in blocks], self.registry.pool.slab_bytes):
            spec = cp.device
            shape = (cp.pages, spec.rows, spec.width)
            dev = self.device.view(
                buffer, spec.offset, shape, "uint8", (cp.page_stride, spec.stride, 1)
            )
            host = self.device.view(
                self.host, cp.host_offset, shape, "uint8", (cp.host_stride, spec.width, 1)
            )
            event = self.device.copy_d2h(host, dev) if to_host else self.device.copy_h2d(dev, host)
            events.append(event)
        # copies on one stream complete in order: the last one covers every block
        return [events[-1]] * len(blocks) if events else []

    # ---- save ----------------------------------------------------------------------------
    def save(
        self,
        geo: KVGeometry,
        buffer: Any,
        model: str,
        session: str,
        hashes: list[str],
        pages: list[int],
    ) -> list[CopyEvent]:
        """Queue D2H copies of the session's not-yet-saved pages; returns their events."""
        family = geo.layout.family
        todo = self.registry.begin_save(model, session, hashes, geo.layout)
        src = [pages[index] if family != "mamba" else pages[-1] for index, _ in todo]
        blocks = [block for _, block in todo]
        events = self._copy_pages(geo, buffer, src, blocks, to_host=True)
        self._saves += zip(blocks, events, strict=False)
        return events

    def poll(self) -> int:
        """Commit every save whose copy has completed; never blocks."""
        done = [(b, e) for b, e in self._saves if e.query()]
        self._finish(done)
        return len(done)

    def drain(self, model: str) -> int:
        """The switch barrier: wait for the outgoing model's saves only."""
        mine = [(b, e) for b, e in self._saves if b.key[0] == model]
        for _, event in mine:
            event.synchronize()
        self._finish(mine)
        return len(mine)

    def _finish(self, done: list[tuple[Block, CopyEvent]]) -> None:
        ids = {id(b) for b, _ in done}
        self._saves = [(b, e) for b, e in self._saves if id(b) not in ids]
        for block, _ in done:
            self.registry.complete_save(block)

    # ---- restore -------------------------------------------------------------------------
    def restore_blocks(self, model: str, hashes: list[str], family: str) -> tuple[list[Block], int]:
        """The blocks a restore of `hashes` would copy and how many prefix pages they cover."""
        n = self.registry.restorable(model, hashes, family)
        if family == "mamba":
            blocks = self.registry.blocks_for(model, hashes[n - 1 : n]) if n else []
            return blocks, n if blocks else 0
        blocks = self.registry.blocks_for(model, hashes[:n])
        return blocks, len(blocks)

    def restore(
        self,
        geo: KVGeometry,
        buffer: Any,
        session: str,
        model: str,
        blocks: list[Block],
        pages: list[int],
    ) -> CopyEvent | None:
        self.registry.pin(blocks)
        n = min(len(blocks), len(pages))
        events = self._copy_pages(geo, buffer, pages[:n], blocks[:n], to_host=False)
        event = events[-1] if events else None
        self.restores[session] = PendingRestore(model, blocks, pages, event)
        return event

    def finish_restore(self, session: str, wait: bool) -> bool:
        """Unpin a restore's blocks once its copies are done; True when nothing is left pending."""
        pending = self.restores.get(session)
        if pending is None:
            return True
        if pending.event is not None and not pending.event.query():
            if not wait:
                return False
            pending.event.synchronize()
        self.registry.unpin(pending.blocks)
        del self.restores[session]
        return True

    def finish_restores(self, model: str | None, wait: bool) -> None:
        for session in [s for s, p in self.restores.items() if model in (None, p.model)]:
            self.finish_restore(session, wait)
