"""The placement-policy contract and the read-only cluster view every policy decides from.

A policy answers `choose(call, view, now)` with a `Choice`; the router turns it into a
`Decision`, records the forward in the in-flight overlay, and applies the configured overload
policy when the choice names no instance. Policies keep only their own private state (counters,
rings, prefix indexes, pins) and draw randomness only from the seeded RNG they are given.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from typing import ClassVar, NamedTuple

from talariad.router.cost import CallPlan
from talariad.router.knobs import RouterKnobs
from talariad.router.messages import CallRequest, CandidateCost, DecisionKind
from talariad.router.profiles import DemandTracker
from talariad.router.registry import Registry
from talariad.router.search.costmodel import CostModel
from talariad.router.sessions import LeaseBook, SessionTable
from talariad.router.telemetry import InstanceBook, InstanceState
from talariad.types import KVState


class Choice(NamedTuple):
    """A policy's answer: `instance` None means "no candidate"; `spill` is where the call goes
    if the overload policy is "spill" (the cheapest eligible instance, ignoring feasibility)."""

    instance: str | None
    kind: DecisionKind
    candidates: tuple[CandidateCost, ...] = ()
    reason: str = ""
    spill: str | None = None
    best: CandidateCost | None = None  # the chosen instance's candidate, when it was scored
    plan: CallPlan | None = None  # the call's plan, when the policy made one


class ClusterView:
    """What a policy may read: instances with their overlay, sessions, leases, the cost model."""

    def __init__(
        self,
        knobs: RouterKnobs,
        instances: InstanceBook,
        sessions: SessionTable,
        leases: LeaseBook,
        cost: CostModel,
        demand: DemandTracker,
    ) -> None:
        self.knobs, self.instances, self.sessions = knobs, instances, sessions
        self.leases, self.cost, self.demand = leases, cost, demand
        self._eligible: dict[str, tuple] = {}  # model -> (key, built at, oldest stamps, list)

    def eligible(self, model: str, now: float) -> list[InstanceState]:
        """Healthy, fresh, heartbeat-current instances allowed to serve `model`, by name
        (`InstanceState.placeable`, inlined); read it, do not change it (it is kept until an
        instance changes or one of them goes stale)."""
        k = self.knobs
        stale, silent = now - k.staleness_s, now - k.heartbeat_s
        taken, seen = self.instances.oldest()
        if taken >= stale and seen >= silent:  # every one is fresh: no filter by the clock
            return self.instances.serving(model)
        key = (self.instances.changes, k.staleness_s, k.heartbeat_s)
        kept = self._eligible.get(model)
        # NOTE: an instance left out as stale stays so while the clock moves on; one kept in
        # stays in while the oldest snapshot and heartbeat of those kept are fresh enough
        if kept is not None and kept[0] == key and now >= kept[1]:
            if kept[2] >= stale and kept[3] >= silent:
                return kept[4]
        insts = [
            i
            for i in self.instances.all()
            if i.health_ok and i.taken_at >= stale and i.last_seen >= silent and model in i.allowed
        ]
        taken = min([i.taken_at for i in insts], default=math.inf)
        seen = min([i.last_seen for i in insts], default=math.inf)
        self._eligible[model] = (key, now, taken, seen, insts)
        return insts

    @staticmethod
    def load(inst: InstanceState) -> int:
        """L_w: the router's own in-flight count on the instance."""
        return len(inst.inflight)

    @staticmethod
    def pressure(inst: InstanceState) -> float:
        """Predicted round load with the overlay, inflated by deadline risk."""
        snap = inst.snapshot
        return (1.0 + max(snap.deadline_risk, 0.0)) * (snap.round_load_s + inst.ov_work_s)

    def kv(self, inst: InstanceState, call: CallRequest) -> tuple[KVState, int]:
        return self.cost.kv_on(inst, call)

    def breakdown(
        self, plan: CallPlan, insts: list[InstanceState], scores: dict[str, float] | None = None
    ) -> tuple[CandidateCost, ...]:
        """Eq. (1) per instance for explanations; a baseline's own score goes in `score`."""
        out = []
        for inst in insts:
            cand = self.cost.evaluate(plan, inst)
            if scores is not None:
                cand = _with_score(cand, scores.get(inst.name))
            out.append(cand)
        return tuple(out)


def _with_score(cand: CandidateCost, score: float | None) -> CandidateCost:
    return cand._replace(score=score)


def cheapest(cands: tuple[CandidateCost, ...] | list[CandidateCost]) -> str | None:
    """Lowest Eq. (1) total, ties by name; None when there is nothing to choose from."""
    best = min(cands, key=lambda c: (c.total_s, c.instance), default=None)
    return best.instance if best is not None else None


class Policy(ABC):
    """A placement policy; subclasses register under a name in `POLICIES`."""

    name: ClassVar[str] = ""
    installs_leases: ClassVar[bool] = False  # soft reservations are Talaria's mechanism

    def __init__(self, knobs: RouterKnobs, rng: random.Random) -> None:
        self.knobs = knobs
        self.rng = rng

    @abstractmethod
    def choose(self, call: CallRequest, view: ClusterView, now: float) -> Choice:
        """Pick an instance for `call`, or say there is none."""

    def on_placed(self, call: CallRequest, instance: str, now: float) -> None:
        """The router forwarded `call` to `instance` (whatever decided it)."""
        return None  # a hook: most policies keep nothing per placement

    def on_completed(
        self, call: CallRequest, instance: str, kv_state: KVState, kv_len: int, now: float
    ) -> None:
        """`call` finished on `instance`, leaving its prefix in `kv_state`."""
        return None  # a hook: most policies keep nothing per completion


POLICIES: Registry[Policy] = Registry("router policy")


def placed(
    view: ClusterView,
    call: CallRequest,
    inst: InstanceState | None,
    insts: list[InstanceState],
    reason: str,
    scores: dict[str, float] | None = None,
) -> Choice:
    """A baseline's choice with the Eq. (1) breakdown of every candidate it looked at."""
    cands = view.breakdown(view.cost.plan(call), insts, scores)
    if inst is None:
        return Choice(None, DecisionKind.COST, cands, reason, cheapest(cands))
    return Choice(inst.name, DecisionKind.COST, cands, reason)
