"""The instance-local memory substrate of one TP rank: bump layout, model entries, the active KV
pool, HKVR and D2D staging behind one object. Bookkeeping is delegated to the pure modules; bytes
move only through the `Device`. Switching lives in `switch.py`."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from talariad.memory.device import CopyEvent, Device
from talariad.memory.hkvr import HostKVRegistry, PrefixAgreement
from talariad.memory.host_kv import HostKV
from talariad.memory.kv_layout import (
    KVGeometry,
    KVLayout,
    contiguous_strides,
    dtype_bytes,
    take_bytes,
)
from talariad.memory.layout import BumpLayout, Region, align_up
from talariad.memory.models import ModelEntry, Shapes, pack_params
from talariad.memory.pages import PageAllocator
from talariad.memory.slabs import SlabPool
from talariad.memory.staging import StagingBitmap
from talariad.memory.switch import PointerCheck, SwitchTiming, run_switch
from talariad.types import KVState

SWITCH_RECORDS = 4096
"""Switch timings kept (the memory report shows the latest)."""


@dataclass(frozen=True, slots=True)
class SubstrateConfig:
    capacity_bytes: int
    """Size of the managed device buffer (the paper's mem-fraction-bump share of HBM)."""
    host_kv_bytes: int
    """Size of the HKVR host slab arena (pinned on CUDA)."""
    runtime_bytes: int = 1 << 20
    """Runtime buffers anchored at the high end."""
    graph_pool_bytes: int = 1 << 20
    """Graph pool, stacked just below the runtime buffers."""
    slab_bytes: int = 1 << 20
    """HKVR slab size; one slab holds whole layer fragments of one page component."""
    chunk_bytes: int = 16 << 20
    """Staging chunk size (rounded up to whole KV page rows of the active model)."""
    alignment: int = 256
    tp_rank: int = 0

    def __post_init__(self) -> None:
        for name in ("capacity_bytes", "host_kv_bytes", "slab_bytes", "chunk_bytes", "alignment"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be > 0")
        if self.runtime_bytes + self.graph_pool_bytes >= self.capacity_bytes:
            raise ValueError("runtime_bytes + graph_pool_bytes must be < capacity_bytes")


@dataclass(frozen=True, slots=True)
class RestoreResult:
    """A restore in flight: `pages` hold the restored prefix once `Substrate.wait_restore` returns."""

    session: str
    pages: list[int]
    restored_pages: int
    restored_tokens: int
    recompute_pages: int  # the unagreed or missing tail the engine must recompute


class Substrate:
    def __init__(
        self,
        device: Device,
        config: SubstrateConfig,
        agreement: PrefixAgreement | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.device, self.config, self.clock = device, config, clock
        self.buffer = device.alloc(config.capacity_bytes)
        self.layout = BumpLayout(config.capacity_bytes, config.alignment)
        self.layout.reserve_high("runtime", config.runtime_bytes, "runtime")
        self.layout.reserve_high("graph_pool", config.graph_pool_bytes, "graphs")
        slabs = SlabPool(config.host_kv_bytes // config.slab_bytes, config.slab_bytes)
        self.registry = HostKVRegistry(slabs, agreement or PrefixAgreement(1), config.tp_rank)
        self.host_kv = HostKV(device, self.registry)
        self.models: dict[str, ModelEntry] = {}
        self.active: str | None = None
        self.geometry: KVGeometry | None = None
        self.pages: PageAllocator | None = None
        self.staging: StagingBitmap | None = None
        self.sessions: dict[str, list[int]] = {}  # session -> its pages in logical order
        self.shells: dict[str, KVGeometry] = {}
        self.records: deque[SwitchTiming] = deque(maxlen=SWITCH_RECORDS)  # newest last
        self.last_pointer_check: PointerCheck | None = None
        self._stage_events: list[tuple[int, CopyEvent]] = []
        # pages freed while a copy still reads them
        self._deferred: list[tuple[str, list[CopyEvent], list[int]]] = []
        self._save_events: dict[str, list[CopyEvent]] = {}

    # ---- models ----------------------------------------------------------------------------
    def register_model(self, name: str, shapes: Shapes, kv_layout: KVLayout) -> dict[str, Any]:
        """Create the model's host image; returns host views for the caller to fill with weights."""
        if name in self.models:
            raise ValueError(f"model {name!r} is already registered")
        params, nbytes = pack_params(shapes, self.config.alignment)
        host = self.device.alloc_host(max(nbytes, 1))
        self.models[name] = ModelEntry(name, kv_layout, params, nbytes, host)
        return self.host_weights(name)

    def host_weights(self, name: str) -> dict[str, Any]:
        entry = self.models[name]
        return {
            p.name: self.device.view(entry.host, p.offset, p.shape, p.dtype)
            for p in entry.params.values()
        }

    def weights_view(self, name: str | None = None) -> dict[str, Any] | None:
        """The active model's parameters as views of the weight region; None if `name` is not active."""
        name = name or self.active
        if name is None or name != self.active:
            return None
        entry = self.models[name]
        return {
            p.name: self.device.view(self.buffer, p.offset, p.shape, p.dtype)
            for p in entry.params.values()
        }

    def finalize_weights(
        self, name: str, shapes: Shapes, tensors: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Adopt post-processed weights of the active model (App. D) as its layout for every later
        open and staging write. None when `name` is not active or its KV pool is in use."""
        if name != self.active or self.sessions:
            return None
        params, nbytes = pack_params(shapes, self.config.alignment)
        if not self.layout.can_resize_weights(nbytes):
            return None
        entry = self.models[name]
        host = self.device.alloc_host(max(nbytes, 1))
        for p in params.values():
            self.device.copy_d2h(
                self.device.view(host, p.offset, p.shape, p.dtype), tensors[p.name]
            ).synchronize()
        entry.params, entry.nbytes, entry.host, entry.processed = params, nbytes, host, True
        self.layout.resize_weights(name, nbytes)
        self.device.copy_h2d(
            self.device.view(self.buffer, 0, (nbytes,)), self.device.view(host, 0, (nbytes,))
        ).synchronize()
        self._open_pool(name)
        return self.weights_view(name)

    def _open_pool(self, name: str) -> bool:
        """Bind a fresh page allocator and staging bitmap over the current gap; True on a shell hit."""
        pool = self.layout.kv_pool
        geo = KVGeometry(self.models[name].kv_layout, pool.offset, pool.size)
        hit = self.shells.get(name) == geo
        self.geometry, self.shells[name] = geo, geo
        self.pages = PageAllocator(geo.num_pages)
        self.staging = StagingBitmap(geo, self.pages, self.config.chunk_bytes)
        self._stage_events = []
        return hit

    # ---- KV pages ----------------------------------------------------------------------------
    def kv_pool(self) -> Any | None:
        """The whole pool as one typed tensor: [C, L, pages, *fragment] (layer-first) or
        [pages, C, L, *fragment] (page-first)."""
        geo = self.geometry
        if geo is None:
            return None
        lay = geo.layout
        outer = (len(lay.components), lay.num_layers)
        shape = (*outer, geo.num_pages) if lay.order == "layer_first" else (geo.num_pages, *outer)
        return self.device.view(self.buffer, geo.offset, (*shape, *lay.fragment_shape), lay.dtype)

    def kv_cache(self, component: int, layer: int) -> Any | None:
        """One (component, layer) cache as [pages, *fragment] (strided when page-first)."""
        geo = self.geometry
        if geo is None:
            return None
        lay, spec = geo.layout, geo.layer_spec(component, layer)
        shape = (spec.rows, *lay.fragment_shape)
        strides = (spec.stride // dtype_bytes(lay.dtype), *contiguous_strides(lay.fragment_shape))
        return self.device.view(self.buffer, spec.offset, shape, lay.dtype, strides)

    def allocate_pages(self, session: str, n: int) -> list[int] | None:
        """Append `n` pages to the session (lowest free rows, skipping rows under a staging write)."""
        if self.pages is None or self.staging is None:
            return None
        self.poll()
        pages = self.pages.allocate(session, n, self.staging.blocked_rows())
        if pages is None:
            return None
        self.staging.on_rows_allocated(pages)
        self.sessions.setdefault(session, []).extend(pages)
        return pages

    def session_pages(self, session: str) -> list[int]:
        return list(self.sessions.get(session, []))

    def free_session(self, session: str) -> None:
        """Give the session's pages back; pages an in-flight copy still touches are freed by `poll`."""
        pages = self.sessions.pop(session, [])
        if self.pages is None:
            return
        events = [e for e in self._save_events.pop(session, []) if not e.query()]
        if not self.host_kv.finish_restore(session, wait=False):
            events.append(self.host_kv.restores[session].event)
        if events:
            self.pages.reassign(pages, f"<copy:{session}>")
            self._deferred.append((session, events, pages))
        else:
            self.pages.free(pages)

    # ---- HKVR ------------------------------------------------------------------------------
    def checkpoint(self, session: str, hashes: list[str], now: float) -> int:
        """Queue the asynchronous D2H save of the session's full pages (one cumulative prefix hash
        per page, see `prefix_hashes`); returns the number of page copies issued."""
        pages = self.sessions.get(session, [])
        if self.active is None or self.geometry is None or not pages:
            return 0
        hashes = hashes[: len(pages)] if self.geometry.layout.family != "mamba" else hashes
        events = self.host_kv.save(self.geometry, self.buffer, self.active, session, hashes, pages)
        # keep only copies still in flight: a session that stays on device checkpoints every call
        pending = [e for e in self._save_events.get(session, []) if not e.query()]
        self._save_events[session] = pending + events
        return len(events)

    def poll(self, now: float = 0.0) -> int:
        """Commit finished copies and release pages they held; never blocks."""
        done = self.host_kv.poll()
        for session in list(self.host_kv.restores):
            self.host_kv.finish_restore(session, wait=False)
        self._release_deferred(wait=False)
        self._finish_stage_writes(wait=False)
        return done

    def _release_deferred(self, wait: bool) -> None:
        keep = []
        for session, events, pages in self._deferred:
            if wait:
                for e in events:
                    e.synchronize()
            if all(e.query() for e in events):
                self.host_kv.finish_restore(session, wait=True)
                if self.pages is not None:
                    self.pages.free(pages)
            else:
                keep.append((session, events, pages))
        self._deferred = keep

    def restore(self, session: str, hashes: list[str], now: float) -> RestoreResult | None:
        """Allocate pages and start the H2D restore of the session's agreed host prefix. None when
        the session already holds device pages, nothing is restorable, or pages run out."""
        geo = self.geometry
        if self.active is None or geo is None or self.sessions.get(session):
            return None
        blocks, covered = self.host_kv.restore_blocks(self.active, hashes, geo.layout.family)
        if not blocks:
            return None
        pages = self.allocate_pages(session, len(blocks))
        if pages is None:
            return None
        self.host_kv.restore(geo, self.buffer, session, self.active, blocks, pages)
        tokens = covered * geo.layout.page_size
        return RestoreResult(session, pages, covered, tokens, len(hashes) - covered)

    def wait_restore(self, session: str) -> None:
        self.host_kv.finish_restore(session, wait=True)

    def session_state(self, session: str, model: str | None = None) -> KVState:
        """The router-visible state of (session, model): device | host | missing."""
        model = model or self.active
        if model is not None and model == self.active and self.sessions.get(session):
            return KVState.DEVICE
        hashes = self.registry.session_hashes(model, session) if model else []
        family = self.models[model].kv_layout.family if model in self.models else "mha"
        if hashes and self.registry.restorable(model, hashes, family) > 0:
            return KVState.HOST
        return KVState.MISSING

    # ---- staging -----------------------------------------------------------------------------
    def stage(self, model: str, now: float) -> bool:
        """Start pre-staging `model` into the active pool's high tail; False if that cannot happen."""
        if self.staging is None or model == self.active or model not in self.models:
            return False
        self._finish_stage_writes(wait=True)
        entry = self.models[model]
        end = align_up(entry.nbytes, self.config.alignment)
        self.staging.target(model, entry.nbytes, end)
        return True

    def stage_step(self, now: float, max_chunks: int = 1) -> int:
        """Issue up to `max_chunks` H2D chunk writes; returns how many were issued."""
        issued = 0
        while self.staging is not None and issued < max_chunks:
            chunk = self.staging.next_write()
            if chunk is None:
                break
            entry = self.models[self.staging.model]
            specs = take_bytes(
                self.geometry.rows_specs(chunk.first_row, self.staging.chunk_rows), chunk.nbytes
            )
            event = self._copy_specs(specs, entry.host, chunk.src_offset, to_pool=True)
            self._stage_events.append((chunk.index, event))
            issued += 1
        return issued

    def _copy_specs(
        self, specs: list, flat: Any, flat_offset: int, to_pool: bool, d2d: bool = False
    ) -> CopyEvent:
        """Copy between pool views and a contiguous span of `flat` (host image or weight region)."""
        event = None
        for spec in specs:
            pool = self.device.view(
                self.buffer, spec.offset, (spec.rows, spec.width), "uint8", (spec.stride, 1)
            )
            span = self.device.view(flat, flat_offset, (spec.rows, spec.width))
            if d2d:
                event = self.device.copy_d2d(span, pool)
            else:
                event = (
                    self.device.copy_h2d(pool, span)
                    if to_pool
                    else self.device.copy_d2h(span, pool)
                )
            flat_offset += spec.nbytes
        return event

    def _finish_stage_writes(self, wait: bool) -> None:
        keep = []
        for index, event in self._stage_events:
            if wait:
                event.synchronize()
            if event.query() and self.staging is not None:
                self.staging.complete_write(index)
            elif not event.query():
                keep.append((index, event))
        self._stage_events = keep

    def staging_slack(self) -> int:
        return 0 if self.staging is None else self.staging.slack_bytes()

    # ---- switching and reports ----------------------------------------------------------------
    def switch_to(self, model: str, now: float) -> SwitchTiming | None:
        """Run the five switch phases (App. D); None if `model` is unknown, active, or cannot fit."""
        return run_switch(self, model, now)

    def region_addresses(self) -> dict[str, int]:
        base = self.device.address(self.buffer)
        return {name: base + off for name, off in self.layout.base_addresses().items()}

    def mark_graphs_captured(self, model: str) -> None:
        """Remember region addresses the engine's captured graphs hold for `model`."""
        self.models[model].captured = self.region_addresses()

    def pointer_check(self) -> PointerCheck | None:
        return self.last_pointer_check

    def inner_regions(self) -> list[Region]:
        return [] if self.staging is None else self.staging.regions()

    def layout_report(self) -> list[tuple[str, int, int, str]]:
        return self.layout.report(self.inner_regions())

    def check_integrity(self) -> None:
        self.layout.check_integrity(self.inner_regions())
        self.registry.check_integrity()
        if self.pages is not None:
            self.pages.check_integrity()
            owned = {p for pages in self.sessions.values() for p in pages}
            held = {p for _, _, pages in self._deferred for p in pages}
            if owned | held != {
                p for p in range(self.pages.num_pages) if not self.pages.is_free(p)
            }:
                raise AssertionError("session page lists disagree with the page allocator")
        if self.staging is not None:
            self.staging.check_integrity()
