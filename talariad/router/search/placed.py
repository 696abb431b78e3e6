"""The work the router placed, per (instance, model), (instance, None) and model, over a sliding
window: what the retirement rule, spare capacity and contention read (`CostModel`), kept so that
a lazy explanation can hold the sums of its moment for a small tuple (`logged.LoggedDict`).
"""

from __future__ import annotations

import heapq
from collections import defaultdict

from talariad.router.profiles import DemandTracker
from talariad.router.search.logged import LoggedDict
from talariad.router.telemetry import InstanceBook

_NO_NAMES: frozenset[str] = frozenset()


class PlacedWork(DemandTracker):
    """The work placed per (instance, model), (instance, None) and model, each counted from its
    forward until a window after its predicted end (`record`'s `until`); it also keeps, as dicts
    whose past states a lazy explanation keeps (`logged.LoggedDict`):
    - `kept[model]`: instance -> its (instance, model) sum, current where it was last read;
    - `busy`: instance -> its (instance, None) sum, current as of the last `advance`
    (`held_kept`, `held_busy`: their states now). A sum whose events all left its window reads
    exactly 0.0. When each sum is trimmed: docs/internals.md.
    """

    def __init__(self, window_s: float) -> None:
        super().__init__(window_s)
        self._kept: dict[str, LoggedDict] = {}
        self.kept: dict[str, dict[str, float]] = {}  # model -> its `_kept` entry's live dict
        self._logged_busy = LoggedDict()
        self.busy: dict[str, float] = self._logged_busy.live
        self._busy: defaultdict[str, set[str]] = defaultdict(set)  # model -> sum > 0 there
        self._due: defaultdict[str, list[tuple[float, str]]] = defaultdict(list)
        """model -> heap of (its oldest event's end, instance) over the (instance, model) windows"""
        # (instance, model) -> its entry in _due, (instance, None) -> its entry in _expiry
        self._head: dict[tuple[str, str | None], float] = {}
        # model -> (the `epoch` of `trim_due`'s `quiet`, entries of `_due` set aside under it)
        self._aside: dict[str, tuple[int, list[tuple[float, str]]]] = {}
        self._expiry: list[tuple[float, str]] = []
        """heap of (its oldest event's end, instance) over the (instance, None) windows (one
        entry a window's oldest end, not one an event: a burst's 100k were popped in one pick)"""

    def held_kept(self, model: str) -> tuple | None:
        """The state of `kept[model]` now, for a caller that keeps it (`logged.thaw`)."""
        kept = self._kept.get(model)
        return kept.frozen() if kept is not None else None

    def held_busy(self) -> tuple:
        """The state of `busy` now, for a caller that keeps it (`logged.thaw`)."""
        return self._logged_busy.frozen()

    def advance(self, now: float, limit: int | None = None) -> bool:
        """Trim every (instance, None) window to `now`, or at most `limit` of them (a step of
        the router's expiry, off the placements: a burst's windows left together, and trimming
        them all took a pick 20-45 ms at 1,000 boxes); True when more are due. A trim now is
        the one a later read would make, so steps change no sum that read gives."""
        expiry, cutoff = self._expiry, now - self._window
        steps = -1 if limit is None else limit
        while expiry and expiry[0][0] <= cutoff and steps != 0:
            steps -= 1
            head, inst = heapq.heappop(expiry)
            key = (inst, None)
            if self._head.get(key) != head:
                continue  # that window was trimmed since: a newer entry stands for it
            del self._head[key]
            self._trim(key, now)  # queues the window's new oldest event
        return bool(expiry) and expiry[0][0] <= cutoff

    def _trim(self, model, now: float) -> None:  # every change of a sum ends here (`record` too)
        super()._trim(model, now)
        if type(model) is tuple:
            self._sync(model)

    def _sync(self, key: tuple) -> None:
        inst, model = key
        total = self._sums[key]
        if model is None:
            if self.busy.get(inst) != total:
                self._logged_busy.set(inst, total)
            window = self._events[key]
            head = window.head() if window else None
            if head is not None and self._head.get(key) != head:
                self._head[key] = head
                heapq.heappush(self._expiry, (head, inst))
            return
        if total > 0.0:
            self._busy[model].add(inst)
        else:
            self._busy[model].discard(inst)
        kept = self._kept.get(model)
        if kept is None:
            kept = self._kept[model] = LoggedDict()
            self.kept[model] = kept.live
        if kept.live.get(inst) != total:
            kept.set(inst, total)
        window = self._events[key]
        head = window.head() if window else None
        if head is not None and self._head.get(key) != head:
            self._head[key] = head
            heapq.heappush(self._due[model], (head, inst))

    def trim_due(
        self, model: str, now: float, read, quiet: set[str] = _NO_NAMES, epoch: int = 0
    ) -> None:
        """Trim the (instance, model) windows that reading `work_s((instance, model), now)` for
        every instance with `read(instance)` would trim (those with an event past the window).
        `quiet`: instances `read` is false for as long as `epoch` stands (the caller's count of
        their leaving that set); their due windows wait aside until it moves, not read again
        at every call (docs/pool.md "Scale")."""
        due, cutoff, parked = self._due.get(model), now - self._window, []
        aside = self._aside.get(model)
        if aside is not None and aside[0] != epoch:
            for entry in aside[1]:
                heapq.heappush(due, entry)  # type: ignore[arg-type]
            aside = self._aside[model] = (epoch, [])
        while due and due[0][0] <= cutoff:
            head, inst = heapq.heappop(due)
            key = (inst, model)
            if self._head.get(key) != head:
                continue  # that window was trimmed since: a newer entry stands for it
            if not read(inst):
                if inst in quiet:
                    if aside is None:
                        aside = self._aside[model] = (epoch, [])
                    aside[1].append((head, inst))
                else:
                    parked.append((head, inst))  # not read: left as it is
                continue
            del self._head[key]
            self._trim(key, now)  # queues the window's new oldest event
        for entry in parked:
            heapq.heappush(due, entry)  # type: ignore[arg-type]
        if aside is not None and len(aside[1]) > 2 * len(self._head) + 64:
            kept = [(h, i) for h, i in aside[1] if self._head.get((i, model)) == h]
            self._aside[model] = (epoch, kept)  # drop the entries newer ones stand for

    def busy_names(self, model: str, instances: InstanceBook, now: float):
        """The names of `instances` with a positive window sum for `model` at `now`: those for
        which `work_s((name, model), now) > 0.0` holds, trims included (a live set or a new
        one: read it, do not keep it)."""
        self.trim_due(model, now, instances.__contains__)
        busy = self._busy.get(model)
        if not busy or instances.names() >= busy:
            return busy or _NO_NAMES
        return {inst for inst in busy if inst in instances}
