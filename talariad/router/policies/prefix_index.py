"""A router-side approximate prefix index, updated only with the router's own decisions.

Like SGLang's cache-aware tree and llm-d's approximate prefix producer it remembers where each
routed prompt went, but on token counts, not text: per (model, session), the tokens of the last
prompt routed to each instance; a new call matches `min(indexed tokens, call.prefix_tokens)`.
Prefixes shared across sessions are invisible to it. Design: docs/internals.md.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict

Key = tuple[str, str]  # (model, session_id)


class RoutedPrefixIndex:
    """Per-instance token budget with least-recently-used eviction of whole session entries."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity = capacity_tokens
        self._lru: defaultdict[str, OrderedDict[Key, int]] = defaultdict(OrderedDict)
        self._size: defaultdict[str, int] = defaultdict(int)
        self._where: defaultdict[Key, dict[str, tuple[int, int]]] = defaultdict(dict)
        self._stamp = 0

    def matches(
        self, model: str, session_id: str | None, prefix_tokens: int
    ) -> dict[str, tuple[int, int]]:
        """Per instance: (matched tokens, recency stamp) for a call with this reusable prefix."""
        if session_id is None:
            return {}
        held = self._where.get((model, session_id), {})
        return {inst: (min(tok, prefix_tokens), stamp) for inst, (tok, stamp) in held.items()}

    def insert(self, model: str, session_id: str | None, instance: str, tokens: int) -> None:
        if session_id is None:
            return
        key, lru = (model, session_id), self._lru[instance]
        self._size[instance] += tokens - lru.pop(key, 0)
        lru[key] = tokens
        self._stamp += 1
        self._where[key][instance] = (tokens, self._stamp)

    def evict(self) -> int:
        """Pop least-recently-used entries of every instance over capacity; returns how many."""
        popped = 0
        for instance, lru in self._lru.items():
            while self._size[instance] > self.capacity and lru:
                key, tokens = lru.popitem(last=False)
                self._size[instance] -= tokens
                del self._where[key][instance]
                if not self._where[key]:
                    del self._where[key]
                popped += 1
        return popped

    def size(self, instance: str) -> int:
        return self._size.get(instance, 0)

    def check_integrity(self) -> None:
        for instance, lru in self._lru.items():
            if sum(lru.values()) != self._size[instance]:
                raise AssertionError(f"prefix index size of {instance} out of step")
            for key, tokens in lru.items():
                if self._where.get(key, {}).get(instance, (None,))[0] != tokens:
                    raise AssertionError(f"prefix index entry {key}@{instance} out of step")
