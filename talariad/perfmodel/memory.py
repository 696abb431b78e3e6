"""Byte-level memory bookkeeping of one simulated instance: host KV (HKVR), device KV pressure,
D2D weight staging (§4.4, App. D) and the HBM footprint. Sizes are per GPU of the TP group unless
named otherwise; nothing here reads a clock or moves bytes.

The simulator's adapter onto the memory substrate's behaviour, at session/byte granularity. The
staged share decides a switch's path (all: d2d, some: partial, none: h2d); KV growth dirties
staged bytes. `MemoryModel` is the interface a substrate-backed one can replace.
Design: docs/internals.md.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

from talariad.types import SwitchPath


@dataclass(frozen=True, slots=True)
class SwitchPrices:
    """What a switch costs, from the mechanism: per path, phases 1, 3, 4, 5 (seconds); phase 2's
    fixed part; the D2D gather rate (bytes/s per GPU). H2D uses `MemorySpec.h2d_bytes_per_s`."""

    other_s: dict[SwitchPath, tuple[float, float, float, float]]
    open_fixed_s: float
    d2d_bytes_per_s: float


@dataclass(frozen=True, slots=True)
class MemorySpec:
    hbm_bytes: int  # managed HBM per GPU
    host_kv_bytes: int  # host arena for KV, whole box
    tp: int
    h2d_bytes_per_s: float | None  # staging rate per GPU; None: staging is instantaneous
    weight_bytes: dict[str, int] = field(default_factory=dict)
    kv_bytes_per_token: dict[str, int] = field(default_factory=dict)
    resident_bytes: int | None = None
    """Managed HBM per GPU that resident weights may fill (None: one model's weights at a time,
    the others staged or opened from host)."""
    prices: SwitchPrices | None = None
    """Set: switches are priced by `SimMemory.switch_phases`; None: by the profile's table."""


@dataclass(frozen=True, slots=True)
class SwitchPlan:
    path: SwitchPath
    uncovered: float  # share of the target's weights opened over H2D
    staged_bytes: int  # clean staged bytes, gathered D2D
    dirty_bytes: int = 0  # staged bytes KV growth overwrote since (reloaded from host)


Key = tuple[str, str]  # (session, model)


class MemoryModel(Protocol):
    def plan_switch(
        self, active: str | None, target: str, device_kv_bytes: int, now: float
    ) -> SwitchPlan: ...
    def switched(self, now: float, target: str | None, device_kv_bytes: int = 0) -> None: ...
    def save(self, entries: list[tuple[Key, int]]) -> list[Key]: ...
    def touch(self, key: Key) -> None: ...
    def kv_budget_bytes(self, active: str) -> int: ...
    def footprint(
        self, active: str | None, target: str | None, device_kv_bytes: int, now: float
    ) -> int: ...


def memory_spec(pset) -> MemorySpec:
    """Per-GPU managed HBM and the host KV arena (host memory minus every model's host weights),
    from a `ProfileSet`."""
    box = pset.box
    weights = {m: s.weight_bytes_per_gpu or s.profile.weight_bytes for m, s in pset.models.items()}
    kv = {
        m: s.kv_bytes_per_token_per_gpu or s.profile.kv_bytes_per_token
        for m, s in pset.models.items()
    }
    host_kv = box.host_memory_bytes - box.tp * sum(weights.values())
    managed = int(box.hbm_per_gpu_bytes * box.mem_fraction_bump)
    reserve = box.kv_reserve_bytes_per_gpu
    prices = (
        SwitchPrices(box.switch_phases_s, box.open_fixed_s, box.d2d_bytes_per_s)
        if box.switch_phases_s and box.d2d_bytes_per_s and box.h2d_bytes_per_s
        else None
    )
    return MemorySpec(
        managed,
        max(host_kv, 0),
        box.tp,
        box.h2d_bytes_per_s,
        weights,
        kv,
        None if reserve is None else max(managed - reserve, 0),
        prices,
    )


