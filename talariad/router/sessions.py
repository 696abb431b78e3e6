"""The session table and the lease book: who served a session last, and its soft reservation.

Leases expire lazily through a heap keyed by t_exp, so expiry costs O(log n) per lease and a
lookup O(1). The lease book also owns the per-instance admission charge of live leases.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from talariad.router.messages import Lease, SessionEntry
from talariad.router.search.logged import LoggedDict
from talariad.types import KVState

LeaseKey = tuple[str, str]  # (session_id, model)


class LeaseBook:
    """At most one lease per (session, model); each live lease charges its `charge_s` to its
    instance."""

    def __init__(self) -> None:
        self._by_key: dict[LeaseKey, Lease] = {}
        self._heap: list[tuple[float, int, Lease]] = []
        self._seq = itertools.count()
        # instance -> {model: seconds its live leases hold, None: all models}; read directly by
        # the cost model; `counts`: instance -> {model: its live leases there, None: all}.
        # NOTE: a change replaces the instance's dicts (never updates them), and is logged: a
        # lazy explanation keeps the state it saw (`held`)
        self._charges, self._counts = LoggedDict(), LoggedDict()
        self.by_instance: dict[str, dict[str | None, float]] = self._charges.live
        self.counts: dict[str, dict[str | None, int]] = self._counts.live
        self.by_model: defaultdict[str, float] = defaultdict(float)  # seconds held per model
        # told (instance, model) after each change of their charge (the cost model's bounds)
        self.on_charge: Callable[[str, str], None] = lambda instance, model: None

    def __len__(self) -> int:
        return len(self._by_key)

    def install(self, lease: Lease) -> None:
        self.take((lease.session_id, lease.model))
        self._by_key[(lease.session_id, lease.model)] = lease
        heapq.heappush(self._heap, (lease.t_exp, next(self._seq), lease))
        per_model = dict(self.by_instance.get(lease.instance, ()))
        per_model[lease.model] = per_model.get(lease.model, 0.0) + lease.charge_s
        per_model[None] = per_model.get(None, 0.0) + lease.charge_s
        self._replace(lease.instance, per_model, lease.model, +1)
        self.by_model[lease.model] += lease.charge_s
        self.on_charge(lease.instance, lease.model)

    def get(self, key: LeaseKey) -> Lease | None:
        return self._by_key.get(key)

    def take(self, key: LeaseKey) -> Lease | None:
        """Remove the lease for `key` (consumed or discarded) and release its charge."""
        lease = self._by_key.pop(key, None)
        if lease is not None:
            self._release(lease)
        return lease

    def expire(self, now: float, limit: int | None = None) -> list[Lease]:
        """Drop every lease with t_exp <= now (at most `limit` heap entries: the rest stays due,
        `due`); heap entries of replaced leases are skipped."""
        gone = []
        steps = -1 if limit is None else limit
        while self._heap and self._heap[0][0] <= now and steps != 0:
            steps -= 1
            lease = heapq.heappop(self._heap)[2]
            if self._by_key.get((lease.session_id, lease.model)) is lease:
                del self._by_key[(lease.session_id, lease.model)]
                self._release(lease)
                gone.append(lease)
        return gone

    def due(self, now: float) -> bool:
        """Some lease has expired by `now` and is still in the book."""
        return bool(self._heap) and self._heap[0][0] <= now

    def drop_instance(self, instance: str) -> list[Lease]:
        doomed = [k for k, lease in self._by_key.items() if lease.instance == instance]
        return [lease for k in doomed if (lease := self.take(k)) is not None]

    def charge(self, instance: str, model: str | None = None) -> float:
        """Seconds the live leases on `instance` hold (for one model, or, with None, all)."""
        per_model = self.by_instance.get(instance)
        return per_model.get(model, 0.0) if per_model else 0.0

    def count(self, instance: str, model: str | None = None) -> int:
        """Live leases on `instance` (for one model, or, with None, all)."""
        counts = self.counts.get(instance)
        return counts.get(model, 0) if counts else 0

    def all(self) -> tuple[Lease, ...]:
        return tuple(self._by_key.values())

    def check_integrity(self) -> None:
        held: defaultdict[tuple[str, str], float] = defaultdict(float)
        for (session, model), lease in self._by_key.items():
            if (lease.session_id, lease.model) != (session, model):
                raise AssertionError(f"lease filed under the wrong key: {lease}")
            held[(lease.instance, lease.model)] += lease.charge_s
        for inst, per_model in self.by_instance.items():
            for model, n in per_model.items():
                if model is not None and not _close(n, held.get((inst, model), 0.0)):
                    raise AssertionError(f"charge {inst}/{model}={n} disagrees with the leases")
            total = sum(n for m, n in per_model.items() if m is not None)
            if not _close(per_model.get(None, 0.0), total):
                raise AssertionError(f"total charge of {inst} out of step")
        per_instance = Counter(lease.instance for lease in self._by_key.values())
        per_instance.update((lease.instance, lease.model) for lease in self._by_key.values())
        counted = {
            (i if m is None else (i, m)): n for i, c in self.counts.items() for m, n in c.items()
        }
        if {k: n for k, n in counted.items() if n} != dict(per_instance):
            raise AssertionError("per-instance lease counts out of step")
        per_model_total: defaultdict[str, float] = defaultdict(float)
        for (_, model), n in held.items():
            per_model_total[model] += n
        for model in self.by_model.keys() | per_model_total.keys():
            if not _close(self.by_model.get(model, 0.0), per_model_total.get(model, 0.0)):
                raise AssertionError("per-model lease totals out of step")
        live = {id(entry[2]) for entry in self._heap}
        if any(id(lease) not in live for lease in self._by_key.values()):
            raise AssertionError("a lease is missing from the expiry heap")

    def held(self) -> tuple[tuple, tuple]:
        """The states of `by_instance` and `counts` now, for a caller that keeps them
        (`logged.thaw` turns each into its dict)."""
        return self._charges.frozen(), self._counts.frozen()

    def _replace(
        self, instance: str, per_model: dict[str | None, float], model: str, step: int
    ) -> None:
        """Install `per_model` as `instance`'s charges, and add `step` to its lease counts."""
        self._charges.set(instance, per_model)
        counts = dict(self.counts.get(instance, ()))
        counts[model] = counts.get(model, 0) + step
        counts[None] = counts.get(None, 0) + step
        self._counts.set(instance, counts)

    def _release(self, lease: Lease) -> None:
        per_model = dict(self.by_instance[lease.instance])
        per_model[lease.model] = _drop(per_model.get(lease.model, 0.0), lease.charge_s)
        per_model[None] = _drop(per_model.get(None, 0.0), lease.charge_s)
        self._replace(lease.instance, per_model, lease.model, -1)
        self.by_model[lease.model] = _drop(self.by_model[lease.model], lease.charge_s)
        self.on_charge(lease.instance, lease.model)


