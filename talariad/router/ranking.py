"""Cost placement (Algorithm 1, step 2) without scoring every instance, and explanations rendered
only when someone reads them.

`rank_all` is the reference: score every eligible instance (`CostModel.evaluate`), apply Eq. (2),
take the cheapest feasible one (ties by name). `rank` returns the same winner and the same
explanation (a property test holds them equal on random states) but scores only
- the instances whose cost depends on this call's session or on the router's own overlay: the
  session's KV is there (snapshot or a newer completion) or in-flight forwards of the model are;
- the others in ascending order of a call-independent lower bound of Eq. (1) (queue and activation
  from the cached snapshot row, plus what every such instance pays alike: prefill, decode at batch
  0, recompute of the whole prefix), stopping once the bound exceeds the best total found.
The instances it skips are captured as immutable `Inputs` and scored when the explanation is read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from talariad.router.cost import CallPlan, CostModel, Inputs, _recompute_s
from talariad.router.messages import CandidateCost
from talariad.router.profiles import DemandTracker
from talariad.types import KVState
from talariad.router.telemetry import InstanceBook, InstanceState

_RELATIVE_SLACK = 1e-9  # the bound is summed in another order than the total: allow rounding


class Ranking(NamedTuple):
    best: CandidateCost | None  # the cheapest feasible candidate
    candidates: Sequence[CandidateCost]  # every eligible instance, in name order


def rank_all(cost: CostModel, plan: CallPlan, insts: list[InstanceState],
             every: InstanceBook, demand: DemandTracker, now: float) -> Ranking:
    """The reference: every eligible instance scored, Eq. (2) applied, the cheapest kept."""
    cands = [cost.evaluate(plan, inst) for inst in insts]
    if cost.knobs.residency_terms and any(c.needs_replica and c.feasible for c in cands):
        gain = cost.replica_gain(plan, every, demand, now)
        if not math.isinf(gain):
            cands = [c._replace(feasible=False, reason="eq2")
                     if c.needs_replica and c.feasible and not cost.passes_eq2(plan, inst, c, gain)
                     else c for c, inst in zip(cands, insts)]
    return Ranking(min((c for c in cands if c.feasible), key=_rank, default=None), tuple(cands))


def rank(cost: CostModel, plan: CallPlan, insts: list[InstanceState],
         every: InstanceBook, demand: DemandTracker, now: float) -> Ranking:
    """`rank_all`'s answer, scoring only the instances that can still win."""
    k, prof = cost.knobs, plan.profile
    if not prof.decode_s_per_seq >= 0.0 or not k.admission_unit_s >= 0.0:
        return rank_all(cost, plan, insts, every, demand, now)  # the bound needs these terms >= 0
    search = _Search(cost, plan, every, demand, now)
    plain = search.score_special(insts)
    common = plan.prefill_s + plan.decode_s + plan.call.max_tokens * prof.decode_s_per_seq
    if k.residency_terms:
        common += _recompute_s(plan, plan.call.prefix_tokens)
    plain.sort()
    for n, (bound, idx) in enumerate(plain):
        if search.beaten(bound + common):  # every later instance is bounded at least as high
            return search.result(insts, [i for _, i in plain[n:]])
        search.score(idx, insts[idx])
    return search.result(insts, [])


