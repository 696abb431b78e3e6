"""Load-only and sticky baselines, each as its authors define it (paper §5.3).

Each chooses among every instance allowed the model, by its own rule: least-pressure (the
paper's load-only baseline), session-sticky, round-robin, random, power-of-two and consistent-hash (SGLang's
bounded variant). All of them ignore feasibility, so "no candidate" only happens when nothing is
eligible. The signals each reads: docs/internals.md.
"""

from __future__ import annotations

import bisect
import hashlib

from talariad.router.messages import CallRequest
from talariad.router.policies.base import POLICIES, Choice, ClusterView, Policy, placed
from talariad.router.telemetry import InstanceState

STICKY_TTL_S = 7200.0
VNODES = 150
MAX_LOAD_SKEW = 1.5


def least_pressure(insts: list[InstanceState]) -> InstanceState | None:
    return min(
        insts,
        key=lambda i: (ClusterView.pressure(i), i.snapshot.kv_occupancy, i.name),
        default=None,
    )


@POLICIES.register("least-pressure")
class LeastPressurePolicy(Policy):
    def choose(self, call: CallRequest, view: ClusterView, now: float) -> Choice:
        insts = view.eligible(call.model, now)
        scores = {i.name: ClusterView.pressure(i) for i in insts}
        return placed(view, call, least_pressure(insts), insts, "least pressure", scores)


@POLICIES.register("session-sticky")
class SessionStickyPolicy(Policy):
    def choose(self, call: CallRequest, view: ClusterView, now: float) -> Choice:
        pinned = self._pinned(call, view, now)
        insts = view.eligible(call.model, now)
        if pinned is not None:
            return placed(view, call, pinned, [pinned], "sticky")
        return placed(view, call, least_pressure(insts), insts, "unpinned: least pressure")

    @staticmethod
    def _pinned(call: CallRequest, view: ClusterView, now: float) -> InstanceState | None:
        row = view.sessions.get(call.session_id) if call.session_id is not None else None
        if row is None or row.instance is None or now - row.last_used > STICKY_TTL_S:
            return None
        inst = view.instances.get(row.instance)
        if inst is None or not inst.healthy() or call.model not in inst.snapshot.allowed_models:
            return None
        return inst


@POLICIES.register("round-robin")
class RoundRobinPolicy(Policy):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._counter = 0

    def choose(self, call: CallRequest, view: ClusterView, now: float) -> Choice:
        insts = view.eligible(call.model, now)
        if not insts:
            return placed(view, call, None, insts, "no eligible instance")
        inst = insts[self._counter % len(insts)]
        self._counter += 1
        return placed(view, call, inst, insts, "round robin")


@POLICIES.register("random")
class RandomPolicy(Policy):
    def choose(self, call: CallRequest, view: ClusterView, now: float) -> Choice:
        insts = view.eligible(call.model, now)
        inst = self.rng.choice(insts) if insts else None
        return placed(view, call, inst, insts, "uniform random")


@POLICIES.register("power-of-two")
class PowerOfTwoPolicy(Policy):
    def choose(self, call: CallRequest, view: ClusterView, now: float) -> Choice:
        insts = view.eligible(call.model, now)
        if len(insts) <= 1:
            return placed(view, call, insts[0] if insts else None, insts, "power of two")
        n = len(insts)
        i1 = self.rng.randrange(n)
        i2 = (i1 + 1 + self.rng.randrange(n - 1)) % n
        a, b = insts[i1], insts[i2]
        inst = a if ClusterView.load(a) <= ClusterView.load(b) else b
        scores = {i.name: float(ClusterView.load(i)) for i in (a, b)}
        return placed(view, call, inst, [a, b], "power of two", scores)


def ring_point(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


@POLICIES.register("consistent-hash")
class ConsistentHashPolicy(Policy):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._members: tuple[str, ...] = ()
        self._points: list[int] = []
        self._owners: list[str] = []

    def choose(self, call: CallRequest, view: ClusterView, now: float) -> Choice:
        insts = view.eligible(call.model, now)
        if not insts or call.session_id is None:
            inst = self.rng.choice(insts) if insts else None
            return placed(view, call, inst, insts, "no session id: random")
        order = self._clockwise(call.session_id, {i.name: i for i in insts}, view)
        total = sum(ClusterView.load(i) for i in insts)
        bound = MAX_LOAD_SKEW * max(1.0, total / len(insts))
        inst = next((i for i in order if ClusterView.load(i) <= bound), order[0])
        scores = {i.name: float(ClusterView.load(i)) for i in insts}
        return placed(view, call, inst, insts, "bounded consistent hash", scores)

    def _clockwise(
        self, key: str, eligible: dict[str, InstanceState], view: ClusterView
    ) -> list[InstanceState]:
        """Distinct eligible instances in ring order starting at the key's point."""
        self._sync(tuple(i.name for i in view.instances.all()))
        start = bisect.bisect_left(self._points, ring_point(key))
        seen: dict[str, InstanceState] = {}
        n = len(self._points)
        for k in range(n):
            name = self._owners[(start + k) % n]
            if name in eligible and name not in seen:
                seen[name] = eligible[name]
                if len(seen) == len(eligible):
                    break
        return list(seen.values())

    def _sync(self, members: tuple[str, ...]) -> None:
        if members == self._members:
            return
        ring = sorted((ring_point(f"{m}#{v}"), m) for m in members for v in range(VNODES))
        self._members = members
        self._points = [p for p, _ in ring]
        self._owners = [m for _, m in ring]