def _drop(held: float, charge: float) -> float:
    """`held - charge`, snapped to 0 when float rounding leaves a residue of released leases."""
    left = held - charge
    return left if left > 1e-9 else 0.0


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


@dataclass(slots=True)
class _Row:
    instance: str | None
    model: str | None
    kv_len: int
    last_used: float


@dataclass(frozen=True, slots=True)
class KVRecord:
    """Where the last completion of (session, model) left its prefix, as the completion said."""

    instance: str
    state: KVState
    kv_len: int
    at: float


class SessionTable:
    """Per session id: last serving instance, model, observed KV length, last-use time (§4.1).
    At most `max_rows` rows: a new session past that forgets the least recently used one."""

    def __init__(self, max_rows: int | None = None) -> None:
        self._rows: OrderedDict[str, _Row] = OrderedDict()  # least recently used first
        self._kv: dict[str, dict[str, KVRecord]] = {}  # session -> model -> record
        self.max_rows = max_rows

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, session_id: str) -> _Row | None:
        return self._rows.get(session_id)

    def kv_record(self, session_id: str, model: str) -> KVRecord | None:
        per_model = self._kv.get(session_id)
        return per_model.get(model) if per_model is not None else None

    def completed(
        self, session_id: str, model: str, instance: str, state: KVState, kv_len: int, now: float
    ) -> None:
        self.touch(session_id, instance, model, kv_len, now)
        self._kv.setdefault(session_id, {})[model] = KVRecord(instance, state, kv_len, now)

    def touch(
        self, session_id: str, instance: str | None, model: str | None, kv_len: int, now: float
    ) -> None:
        row = self._rows.get(session_id)
        if row is None:
            self._rows[session_id] = _Row(instance, model, kv_len, now)
            if self.max_rows is not None and len(self._rows) > self.max_rows:
                gone, _ = self._rows.popitem(last=False)
                self._kv.pop(gone, None)
            return
        row.instance, row.model, row.kv_len, row.last_used = instance, model, kv_len, now
        self._rows.move_to_end(session_id)

    def forget_idle(self, before: float, limit: int | None = None) -> list[str]:
        """Drop rows last used before `before` (rows are kept in last-use order), at most
        `limit` of them (the rest stays `idle`)."""
        gone: list[str] = []
        while self._rows and len(gone) != limit:
            sid, row = next(iter(self._rows.items()))
            if row.last_used >= before:
                break
            del self._rows[sid]
            gone.append(sid)
        for sid in gone:
            self._kv.pop(sid, None)
        return gone

    def idle(self, before: float) -> bool:
        """Some row was last used before `before`."""
        return bool(self._rows) and next(iter(self._rows.values())).last_used < before

    def forget(self, session_id: str) -> bool:
        """Drop one session's row and KV records; False if it had neither."""
        row = self._rows.pop(session_id, None)
        records = self._kv.pop(session_id, None)
        return row is not None or bool(records)

    def entries(self, leases: LeaseBook) -> tuple[SessionEntry, ...]:
        return tuple(self._entry(sid, row, leases) for sid, row in self._rows.items())

    @staticmethod
    def _entry(sid: str, row: _Row, leases: LeaseBook) -> SessionEntry:
        lease = leases.get((sid, row.model)) if row.model is not None else None
        return SessionEntry(sid, row.instance, row.model, row.kv_len, row.last_used, lease)
