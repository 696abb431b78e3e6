"""Residency-style baselines: Continuum TTL pinning and llama-swap, as their authors define them.

Each chooses among every instance allowed the model, by its own rule:
- continuum-ttl: a completed call pins its session there for 2.0 s while the mean observed tool
  gap is ≤ 2.0 s; unpinned calls: least-pressure.
- llama-swap: where the model is loaded, under 10 in flight; else swap on an idle instance; else
  wait for a drain.
The signals each reads: docs/internals.md.
"""

from __future__ import annotations

from collections import OrderedDict

from talariad.router.messages import CallRequest, DecisionKind, ModelState
from talariad.router.policies.base import POLICIES, Choice, ClusterView, Policy, placed
from talariad.router.policies.simple import least_pressure
from talariad.router.telemetry import InstanceState
from talariad.types import KVState

PIN_S = 2.0
PRIOR_GAP_S = 1.0
CONCURRENCY_LIMIT = 10
GAP_MEMORY = 65_536  # sessions whose last counted gap is remembered (retries are not recounted)
_LOADED = (ModelState.ACTIVE, ModelState.RESIDENT)


@POLICIES.register("continuum-ttl")
class ContinuumTTLPolicy(Policy):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._gap_sum = 0.0
        self._gap_n = 0
        # (session, model) -> (instance, until); all pins last PIN_S, so insertion order is
        # expiry order and expired pins are dropped from the front
        self._pins: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()
        self._gap_seen: OrderedDict[str, float] = OrderedDict()  # session -> gap counted at

    def mean_gap_s(self) -> float:
        return self._gap_sum / self._gap_n if self._gap_n else PRIOR_GAP_S

    def choose(self, call: CallRequest, view: ClusterView, now: float) -> Choice:
        self._observe_gap(call, view, now)
        pin = self._pins.pop((call.session_id, call.model), None) if call.session_id else None
        if pin is not None and now < pin[1]:
            inst = view.instances.get(pin[0])
            if inst is not None and inst.healthy() and call.model in inst.snapshot.allowed_models:
                return placed(view, call, inst, [inst], "ttl pin")
        insts = view.eligible(call.model, now)
        return placed(view, call, least_pressure(insts), insts, "unpinned: least pressure")

    def on_completed(
        self, call: CallRequest, instance: str, kv_state: KVState, kv_len: int, now: float
    ) -> None:
        while self._pins and next(iter(self._pins.values()))[1] <= now:
            self._pins.popitem(last=False)
        if call.session_id is not None and self.mean_gap_s() <= PIN_S:
            self._pins.pop((call.session_id, call.model), None)
            self._pins[(call.session_id, call.model)] = (instance, now + PIN_S)

    def _observe_gap(self, call: CallRequest, view: ClusterView, now: float) -> None:
        row = view.sessions.get(call.session_id) if call.session_id is not None else None
        if row is None or now < row.last_used:
            return  # a session's first call, or clock skew
        if self._gap_seen.get(call.session_id) == row.last_used:
            return  # a retry of a held call whose gap was already counted
        self._gap_seen[call.session_id] = row.last_used
        self._gap_seen.move_to_end(call.session_id)
        if len(self._gap_seen) > GAP_MEMORY:
            self._gap_seen.popitem(last=False)
        self._gap_sum += now - row.last_used
        self._gap_n += 1


@POLICIES.register("llama-swap")
class LlamaSwapPolicy(Policy):
    def choose(self, call: CallRequest, view: ClusterView, now: float) -> Choice:
        insts = view.eligible(call.model, now)
        state = view.cost.model_state
        ready = [
            i
            for i in insts
            if state(i, call.model) in _LOADED and _inflight_of(i, call.model) < CONCURRENCY_LIMIT
        ]
        if ready:
            inst = min(ready, key=lambda i: (_inflight_of(i, call.model), i.name))
            return placed(view, call, inst, insts, "model loaded")
        idle = [i for i in insts if _idle(i)]
        if idle:
            inst = min(idle, key=lambda i: (_loaded_count(i), i.name))
            return placed(view, call, inst, insts, "swap on idle instance")
        choice = placed(view, call, None, insts, "waiting for a loaded instance to drain")
        drain = min(insts, key=lambda i: (ClusterView.load(i), i.name), default=None)
        return Choice(
            None,
            DecisionKind.COST,
            choice.candidates,
            choice.reason,
            drain.name if drain is not None else None,
        )


def _inflight_of(inst: InstanceState, model: str) -> int:
    return sum(1 for r in inst.inflight.values() if r.call.model == model)


def _idle(inst: InstanceState) -> bool:
    queued = sum(r.queued_calls + r.running_calls for r in inst.snapshot.models.values())
    return not inst.inflight and queued == 0


def _loaded_count(inst: InstanceState) -> int:
    return sum(1 for r in inst.snapshot.models.values() if r.state in _LOADED)
