"""Model switch orchestration (App. D): five ordered phases and one timing record per TP rank.

1. save and teardown of the outgoing model (its HKVR saves drained, its KV region released);
2. open target weights: gather clean staged chunks D2D, reload the rest H2D (or the whole image);
3. restore the KV shell over the new gap (a hit when geometry equals the cached shell);
4. runtime and graph state: the pointer check says whether captured graphs stay valid;
5. publish: the target becomes the active model.

Each phase in full: docs/internals.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from talariad.memory.kv_layout import take_bytes
from talariad.memory.layout import align_up
from talariad.memory.staging import GatherPlan
from talariad.types import SwitchPath

if TYPE_CHECKING:
    from talariad.memory.models import ModelEntry
    from talariad.memory.substrate import Substrate

GRAPH_REGIONS = ("weights", "kv_pool", "graph_pool", "runtime")


@dataclass(frozen=True, slots=True)
class PointerCheck:
    """Region base addresses before and after a switch, against those the target's graphs captured."""

    before: dict[str, int]
    after: dict[str, int]
    captured: dict[str, int] | None

    @property
    def moved(self) -> list[str]:
        return [r for r in GRAPH_REGIONS if self.before.get(r) != self.after.get(r)]

    @property
    def graphs_valid(self) -> bool:
        cap = self.captured
        return cap is not None and all(cap.get(r) == self.after.get(r) for r in GRAPH_REGIONS)


@dataclass(frozen=True, slots=True)
class SwitchTiming:
    """One rank's SWITCH_TIMING line: feeds the router's switch cost and the dashboard."""

    rank: int
    from_model: str | None
    to_model: str
    path: SwitchPath
    phase_s: tuple[float, float, float, float, float]
    staged_bytes: int
    dirty_bytes: int
    h2d_bytes: int
    d2d_gather_s: float
    h2d_gather_s: float
    kv_shell_hit: bool
    graphs_valid: bool
    drained_saves: int
    now: float

    @property
    def total_s(self) -> float:
        return sum(self.phase_s)


def _teardown(sub: Substrate) -> int:
    out = sub.active
    if out is None:
        return 0
    drained = sub.host_kv.drain(out)
    sub.host_kv.finish_restores(out, wait=True)  # a DMA in flight cannot be cancelled: let it land
    sub._release_deferred(wait=True)
    sub.sessions.clear()
    sub._save_events.clear()
    sub.pages = None
    return drained


def _usable_plan(sub: Substrate, entry: ModelEntry) -> GatherPlan | None:
    staging = sub.staging
    if staging is None or staging.model != entry.name:
        return None
    sub._finish_stage_writes(wait=True)
    staging.check_integrity()
    plan = staging.gather_plan()
    weight_end = align_up(entry.nbytes, sub.config.alignment)
    # A layout change since staging began (post-processed weights) voids the staged chunks.
    fits = plan is not None and sum(c.nbytes for c in staging.chunks) == entry.nbytes
    return plan if fits and staging.weight_end >= weight_end else None


def _open_weights(sub: Substrate, entry: ModelEntry) -> tuple[GatherPlan | None, float, float]:
    plan = _usable_plan(sub, entry)
    sub.layout.resize_weights(entry.name, entry.nbytes)
    dev, clock = sub.device, sub.clock
    t0 = clock()
    event = None
    for c in plan.d2d if plan else ():
        specs = take_bytes(sub.geometry.rows_specs(c.first_row, sub.staging.chunk_rows), c.nbytes)
        event = sub._copy_specs(specs, sub.buffer, c.src_offset, to_pool=False, d2d=True)
    if event is not None:
        event.synchronize()
    t1 = clock()
    spans = [(c.src_offset, c.nbytes) for c in plan.h2d] if plan else [(0, entry.nbytes)]
    event = None
    for off, n in spans:
        if n:
            event = dev.copy_h2d(dev.view(sub.buffer, off, (n,)), dev.view(entry.host, off, (n,)))
    if event is not None:
        event.synchronize()
    return plan, t1 - t0, clock() - t1


def _path(plan: GatherPlan | None) -> SwitchPath:
    if plan is None or not plan.d2d:
        return SwitchPath.H2D
    return SwitchPath.D2D if not plan.h2d else SwitchPath.PARTIAL


def run_switch(sub: Substrate, target: str, now: float) -> SwitchTiming | None:
    entry = sub.models.get(target)
    if entry is None or target == sub.active or not sub.layout.can_resize_weights(entry.nbytes):
        return None
    clock, source = sub.clock, sub.active
    marks = [clock()]
    before = sub.region_addresses()
    drained = _teardown(sub)  # phase 1
    marks.append(clock())
    plan, d2d_s, h2d_s = _open_weights(sub, entry)  # phase 2
    marks.append(clock())
    hit = sub._open_pool(target)  # phase 3
    marks.append(clock())
    check = PointerCheck(before, sub.region_addresses(), entry.captured)  # phase 4
    sub.last_pointer_check = check
    marks.append(clock())
    sub.active = target  # phase 5
    marks.append(clock())
    phases = tuple(b - a for a, b in zip(marks, marks[1:], strict=False))
    record = SwitchTiming(
        sub.config.tp_rank,
        source,
        target,
        _path(plan),
        phases,
        plan.staged_bytes if plan else 0,
        plan.dirty_bytes if plan else 0,
        plan.h2d_bytes if plan else entry.nbytes,
        d2d_s,
        h2d_s,
        hit,
        check.graphs_valid,
        drained,
        now,
    )
    sub.records.append(record)
    return record


def switch_all(ranks: list[Substrate], target: str, now: float) -> list[SwitchTiming] | None:
    """Switch every TP rank; the logical switch latency is the slowest record's total."""
    if any(
        not r.layout.can_resize_weights(r.models[target].nbytes)
        for r in ranks
        if target in r.models
    ):
        return None
    records = [run_switch(r, target, now) for r in ranks]
    return None if any(rec is None for rec in records) else records
