"""Per-model latency profiles refreshed by EWMA from round summaries, and observed demand.

The demand tracker feeds the gain side of Eq. (2): the work of arrivals seen over the last
control window, taken as the prediction for the next one.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import defaultdict

from talariad.types import LatencyProfile, RoundMeasurement, SwitchPath

_DEFAULT = LatencyProfile()


class ProfileBook:
    """The router's current cost model per model; an unknown model gets `LatencyProfile()`."""

    def __init__(self, profiles: dict[str, LatencyProfile], alpha: float) -> None:
        self._profiles = dict(profiles)
        self._alpha = alpha
        self.epoch = 0  # bumped on every refresh, so cached cost rows know they are old

    def get(self, model: str) -> LatencyProfile:
        return self._profiles.get(model, _DEFAULT)

    def all(self) -> dict[str, LatencyProfile]:
        return dict(self._profiles)

    def put(self, model: str, prof: LatencyProfile) -> bool:
        """Take `prof` for `model` as it is (measured elsewhere); False when it is unchanged."""
        if self._profiles.get(model) == prof:
            return False
        self._profiles[model] = prof
        self.epoch += 1
        return True

    def refresh(self, model: str, m: RoundMeasurement) -> LatencyProfile:
        """Fold one round's measurements into the model's profile (EWMA, weight alpha)."""
        prof = self.get(model)
        changes: dict[str, object] = {}
        if m.prefill_tokens > 0 and m.prefill_s > 0:
            per_token = max(0.0, m.prefill_s - prof.prefill_base_s) / m.prefill_tokens
            changes["prefill_s_per_token"] = self._mix(prof.prefill_s_per_token, per_token)
        if m.decode_steps > 0 and m.decode_s > 0:
            changes["decode_step_s"] = self._mix(prof.decode_step_s, m.decode_s / m.decode_steps)
        if m.restored_tokens > 0 and m.restore_s > 0:
            rate = m.restore_s / m.restored_tokens
            changes["restore_s_per_token"] = self._mix(prof.restore_s_per_token, rate)
        if m.switch_path is not None and m.switch_s is not None and m.switch_s >= 0:
            changes.update(self._switch_changes(prof, m.switch_path, m.switch_s))
        if changes:
            prof = dataclasses.replace(prof, **changes)
            self._profiles[model] = prof
            self.epoch += 1
        return prof

    def _switch_changes(self, prof: LatencyProfile, path: SwitchPath, seconds: float) -> dict:
        table = dict(prof.switch_s or {})
        table[path] = self._mix(prof.switch_cost_s(path), seconds)
        changes: dict[str, object] = {"switch_s": table}
        if path is SwitchPath.H2D:
            # NOTE: a full H2D open is what "measured full-open cost" means for an absent model.
            changes["open_s"] = table[path]
        return changes

    def _mix(self, old: float, new: float) -> float:
        return (1.0 - self._alpha) * old + self._alpha * new


def switch_estimate(prof: LatencyProfile, staged_fraction: float) -> float:
    """Switch cost with `staged_fraction` of the weights staged: D2D for the staged part,
    H2D for the rest (App. D: partial staging lands between the two)."""
    f = min(max(staged_fraction, 0.0), 1.0)
    d2d, h2d = prof.switch_cost_s(SwitchPath.D2D), prof.switch_cost_s(SwitchPath.H2D)
    return d2d + (1.0 - f) * max(h2d - d2d, 0.0)


BUCKETS_PER_WINDOW = 8192
"""A window's events are kept by bucket of their ends, `window / BUCKETS_PER_WINDOW` wide."""
FREE_STEP = 512
"""Events of buckets that left their windows freed per step (`DemandTracker.free`, a telemetry
event's work), at most: freeing a burst's events where they left took a read 5-8 ms (cold
memory, not the trim's steps), and a step in every placement set the picks' p99 (2,048 events
a pick: its four records)."""
DROPPED_BACKLOG = 1024
"""Buckets that left their windows kept for `free` before a `record` frees a step itself (no
telemetry event freed them: a router placing with none)."""


class _Window:
    """One key's events by bucket of their ends (`DemandTracker`): `order` a heap of bucket
    numbers, `buckets` number -> [its events' work summed, a heap of (end, work)]. The bucket of
    an end is floor(end / width), which never decreases as the end grows: every event of an
    earlier bucket ends before every event of a later one, so a bucket before the cutoff's
    leaves whole, one pop, and only the cutoff's own bucket is popped event by event."""

    __slots__ = ("order", "buckets", "last")

    def __init__(self) -> None:
        self.order: list[int] = []
        self.buckets: dict[int, list] = {}
        self.last = -math.inf  # the latest end of its events (of any it had, once emptied)

    def __bool__(self) -> bool:
        return bool(self.order)

    def head(self) -> float:
        """The earliest end of its events (it has some)."""
        return self.buckets[self.order[0]][1][0][0]


