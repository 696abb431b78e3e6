"""A dict whose past states can be kept for a small tuple each: the books lazy explanations read.

`LoggedDict.live` is an ordinary dict, changed in place and read directly on the hot path. Each
`set` also appends the key and value to a log over a base dict that is never changed, so
`frozen()` names the current state as (base, keys, values, length) and `thaw` rebuilds it when
an explanation is read. Once the log is longer than the dict, the next `set` starts a new base
(a copy of `live`) and a new log: a `set` costs O(1) amortised, and a kept state shares its
base and log with every other state of that stretch instead of holding a copy of the dict (a
copy per placement brings the next GC pass nearer and costs its freeing when the decision log
drops it).
"""

from __future__ import annotations

_SLACK = 16  # log entries allowed past the dict's size before a new base is started


class LoggedDict:
    """`live` plus an append-only log of its changes since a shared, never-changed base."""

    __slots__ = ("live", "_base", "_keys", "_values")

    def __init__(self) -> None:
        self.live: dict = {}
        self._base: dict = {}
        self._keys: list = []  # appended to, never changed: a frozen state keeps a prefix
        self._values: list = []

    def set(self, key, value) -> None:
        """`live[key] = value`; `value` must not be changed afterwards (states keep it)."""
        live = self.live
        live[key] = value
        keys = self._keys
        if len(keys) >= len(live) + _SLACK:
            self._base, self._keys, self._values = dict(live), [], []
        else:
            keys.append(key)
            self._values.append(value)

    def frozen(self) -> tuple:
        """The current state, for `thaw`: it stays what `live` is now whatever is set later."""
        keys = self._keys
        return (self._base, keys, self._values, len(keys))


def thaw(state: tuple) -> dict:
    """The dict a `LoggedDict.frozen` state names."""
    base, keys, values, n = state
    out = dict(base)
    for i in range(n):
        out[keys[i]] = values[i]
    return out
