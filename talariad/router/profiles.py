"""Per-model latency profiles refreshed by EWMA from round summaries, and observed demand.

The demand tracker feeds the gain side of Eq. (2): the work of arrivals seen over the last
control window, taken as the prediction for the next one.
"""

from __future__ import annotations

import dataclasses
import heapq
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


class DemandTracker:
    """Work (seconds) per key over a sliding window; O(log n) per event. An event counts until a
    window after its `until` (default: when it is recorded). Events may end in any order (a short
    call placed after a long one ends first), so each window is a heap on the event's end."""

    def __init__(self, window_s: float) -> None:
        self._window = window_s
        self._events: defaultdict[str, list[tuple[float, float]]] = defaultdict(list)
        self._sums: defaultdict[str, float] = defaultdict(float)

    @staticmethod
    def end_of(now: float, until: float | None) -> float:
        """When an event recorded at `now` with `until` ends: never before it was recorded."""
        return now if until is None or until < now else until

    def record(self, model: str, now: float, work_s: float, until: float | None = None) -> None:
        """`work_s` recorded at `now` that counts until a window after `until`."""
        heapq.heappush(self._events[model], (self.end_of(now, until), work_s))
        self._sums[model] += work_s
        self._trim(model, now)

    def work_s(self, model: str, now: float) -> float:
        # NOTE: read for every instance of every placement: `_trim` and `max` inlined, same result
        events = self._events.get(model)
        if events and events[0][0] <= now - self._window:
            self._trim(model, now)
        total = self._sums.get(model, 0.0)
        return 0.0 if 0.0 > total else total  # max(total, 0.0), signed zero and NaN included

    def trim_due(self, now: float, limit: int) -> bool:
        """Drop at most `limit` events that left their windows by `now`, as reads would (a
        burst of calls recorded together leaves together: the call that reads the window
        next must not drop them all); True when more are due."""
        cutoff = now - self._window
        for model, events in self._events.items():
            if limit <= 0:
                return any(e and e[0][0] <= cutoff for e in self._events.values())
            if not events or events[0][0] > cutoff:
                continue
            total = self._sums[model]
            while events and events[0][0] <= cutoff and limit > 0:
                total -= heapq.heappop(events)[1]
                limit -= 1
            self._sums[model] = total if events else 0.0
        return any(e and e[0][0] <= cutoff for e in self._events.values())

    def _trim(self, model: str, now: float) -> None:
        events = self._events.get(model)
        if events:
            cutoff = now - self._window
            if events[0][0] > cutoff:
                return  # nothing left the window (most calls: one per record and read)
            total = self._sums[model]
            while events and events[0][0] <= cutoff:
                total -= heapq.heappop(events)[1]
            self._sums[model] = total
        if events is not None and not events:
            # an empty window sums to exactly 0: a running sum's rounding residue (1e-15) must
            # not read as work kept there (the retirement rule compares it with > 0)
            self._sums[model] = 0.0
