"""Byte-level memory bookkeeping of one simulated instance: host-restorable KV capacity (HKVR),
device KV pressure, opportunistic D2D weight staging and the HBM footprint. Sizes are per GPU of
the TP group unless named otherwise; nothing here reads a clock or moves bytes.

This is the simulator's adapter onto the memory substrate's *behaviour*, not onto
`talariad.memory` itself: the substrate tracks pages, prefix hashes and staging chunks per rank
(exact, but far too fine for a sweep of 100B-model replays), so the simulator keeps the same
three facts at session/byte granularity:
- HKVR: a host arena of `host_kv_bytes` (box host memory minus the host copies of every model's
  weights) holding session prefixes in LRU order; an evicted prefix becomes MISSING.
- device KV: the active model's KV may use the managed HBM left after its weights; beyond that
  the least recently used idle prefixes leave the device (to host with HKVR, else lost).
- staging: after a switch into model A, the next model's weights are copied H2D into the HBM
  slack (managed HBM - A's weights - A's device KV) at the box's H2D rate; at the next switch
  the staged share decides the path (all staged: d2d, some: partial, none: h2d). KV growth that
  overlaps the staged range shrinks it (the paper's dirty chunks, reloaded from host).
`MemoryModel` is the interface a finer substrate-backed implementation can replace.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

from talariad.types import SwitchPath

MEM_FRACTION = 0.8  # App. E: mem-fraction-bump = 0.8 of HBM is the managed layout


@dataclass(frozen=True, slots=True)
class MemorySpec:
    hbm_bytes: int  # managed HBM per GPU
    host_kv_bytes: int  # host arena for KV, whole box
    tp: int
    h2d_bytes_per_s: float | None  # staging rate per GPU; None: staging is instantaneous
    weight_bytes: dict[str, int] = field(default_factory=dict)
    kv_bytes_per_token: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SwitchPlan:
    path: SwitchPath
    uncovered: float  # share of the target's weights opened over H2D
    staged_bytes: int


Key = tuple[str, str]  # (session, model)


class MemoryModel(Protocol):
    def plan_switch(self, active: str | None, target: str, device_kv_bytes: int, now: float) -> SwitchPlan: ...
    def switched(self, now: float) -> None: ...
    def save(self, entries: list[tuple[Key, int]]) -> list[Key]: ...
    def touch(self, key: Key) -> None: ...
    def kv_budget_bytes(self, active: str) -> int: ...
    def footprint(self, active: str | None, target: str | None, device_kv_bytes: int, now: float) -> int: ...


def memory_spec(pset) -> MemorySpec:
    """Per-GPU managed HBM and the host KV arena (host memory minus every model's host weights),
    from a `ProfileSet`."""
    box = pset.box
    weights = {m: s.weight_bytes_per_gpu or s.profile.weight_bytes for m, s in pset.models.items()}
    kv = {m: s.kv_bytes_per_token_per_gpu or s.profile.kv_bytes_per_token
          for m, s in pset.models.items()}
    host_kv = box.host_memory_bytes - box.tp * sum(weights.values())
    return MemorySpec(int(box.hbm_per_gpu_bytes * MEM_FRACTION), max(host_kv, 0), box.tp,
                      box.h2d_bytes_per_s, weights, kv)


class SimMemory:
    """See the module docstring. `d2d` and `host_kv` are the ablation switches."""

    def __init__(self, spec: MemorySpec, d2d: bool = True, host_kv: bool = True) -> None:
        self.spec, self.d2d, self.host_kv = spec, d2d, host_kv
        self.host: OrderedDict[Key, int] = OrderedDict()  # LRU first
        self.host_used = 0
        self.stage_from = 0.0  # when staging for the next switch could start
        self.host_evictions = 0

    # ---- staging and switches -------------------------------------------------------------

    def staged_bytes(self, active: str | None, target: str, device_kv_bytes: int, now: float) -> int:
        if not self.d2d or active is None:
            return 0
        s = self.spec
        slack = s.hbm_bytes - s.weight_bytes.get(active, 0) - device_kv_bytes
        copied = float("inf") if s.h2d_bytes_per_s is None else s.h2d_bytes_per_s * max(now - self.stage_from, 0.0)
        return int(max(0.0, min(s.weight_bytes.get(target, 0), slack, copied)))

    def plan_switch(self, active: str | None, target: str, device_kv_bytes: int, now: float) -> SwitchPlan:
        weight = self.spec.weight_bytes.get(target, 0)
        staged = self.staged_bytes(active, target, device_kv_bytes, now)
        if not self.d2d or staged <= 0 or weight <= 0:
            return SwitchPlan(SwitchPath.D2D if self.d2d and weight <= 0 else SwitchPath.H2D,
                              0.0 if self.d2d and weight <= 0 else 1.0, staged)
        if staged >= weight:
            return SwitchPlan(SwitchPath.D2D, 0.0, staged)
        return SwitchPlan(SwitchPath.PARTIAL, 1.0 - staged / weight, staged)

    def switched(self, now: float) -> None:
        """A switch finished: staging for the next one starts now."""
        self.stage_from = now

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
        return max(self.spec.hbm_bytes - self.spec.weight_bytes.get(active, 0), 0)

    def kv_bytes(self, model: str, tokens: int) -> int:
        return tokens * self.spec.kv_bytes_per_token.get(model, 0)

    def footprint(self, active: str | None, target: str | None, device_kv_bytes: int, now: float) -> int:
        """Per-GPU HBM in use: active weights + staged next weights + the active model's KV."""
        if active is None:
            return 0
        staged = self.staged_bytes(active, target, device_kv_bytes, now) if target else 0
        return self.spec.weight_bytes.get(active, 0) + staged + device_kv_bytes

    def check_integrity(self) -> None:
        if self.host_used != sum(self.host.values()) or self.host_used < 0:
            raise RuntimeError(f"sim memory: host_used {self.host_used} != sum of entries")
        if self.host_kv and self.host_used > self.spec.host_kv_bytes:
            raise RuntimeError("sim memory: host KV over capacity")
