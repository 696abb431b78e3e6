"""Readiness with hysteresis: one late or failed telemetry poll does not take an instance out.

`/health` (liveness) answers while the daemon's loop runs; `/ready` (readiness) is 200 when every
configured model has at least one ready instance. An instance stops being ready after
`unready_after` consecutive failed polls (or when its process is not running, or when no poll has
succeeded for `unready_after` staleness periods), and is ready again after one good poll.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Polls:
    misses: int = 0
    last_ok: float | None = None


class Readiness:
    """Sans-IO: fed poll outcomes with their time, asked whether an instance is ready at `now`."""

    def __init__(self, unready_after: int, stale_after_s: float):
        self.unready_after, self.stale_after_s = unready_after, stale_after_s
        self._polls: dict[str, _Polls] = {}

    def polled(self, instance: str, ok: bool, now: float) -> None:
        p = self._polls.setdefault(instance, _Polls())
        if ok:
            p.misses, p.last_ok = 0, now
        else:
            p.misses += 1

    def down(self, instance: str) -> None:
        """The process is gone: not ready until a restarted one answers a poll."""
        self._polls.pop(instance, None)

    def failed_polls(self, instance: str) -> int:
        p = self._polls.get(instance)
        return p.misses if p else 0

    def ready(self, instance: str, now: float) -> bool:
        p = self._polls.get(instance)
        if p is None or p.last_ok is None:
            return False
        return (
            p.misses < self.unready_after
            and now - p.last_ok < self.unready_after * self.stale_after_s
        )
