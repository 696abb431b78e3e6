"""A dict whose past states can be kept for a small tuple each: the books lazy explanations read.

`LoggedDict.live` is an ordinary dict, read directly on the hot path. Each `set` also appends
to a log over a never-changed base, so `frozen()` names the current state as (base, keys,
values, length) and `thaw` rebuilds it; a long log starts a new base. A `set` costs O(1)
amortised, and kept states share base and log instead of each holding a copy.
Design: docs/internals.md.
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