class SimMemory:
    """See the module docstring (design: docs/internals.md). `d2d` and `host_kv` are the ablation
    switches."""

    def __init__(self, spec: MemorySpec, d2d: bool = True, host_kv: bool = True) -> None:
        self.spec, self.d2d, self.host_kv = spec, d2d, host_kv
        self.host: OrderedDict[Key, int] = OrderedDict()  # LRU first
        self.host_used = 0
        self.stage_from = 0.0  # when staging for the next switch could start
        self.stage_target: str | None = None  # what is being staged; None: the first switch's pick
        self.kv_peak = 0  # the device KV high-water mark since staging began
        self.kv_start = 0  # the device KV when staging began (the staged range starts above it)
        self.link_busy_s = 0.0  # H2D link time taken by KV restores since staging began
        self.host_evictions = 0
        self.resident: OrderedDict[str, None] = OrderedDict()  # least recently active first

    # ---- resident weights (`MemorySpec.resident_bytes`) -----------------------------------

    @property
    def keeps_weights(self) -> bool:
        return self.spec.resident_bytes is not None

    def make_resident(self, target: str) -> list[str]:
        """`target` is now the active model: it becomes the most recent resident; returns the
        models evicted (least recently active first) so that the resident weights fit."""
        self.resident.pop(target, None)
        self.resident[target] = None
        weights, budget = self.spec.weight_bytes, self.spec.resident_bytes or 0
        used = sum(weights.get(m, 0) for m in self.resident)
        evicted = []
        for model in list(self.resident):
            if used <= budget or model == target:
                break
            del self.resident[model]
            used -= weights.get(model, 0)
            evicted.append(model)
        return evicted

    def resident_weight_bytes(self, active: str | None) -> int:
        """Weights on device: every resident model's, or (staging mode) the active one's."""
        if self.keeps_weights:
            return sum(self.spec.weight_bytes.get(m, 0) for m in self.resident)
        return self.spec.weight_bytes.get(active, 0) if active else 0

    # ---- staging and switches -------------------------------------------------------------

    def staged_bytes(
        self, active: str | None, target: str, device_kv_bytes: int, now: float
    ) -> int:
        """Clean staged bytes of `target`: 0 unless it is the model being staged."""
        return self._staged(active, target, device_kv_bytes, now)[0]

    def _staged(
        self, active: str | None, target: str, device_kv_bytes: int, now: float
    ) -> tuple[int, int]:
        """(clean, dirty) staged bytes of `target`: what the link copied into the slack above
        the device KV as it stood when staging began, and of that what KV growth overwrote."""
        if self.keeps_weights or not self.d2d or active is None or target != self.stage_target:
            return 0, 0
        s = self.spec
        room = s.hbm_bytes - s.weight_bytes.get(active, 0)
        copied = min(
            float(s.weight_bytes.get(target, 0)),
            float("inf")
            if s.h2d_bytes_per_s is None
            else s.h2d_bytes_per_s * max(now - self.stage_from - self.link_busy_s, 0.0),
        )
        written = max(0.0, min(copied, room - self.kv_start))
        clean = max(0.0, min(copied, room - max(self.kv_peak, device_kv_bytes)))
        return int(clean), int(max(written - clean, 0.0))

    def plan_switch(
        self, active: str | None, target: str, device_kv_bytes: int, now: float
    ) -> SwitchPlan:
        weight = self.spec.weight_bytes.get(target, 0)
        if self.keeps_weights:  # resident: no weight copy; else a full open (the caller's)
            resident = target in self.resident
            return SwitchPlan(SwitchPath.D2D if resident else SwitchPath.H2D, 0.0, weight)
        staged, dirty = self._staged(active, target, device_kv_bytes, now)
        if not self.d2d or staged <= 0 or weight <= 0:
            return SwitchPlan(
                SwitchPath.D2D if self.d2d and weight <= 0 else SwitchPath.H2D,
                0.0 if self.d2d and weight <= 0 else 1.0,
                staged,
                dirty,
            )
        if staged >= weight:
            return SwitchPlan(SwitchPath.D2D, 0.0, staged, dirty)
        return SwitchPlan(SwitchPath.PARTIAL, 1.0 - staged / weight, staged, dirty)

    def switch_phases(self, target: str, plan: SwitchPlan) -> tuple[float, ...] | None:
        """Seconds of the switch's five phases (App. D) when the box prices switches from the
        mechanism (`MemorySpec.prices`), else None. Phase 2 opens the target's weights: its
        fixed part, the D2D gather of the clean staged bytes, the H2D copy of the rest; a switch
        to a resident model (`keeps_weights`) copies nothing."""
        t, s = self.spec.prices, self.spec
        if t is None or not s.h2d_bytes_per_s:
            return None
        weight = s.weight_bytes.get(target, 0)
        if self.keeps_weights and plan.path is SwitchPath.D2D:
            d2d = h2d = 0.0
        else:
            d2d = min(plan.staged_bytes, weight) if plan.path is not SwitchPath.H2D else 0
            h2d = weight - d2d
        p2 = t.open_fixed_s + d2d / t.d2d_bytes_per_s + h2d / s.h2d_bytes_per_s
        p1, p3, p4, p5 = t.other_s[plan.path]
        return (p1, p2, p3, p4, p5)

    def switched(self, now: float, target: str | None, device_kv_bytes: int = 0) -> None:
        """A switch finished with `device_kv_bytes` of KV left on device (rows parked for other
        models, the new model's retained rows): staging of `target` for the next one starts now,
        in the slack above them."""
        self.stage_from, self.stage_target, self.link_busy_s = now, target, 0.0
        self.kv_start = self.kv_peak = max(device_kv_bytes, 0)

    def note_restore(self, seconds: float) -> None:
        """An HKVR restore used the H2D link for `seconds`: staging shares that link (one PCIe
        link per GPU carries both), so it pauses meanwhile."""
        self.link_busy_s += max(seconds, 0.0)

    def note_kv(self, device_kv_bytes: int) -> None:
        """The active model's device KV now; its peak since staging began dirties staged chunks."""
        self.kv_peak = max(self.kv_peak, device_kv_bytes)

    def coverage(self, active: str | None, device_kv_bytes: int, now: float) -> float:
        """Share of the staging target's weights staged and clean now (the staging telemetry)."""
        target = self.stage_target
        weight = self.spec.weight_bytes.get(target, 0) if target else 0
        if weight <= 0:
            return 0.0
        return self.staged_bytes(active, target, device_kv_bytes, now) / weight

    # ---- host KV (HKVR) -------------------------------------------------------------------

    def host_bytes(self, model: str, kv_len: int) -> int:
        return kv_len * self.spec.kv_bytes_per_token.get(model, 0) * self.spec.tp

    def save(self, entries: list[tuple[Key, int]]) -> list[Key]:
        """Prefixes written to host (key, kv_len); returns the keys evicted to make room (LRU)."""
        if not self.host_kv:
            return []
        for key, kv_len in entries:
            self.host_used -= self.host.pop(key, 0)
            self.host[key] = self.host_bytes(key[1], kv_len)
            self.host_used += self.host[key]
        evicted = []
        while self.host_used > self.spec.host_kv_bytes and self.host:
            key, size = self.host.popitem(last=False)
            self.host_used -= size
            evicted.append(key)
        self.host_evictions += len(evicted)
        return evicted

    def touch(self, key: Key) -> None:
        if key in self.host:
            self.host.move_to_end(key)

    # ---- device KV and footprint ----------------------------------------------------------

    def kv_budget_bytes(self, active: str) -> int:
        return max(self.spec.hbm_bytes - self.resident_weight_bytes(active), 0)

    def reclaimable_bytes(self, active: str | None, in_use: set[str], device_kv_bytes: int) -> int:
        """HBM a new call or an open may take without evicting a model in use (active, or with
        calls on the instance): free room plus the weights of idle resident models, which an open
        evicts; `device_kv_bytes` is the KV that calls on the instance hold (idle prefixes are
        cache that moves to host under pressure). Staging mode: only the active model's weights
        are on device."""
        weights = self.spec.weight_bytes
        if self.keeps_weights:
            held = sum(weights.get(m, 0) for m in self.resident if m in in_use or m == active)
        else:
            held = weights.get(active, 0) if active else 0
        return max(self.spec.hbm_bytes - held - device_kv_bytes, 0)

    def kv_bytes(self, model: str, tokens: int) -> int:
        return tokens * self.spec.kv_bytes_per_token.get(model, 0)

    def footprint(
        self, active: str | None, target: str | None, device_kv_bytes: int, now: float
    ) -> int:
        """Per-GPU HBM in use: active weights + staged next weights + the active model's KV."""
        if active is None:
            return 0
        staged = self.staged_bytes(active, target, device_kv_bytes, now) if target else 0
        return self.resident_weight_bytes(active) + staged + device_kv_bytes

    def check_integrity(self) -> None:
        if self.host_used != sum(self.host.values()) or self.host_used < 0:
            raise RuntimeError(f"sim memory: host_used {self.host_used} != sum of entries")
        if self.host_kv and self.host_used > self.spec.host_kv_bytes:
            raise RuntimeError("sim memory: host KV over capacity")
