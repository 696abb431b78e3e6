"""Per model, the instances in ascending order of a call-independent lower bound of Eq. (1).

An instance's bound for a model (`lower_bound`) reads its cost row and the admission its live
leases hold for the model, so it changes when its snapshot, its leases, the profiles or the knobs
do. `ranking.rank` walks this order rather than bound and sort every instance per call:
`Router.observe` moves the observed instance in place (`update`, off the placement path), and
so does a change of its lease charges (`recharge`); any other change to the instance book
(remove, close, reopen, an install nothing primed), the profiles or the knobs makes the next
read rebuild the order. Why leases count: with a candidate set (`RouterKnobs.cost_candidates`)
the order decides which instances are weighed at all, and idle instances bound alike; without
the leases' charge the same few by name would take every new session while their leases load
them.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Callable

from talariad.router.cost import ACTIVATION, QUEUED, RISK, ROUND_LOAD, SLOT_WAIT
from talariad.router.telemetry import InstanceBook, InstanceState

Entry = tuple[float, str]  # (bound, instance name): unique, so the order never compares more


def lower_bound(
    row: tuple, prefill_s_per_token: float, residency_terms: bool, leased_s: float = 0.0
) -> float:
    """Queue (with the model's lease charges there, `leased_s`) plus activation (row:
    `cost.cost_row`); a NaN bound reads as -inf, so that instance is always scored."""
    activation = row[ACTIVATION] if residency_terms else 0.0
    bound = row[RISK] * (row[SLOT_WAIT] + prefill_s_per_token * row[QUEUED] + leased_s)
    bound += activation
    return bound if bound == bound else -math.inf


def surely_busy(row: tuple, residency_terms: bool) -> bool:
    """The round check (`cost.score`) fails here for any call whose own prefill and recovery
    exceed the round budget: a round load above zero, a deadline risk of at least 1 and no
    negative activation (overlay work and lease charges are never negative)."""
    busy = row[ROUND_LOAD] > 0.0 and row[RISK] >= 1.0
    return busy and (not residency_terms or row[ACTIVATION] >= 0.0)


class BoundOrder:
    """One model's order: the instances with a snapshot that allows the model."""

    __slots__ = ("key", "synced", "entries", "named", "insts", "may_idle")

    def __init__(self, key: tuple, synced: int) -> None:
        self.key = key  # (profile epoch, prefill per token, residency terms): what bounds read
        self.synced = synced  # the instance book's generation it reflects
        self.entries: list[Entry] = []  # ascending
        self.named: dict[str, tuple[InstanceState, Entry]] = {}
        self.insts: set[InstanceState] = set()  # those in `named`
        self.may_idle: set[str] = set()  # those not `surely_busy`: a prompt no round takes

    def put(self, inst: InstanceState, row: tuple, leased_s: float) -> None:
        self.drop(inst.name)
        insort(self.entries, self._add(inst, row, leased_s))

    def _add(self, inst: InstanceState, row: tuple, leased_s: float) -> Entry:
        """Name `inst` with its bound from `row` and its leases' charge; its entry, for the
        caller to place."""
        entry = (lower_bound(row, self.key[1], self.key[2], leased_s), inst.name)
        self.named[inst.name] = (inst, entry)
        self.insts.add(inst)
        if not surely_busy(row, self.key[2]):
            self.may_idle.add(inst.name)
        return entry

    def idle_from(self, entry: Entry) -> list[Entry]:
        """The entries from `entry` on (ascending) of the instances whose round may be empty
        (not `surely_busy`): only they can take a prompt longer than the round budget."""
        named = self.named
        return sorted(e for n in self.may_idle if (e := named[n][1]) >= entry)

    def drop(self, name: str) -> None:
        held = self.named.pop(name, None)
        if held is not None:
            del self.entries[bisect_left(self.entries, held[1])]
            self.insts.discard(held[0])
            self.may_idle.discard(name)


Leased = Callable[[str, str], float]  # (instance, model) -> its live leases' charge, seconds


class BoundIndex:
    """The `BoundOrder` of every model a placement has asked for."""

    def __init__(self, leased: Leased) -> None:
        self._orders: dict[str, BoundOrder] = {}
        self._leased = leased

    def get(
        self, model: str, key: tuple, every: InstanceBook, row: Callable[[InstanceState], tuple]
    ) -> BoundOrder:
        """`model`'s order for bounds `key`, rebuilt unless in step with `every`; `row(inst)`
        gives an instance's current cost row for the model."""
        order = self._orders.get(model)
        if order is None or order.key != key or order.synced != every.generation:
            order = self._orders[model] = BoundOrder(key, every.generation)
            leased = self._leased
            order.entries = sorted(
                order._add(inst, row(inst), leased(inst.name, model))
                for inst in every.all()
                if inst.snapshot is not None and model in inst.allowed
            )
        return order

    def update(self, inst: InstanceState, every: InstanceBook, keys: dict[str, tuple]) -> None:
        """`inst` took the snapshot that made `every`'s latest generation, and its cost rows
        are current: move it in every order that was in step before (`keys`: model -> its
        current bounds key)."""
        for model, order in self._orders.items():
            if order.synced != every.generation - 1 or order.key != keys.get(model):
                continue  # rebuilt when next read
            if inst.snapshot is not None and model in inst.allowed:
                order.put(inst, inst.rows[model], self._leased(inst.name, model))
            else:
                order.drop(inst.name)
            order.synced = every.generation

    def recharge(self, name: str, model: str, row: Callable[[InstanceState], tuple]) -> None:
        """The live leases' charge of `model` on `name` changed: move it in the model's order
        (an order out of step is rebuilt when next read, so moving it there is harmless)."""
        order = self._orders.get(model)
        held = order.named.get(name) if order is not None else None
        if held is not None:
            order.put(held[0], row(held[0]), self._leased(name, model))  # type: ignore[union-attr]

    def models(self):
        return self._orders.keys()

    def check_integrity(
        self, every: InstanceBook, keys: dict[str, tuple], row: Callable[..., tuple]
    ) -> None:
        for model, order in self._orders.items():
            if order.synced != every.generation or order.key != keys[model]:
                continue  # stale: not read before a rebuild
            want = BoundOrder(order.key, order.synced)
            for inst in every.all():
                if inst.snapshot is not None and model in inst.allowed:
                    want.put(inst, row(inst, model), self._leased(inst.name, model))
            have = (order.entries, order.named, order.insts, order.may_idle)
            if have != (want.entries, want.named, want.insts, want.may_idle):
                raise AssertionError(f"bound order of {model} out of step with the cost rows")
