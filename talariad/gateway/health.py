"""Readiness with hysteresis, and which instances can take a model's calls now.

`/health` (liveness) answers while the daemon's loop runs; `/ready` (readiness) is 200 when every
configured model has at least one instance that can take its calls (`availability`). An instance
stops being ready after exactly `unready_after` consecutive failed telemetry polls (or when its
process is not running), and is ready again after one good poll.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


@dataclass
class _Polls:
    misses: int = 0
    last_ok: float | None = None

    def ready(self, unready_after: int) -> bool:
        return self.last_ok is not None and self.misses < unready_after


class Readiness:
    """Sans-IO: fed poll outcomes with their time, asked whether an instance is ready.

    Counted in polls, not seconds: a stalled instance's polls each run to the poll timeout, so a
    bound in seconds would flip before the N-th failure."""

    def __init__(self, unready_after: int):
        self.unready_after = unready_after
        self._polls: dict[str, _Polls] = {}

    def polled(self, instance: str, ok: bool, now: float) -> bool:
        """Record one poll; True when it changed the instance's readiness."""
        p = self._polls.setdefault(instance, _Polls())
        before = p.ready(self.unready_after)
        if ok:
            p.misses, p.last_ok = 0, now
        else:
            p.misses += 1
        return p.ready(self.unready_after) != before

    def down(self, instance: str) -> None:
        """The process is gone: not ready until a restarted one answers a poll."""
        self._polls.pop(instance, None)

    def failed_polls(self, instance: str) -> int:
        p = self._polls.get(instance)
        return p.misses if p else 0

    def ready(self, instance: str) -> bool:
        p = self._polls.get(instance)
        return p is not None and p.ready(self.unready_after)


@dataclass(frozen=True, slots=True)
class InstanceView:
    """What decides whether an instance can take a model's new calls now."""

    name: str
    hosts: tuple[str, ...]
    """Models its config (or a run-time pool move) gives it."""
    serving: tuple[str, ...]
    """Models in its rotation now (run-time unloads drop out)."""
    state: str
    """The supervisor's process state (`ready` when running)."""
    ready: bool
    """Its telemetry polls answer (`Readiness`)."""
    admission: str
    """open, cordoned, draining or drained."""
    failed_polls: int

    def refusal(self, model: str) -> str | None:
        """Why it cannot take `model`'s new calls now; None when it can."""
        if self.state != "ready":
            return f"{self.name} is not running ({self.state})"
        if not self.ready:
            return f"{self.name} is unready ({self.failed_polls} failed telemetry polls)"
        if model not in self.serving:
            return f"{self.name} has {model} unloaded"
        if self.admission != "open":
            return f"{self.name} is {self.admission}"
        return None


class Availability(NamedTuple):
    takers: list[str]
    """Instances that take the model's new calls now."""
    refusals: list[str]
    """Why each other instance hosting it does not."""

    @property
    def why(self) -> str | None:
        """None when some instance takes the model's calls, else why none does."""
        if self.takers:
            return None
        return "; ".join(self.refusals) or "no instance serves it"


def availability(model: str, views: list[InstanceView]) -> Availability:
    takers, refusals = [], []
    for v in views:
        if model not in v.hosts and model not in v.serving:
            continue
        why = v.refusal(model)
        if why is None:
            takers.append(v.name)
        else:
            refusals.append(why)
    return Availability(takers, refusals)