class DemandTracker:
    """Work (seconds) per key over a sliding window. An event counts until a window after its
    `until` (default: when it is recorded). Events may end in any order (a short call placed
    after a long one ends first), so each key's events are kept by bucket of their ends
    (`_Window`): a trim costs one pop per bucket that left the window whole plus the events of
    one bucket, not one per event (100k calls placed within a second leave within a second: one
    read popped all of them, 30-100 ms, in the pool's picker after a burst)."""

    def __init__(self, window_s: float) -> None:
        self._window = window_s
        self._width = window_s / BUCKETS_PER_WINDOW if window_s > 0 else 1.0
        self._events: defaultdict[str, _Window] = defaultdict(_Window)
        self._sums: defaultdict[str, float] = defaultdict(float)
        self._dropped: list[list] = []  # buckets that left their windows, freed in steps

    @staticmethod
    def end_of(now: float, until: float | None) -> float:
        """When an event recorded at `now` with `until` ends: never before it was recorded."""
        return now if until is None or until < now else until

    def record(self, model: str, now: float, work_s: float, until: float | None = None) -> None:
        """`work_s` recorded at `now` that counts until a window after `until`."""
        end = self.end_of(now, until)
        window, number = self._events[model], math.floor(end / self._width)
        if window and window.last <= now - self._window:
            self._drop(model, window, now - self._window, -1)  # all left: before the new one
        bucket = window.buckets.get(number)
        if bucket is None:
            bucket = window.buckets[number] = [0.0, []]
            heapq.heappush(window.order, number)
        bucket[0] += work_s
        heapq.heappush(bucket[1], (end, work_s))
        if end > window.last:
            window.last = end
        self._sums[model] += work_s
        self._trim(model, now)
        if len(self._dropped) > DROPPED_BACKLOG:
            self._free(FREE_STEP)

    def free(self) -> None:
        """Free a step of the events that left their windows (off the placements)."""
        if self._dropped:
            self._free(FREE_STEP)

    def work_s(self, model: str, now: float) -> float:
        # NOTE: read for every instance of every placement: `_trim` and `max` inlined, same result
        window = self._events.get(model)
        if window and window.head() <= now - self._window:
            self._trim(model, now)
        total = self._sums.get(model, 0.0)
        return 0.0 if 0.0 > total else total  # max(total, 0.0), signed zero and NaN included

    def trim_due(self, now: float, limit: int) -> bool:
        """Drop at most `limit` buckets or events that left their windows by `now`, as reads
        would (a burst of calls recorded together leaves together: the call that reads the
        window next must not drop them all); True when more are due."""
        cutoff = now - self._window
        for model, window in self._events.items():
            if limit <= 0:
                break
            if window and window.head() <= cutoff:
                limit = self._drop(model, window, cutoff, limit)
        return any(w and w.head() <= cutoff for w in self._events.values())

    def _trim(self, model: str, now: float) -> None:
        window = self._events.get(model)
        if window:
            cutoff = now - self._window
            if window.head() > cutoff:
                return  # nothing left the window (most calls: one per record and read)
            self._drop(model, window, cutoff, -1)
        elif window is not None:
            # an empty window sums to exactly 0: a running sum's rounding residue (1e-15) must
            # not read as work kept there (the retirement rule compares it with > 0)
            self._sums[model] = 0.0

    def _drop(self, model: str, window: _Window, cutoff: float, limit: int) -> int:
        """Drop `window`'s events that ended by `cutoff`, at most `limit` buckets or events
        (-1: all); the limit left."""
        if window.last <= cutoff and limit != 0:
            # every event left (a key quiet since a burst: its first record after the window
            # popped a bucket an event, ~100 a box at 1,000 boxes): all out in one step
            self._dropped.extend(window.buckets.values())
            window.order, window.buckets = [], {}
            self._sums[model] = 0.0
            return limit - 1 if limit > 0 else limit
        order, buckets, total = window.order, window.buckets, self._sums[model]
        whole = math.floor(cutoff / self._width)  # a bucket before it ended by the cutoff
        while order and limit != 0:
            limit -= 1
            number = order[0]
            bucket = buckets[number]
            if number < whole:
                heapq.heappop(order)
                del buckets[number]
                total -= bucket[0]
                self._dropped.append(bucket)  # out of the sums: freed by `record`s
                continue
            events = bucket[1]
            while events and events[0][0] <= cutoff and limit != 0:
                work = heapq.heappop(events)[1]
                bucket[0] -= work
                total -= work
                limit -= 1
            if events:
                break
            heapq.heappop(order)
            del buckets[number]
        # an empty window sums to exactly 0 (see `_trim`)
        self._sums[model] = total if order else 0.0
        return limit

    def _free(self, count: int) -> None:
        """Free at most `count` events of the buckets that left their windows."""
        dropped = self._dropped
        while dropped and count > 0:
            events = dropped[-1][1]
            if len(events) > count:
                del events[len(events) - count :]
                return
            count -= len(events) + 1
            dropped.pop()
