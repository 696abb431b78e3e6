"""The placement interface the gateway calls, and the walking-skeleton placer behind it.

`Placer` is the contract the session-aware router implements; `SimplePlacer` places by model
residency first, then by least in-flight calls, using the latest instance telemetry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class CallInfo:
    call_id: str
    session_id: str | None
    model: str
    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Placement:
    instance: str | None
    """None: no instance can take the call now."""
    kind: str
    """Why: lease_hit, cost, residency, least_loaded, no_instance ..."""
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class Candidate:
    name: str
    models: tuple[str, ...]
    loaded: tuple[str, ...]
    healthy: bool


class Placer(Protocol):
    def place(self, call: CallInfo, candidates: list[Candidate], now: float) -> Placement: ...

    def completed(self, call_id: str, instance: str, kv_state: str, kv_len: int, now: float) -> None: ...

    def failed(self, call_id: str, now: float) -> None: ...


class SimplePlacer:
    def __init__(self) -> None:
        self.in_flight: dict[str, int] = {}
        self._where: dict[str, str] = {}

    def place(self, call: CallInfo, candidates: list[Candidate], now: float) -> Placement:
        hosts = [c for c in candidates if c.healthy and call.model in c.models]
        if not hosts:
            return Placement(None, "no_instance", retry_after_s=1.0)
        best = min(hosts, key=lambda c: (call.model not in c.loaded, self.in_flight.get(c.name, 0), c.name))
        self.in_flight[best.name] = self.in_flight.get(best.name, 0) + 1
        self._where[call.call_id] = best.name
        return Placement(best.name, "residency" if call.model in best.loaded else "least_loaded")

    def _release(self, call_id: str) -> None:
        name = self._where.pop(call_id, None)
        if name:
            self.in_flight[name] -= 1

    def completed(self, call_id: str, instance: str, kv_state: str, kv_len: int, now: float) -> None:
        self._release(call_id)

    def failed(self, call_id: str, now: float) -> None:
        self._release(call_id)