class _Search:
    def __init__(self, cost: CostModel, plan: CallPlan, every: InstanceBook,
                 demand: DemandTracker, now: float) -> None:
        self.cost, self.plan, self.every, self.demand, self.now = cost, plan, every, demand, now
        self.scored: dict[int, CandidateCost] = {}
        self.best: CandidateCost | None = None
        self._gain: float | None = None

    def gain(self) -> float:
        if self._gain is None:
            self._gain = self.cost.replica_gain(self.plan, self.every, self.demand, self.now)
        return self._gain

    def score_special(self, insts: list[InstanceState]) -> list[tuple[float, int]]:
        """Score the instances whose cost the bound does not cover; (bound, index) of the rest."""
        cost, plan = self.cost, self.plan
        model, key, rec, prof = plan.call.model, plan.key, plan.kv_record, plan.profile
        ppt, activation_counts = prof.prefill_s_per_token, cost.knobs.residency_terms
        plain = []
        for idx, inst in enumerate(insts):
            row = cost.row(inst, model, prof)
            ov = inst.ov_model.get(model)
            if ((ov is not None and (ov[0] or ov[1] or ov[2]))
                    or (rec is not None and rec.instance == inst.name and rec.at > row[11])
                    or (key is not None and key in inst.snapshot.sessions)):
                self.score(idx, inst)
                continue
            # queue without lease charges, plus activation (row: see CostModel._row)
            bound = row[7] * (row[8] + ppt * row[1]) + (row[4] if activation_counts else 0.0)
            plain.append((bound, idx))
        return plain

    def score(self, idx: int, inst: InstanceState) -> None:
        cost, plan = self.cost, self.plan
        cand = cost.evaluate(plan, inst)
        if cand.needs_replica and cand.feasible and cost.knobs.residency_terms:
            gain = self.gain()
            if not math.isinf(gain) and not cost.passes_eq2(plan, inst, cand, gain):
                cand = cand._replace(feasible=False, reason="eq2")
        self.scored[idx] = cand
        best = self.best
        if cand.feasible and (best is None or _rank(cand) < _rank(best)):
            self.best = cand

    def beaten(self, bound: float) -> bool:
        best = self.best
        if best is None:
            return False
        return bound > best.total_s + _RELATIVE_SLACK * abs(best.total_s) + 1e-12

    def result(self, insts: list[InstanceState], skipped: list[int]) -> Ranking:
        if not skipped:
            return Ranking(self.best, tuple(self.scored[i] for i in range(len(insts))))
        cost, model = self.cost, self.plan.call.model
        leases, captured, replica = cost.leases.by_instance, {}, False
        for i in skipped:  # what `CostModel.inputs` would read; no session KV, no overlay here
            inst = insts[i]
            per_model, row = leases.get(inst.name), inst.rows[model]
            captured[i] = (inst.name, row, per_model.get(model, 0) if per_model else 0,
                           per_model.get(None, 0) if per_model else 0, inst.ov_work_s, inst.ov_hbm,
                           inst.snapshot)
            replica = replica or row[5]
        # Eq. (2) may mark a skipped candidate: keep the gain of this moment for the rendering
        gain = self.gain() if replica and cost.knobs.residency_terms else None
        entries = [self.scored.get(i) or captured[i] for i in range(len(insts))]
        return Ranking(self.best, LazyCandidates(cost, self.plan, entries, gain))


class LazyCandidates(Sequence):
    """The per-candidate breakdown of one placement, scored from captured inputs when first read."""

    __slots__ = ("_cost", "_plan", "_entries", "_gain", "_rendered")

    def __init__(self, cost: CostModel, plan: CallPlan, entries: list, gain: float | None) -> None:
        self._cost, self._plan, self._entries, self._gain = cost, plan, entries, gain
        self._rendered: tuple[CandidateCost, ...] | None = None

    def _all(self) -> tuple[CandidateCost, ...]:
        if self._rendered is None:
            self._rendered = tuple(e if isinstance(e, CandidateCost) else self._render(*e)
                                   for e in self._entries)
            self._entries = []
        return self._rendered

    def _render(self, name: str, row: tuple, leased: int, leased_all: int, ov_work_s: float,
                ov_hbm: int, snap) -> CandidateCost:
        cost, plan, gain = self._cost, self._plan, self._gain
        cand = cost.score(plan, Inputs(name, row, None, KVState.MISSING, 0, leased, leased_all,
                                       ov_work_s, ov_hbm))
        if (cand.needs_replica and cand.feasible and gain is not None and not math.isinf(gain)
                and not cost.passes_eq2_on(plan, snap, snap.residency(plan.call.model).state, cand, gain)):
            cand = cand._replace(feasible=False, reason="eq2")
        return cand

    def __getitem__(self, i):
        return self._all()[i]

    def __len__(self) -> int:
        return len(self._entries) if self._rendered is None else len(self._rendered)

    def __iter__(self):
        return iter(self._all())

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(self._all())

    def __repr__(self) -> str:
        return repr(self._all())


def _rank(c: CandidateCost) -> tuple[float, str]:
    return (c.total_s, c.instance)
