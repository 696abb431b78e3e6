"""Cost placement (Algorithm 1, lines 11-24) without scoring every instance.

`rank` returns `cost.rank_all`'s winner and explanation (a property test holds them equal) but
scores only the instances whose cost depends on this call's session or the router's overlay,
then the others in ascending order of a call-independent lower bound of Eq. (1)
(`bounds.BoundOrder`), stopping once the bound exceeds the best found. The ones it skips are
scored when the explanation is read (`lazy.LazyCandidates`). Design: docs/internals.md.
"""

from __future__ import annotations

import math

from talariad.router.cost import (
    ACTIVATION,
    ADDED_BYTES,
    HBM_FREE,
    RISK,
    ROUND_LOAD,
    TAKEN_AT,
    CallPlan,
    GainFacts,
    Ranking,
    gate,
    rank_all,
    recompute_s,
)
from talariad.router.messages import CandidateCost
from talariad.router.profiles import DemandTracker
from talariad.router.search.bounds import BoundOrder
from talariad.router.search.costmodel import CostModel
from talariad.router.search.lazy import LazyCandidates, SkippedFacts
from talariad.router.telemetry import InstanceBook, InstanceState

_NO_NAMES: frozenset[str] = frozenset()
_RELATIVE_SLACK = 1e-9  # the bound is summed in another order than the total: allow rounding


def rank(
    cost: CostModel,
    plan: CallPlan,
    insts: list[InstanceState],
    every: InstanceBook,
    demand: DemandTracker,
    now: float,
) -> Ranking:
    """`rank_all`'s answer, scoring only the instances that can still win."""
    k, prof = cost.knobs, plan.profile
    if not prof.decode_s_per_seq >= 0.0 or not k.admission_unit_s >= 0.0:
        return rank_all(cost, plan, insts, every, demand, now)  # the bound needs these terms >= 0
    recovery = recompute_s(plan, plan.call.prefix_tokens) if k.residency_terms else 0.0
    search = _Search(cost, plan, every, demand, now, insts, recovery)
    order = cost.bound_order(plan.call.model, every)
    search.score_special(order)
    common = plan.prefill_s + plan.decode_s + plan.call.max_tokens * prof.decode_s_per_seq
    if k.residency_terms:
        common += recovery
    scored, members, named = search.scored, search.members, order.named
    skipped, infeasible = False, None
    # the candidate set: those singled out above plus the `cap` lowest bounded (least loaded)
    cap = math.inf if k.cost_candidates is None else len(scored) + k.cost_candidates
    # a set smaller than the eligible ones already answers within it: one that can at best
    # tie the best found (idle boxes bound alike, and their bound is their cost) is not
    # weighed either, where the whole ranking would score every tie to break it by name
    within = cap < len(members)
    entries, at = order.entries, 0
    while at < len(entries):  # ties in name order
        entry = entries[at]
        at += 1
        inst = named[entry[1]][0]
        if inst not in members or inst in scored:
            continue
        bound = entry[0] + common
        if (best := search.best) is not None:
            if len(scored) >= cap or _above(bound, best) or (within and _reaches(bound, best)):
                skipped = True  # later ones bound as high
                break
        elif _above(bound, search.cheapest) or len(scored) >= cap:
            # nothing feasible yet (and so on for the rest: bounds ascend, the cheapest only
            # falls): only an instance the round and HBM checks cannot rule out is worth
            # scoring. A prompt too long for any round rules out every busy one: walk the
            # ones whose round may be empty, not every instance
            if infeasible is None:
                infeasible = search.infeasible_test()
                if search.beyond_every_round():
                    idle = order.idle_from(entry)
                    skipped = skipped or len(idle) < len(entries) - at + 1  # busy ones left
                    entries, at = idle, 0
                    continue
            if infeasible(inst):
                skipped = True  # cannot win, nor be the spill target within the set
                continue
        search.score(inst)
    return search.result(insts, skipped)


class _Search:
    # NOTE: few container allocations per call: each one brings the next GC pass nearer, and a
    # pass that lands inside place() is its tail latency
    __slots__ = (
        "cost",
        "plan",
        "every",
        "demand",
        "now",
        "members",
        "scored",
        "best",
        "cheapest",
        "retired",
        "_gain",
        "_positions",
        "recovery",
    )

    def __init__(
        self,
        cost: CostModel,
        plan: CallPlan,
        every: InstanceBook,
        demand: DemandTracker,
        now: float,
        insts: list[InstanceState],
        recovery: float,
    ) -> None:
        self.cost, self.plan, self.every, self.demand, self.now = cost, plan, every, demand, now
        self.recovery = recovery  # of the call's prefix where it is not on device (0: no terms)
        # the eligible list the book keeps comes with its index (no set built per call)
        self._positions = every.positions(plan.call.model, insts)
        self.members: set | dict = self._positions if self._positions is not None else set(insts)
        self.scored: dict[InstanceState, CandidateCost] = {}  # few
        self.best: CandidateCost | None = None
        self.cheapest: CandidateCost | None = None  # feasible or not
        self.retired: CandidateCost | None = None  # the cheapest refused as a retired replica
        self._gain: float | None = None

    def gain(self) -> float:
        if self._gain is None:
            self._gain = self.cost.replica_gain(self.plan, self.every, self.demand, self.now)
        return self._gain

    def score_special(self, order: BoundOrder) -> None:
        """Score the instances whose cost the bound does not cover: an overlay for the model
        there, the session's KV there (snapshot or a newer completion), or no place in `order`
        (found through the book's indexes, not by reading every instance)."""
        cost, plan, every, members = self.cost, self.plan, self.every, self.members
        model, key, rec = plan.call.model, plan.key, plan.kv_record
        special = [every.get(name) for name in every.overlaid(model)]
        if key is not None:
            special += [every.get(name) for name in every.holders(key)]
        if rec is not None:
            inst = every.get(rec.instance)
            if inst in members and rec.at > cost.row(inst, model, plan.profile)[TAKEN_AT]:  # type: ignore[arg-type]
                special.append(inst)
        if self._positions is None:  # the book's eligible list is in the order (in step)
            special += members.difference(order.insts)  # none while the order is in step
        for inst in special:
            if inst in members and inst not in self.scored:
                self.score(inst)  # type: ignore[arg-type]

    def score(self, inst: InstanceState) -> None:
        cost, plan = self.cost, self.plan
        cand = cost.evaluate(plan, inst)
        if cand.needs_replica and cand.feasible and cost.knobs.residency_terms:
            gain = self.gain()
            if not math.isinf(gain) and not cost.passes_eq2(plan, inst, cand, gain):
                cand = cand._replace(feasible=False, reason=gate(cost, inst, plan))
        self.scored[inst] = cand
        if cand.feasible and _before(cand, self.best):
            self.best = cand
        if _before(cand, self.cheapest):
            self.cheapest = cand
        # NOTE: a skipped instance is never a retired one while nothing feasible is found (it
        # was skipped as infeasible by the round or HBM check), so the scored ones suffice
        if cand.reason == "retired" and _before(cand, self.retired):
            self.retired = cand

    def beyond_every_round(self) -> bool:
        """The call's own prefill and recovery exceed the round budget: an instance with work
        in its round fails the round check (`bounds.surely_busy`)."""
        return self.plan.prefill_s + self.recovery > self.cost.knobs.round_budget_s

    def infeasible_test(self):
        """A test that the round or HBM check fails for a plain instance (no session KV, no
        overlay for the model there), computed as `cost.score` does; what it reads of the
        call and the cost model is bound once (it runs per instance while nothing is feasible)."""
        cost, plan = self.cost, self.plan
        k, model, prefill, kv_bytes = cost.knobs, plan.call.model, plan.prefill_s, plan.kv_bytes
        leases, budget, terms = cost.leases.by_instance, k.round_budget_s, k.residency_terms
        recovery = self.recovery

        def infeasible(inst: InstanceState) -> bool:
            row = inst.rows[model]
            per_model = leases.get(inst.name)
            leased_all = per_model.get(None, 0.0) if per_model else 0.0
            activation = row[ACTIVATION] if terms else 0.0
            base = row[RISK] * (row[ROUND_LOAD] + inst.ov_work_s + leased_all)
            if base > 0.0 and base + prefill + recovery + activation > budget:
                return True
            hbm_free = row[HBM_FREE]  # None: the instance does not measure its memory, no HBM check
            return hbm_free is not None and kv_bytes + row[ADDED_BYTES] > hbm_free - inst.ov_hbm

        return infeasible

    def result(self, insts: list[InstanceState], skipped: bool) -> Ranking:
        scored, cheapest = (
            self.scored,
            self.cheapest.instance if self.cheapest is not None else None,
        )
        if not skipped:
            return Ranking(
                self.best, tuple(map(scored.__getitem__, insts)), cheapest, self._retired()
            )
        cost, plan, every, placed = self.cost, self.plan, self.every, self.cost.placed
        model, now, members = plan.call.model, plan.now, self.members
        # NOTE: the retirement rule reads the model's windows for every placeable instance where
        # the model is resident on a cold instance and nothing opens it (`evaluate` made those
        # reads for the scored ones); reads trim, and a window's last bits depend on which reads
        # trimmed it: trim the skipped ones' windows exactly as reading them would
        resident, model_work = every.resident_cold(model), None
        if now is not None:
            for name in resident:
                inst = every.get(name)
                if inst in members and not inst.opening(model):
                    model_work = placed.work_s(model, now)
                    break
        retiring = model_work is not None and not model_work <= 0.0
        leases, counts = cost.leases.held()
        # Eq. (2) may refuse a skipped candidate that needs a replica: the gain of this moment,
        # worked out from its facts when the explanation is read (most placements need it only
        # there); taking them trims the model's window on every instance of the book
        gain: float | GainFacts | None = self._gain
        wants_gain = gain is None and cost.knobs.residency_terms
        if wants_gain and self._absent_skipped(members):
            gain = cost.gain_facts(plan, every, self.demand, self.now)
        if now is not None:
            if type(gain) is not GainFacts or gain.rotation is None:
                self._trim_read(members, resident if retiring else _NO_NAMES)
            placed.advance(now)  # spare capacity and contention as of now
        if gain is None and wants_gain and self._retired_skipped(members, model_work):
            gain = cost.gain_facts(plan, every, self.demand, self.now)
        # NOTE: what an explanation holds outlives the call and so brings the next GC pass
        # nearer: one list (candidates, and the facts of the skipped), the books it needs
        entries, weighed = self._entries(insts)
        lazy = LazyCandidates(
            cost,
            plan,
            entries,
            leases,
            counts,
            placed.held_kept(model) if now is not None else None,
            placed.held_busy() if now is not None else None,
            model_work if retiring else None,
            gain,
            weighed,
        )
        return Ranking(self.best, lazy, cheapest, self._retired())

    def _entries(self, insts: list[InstanceState]) -> tuple[list | SkippedFacts, tuple | None]:
        """Per instance its candidate, or where it was skipped its facts (in `insts` order); and
        where few were scored, those in that order, the skipped ones' facts left in the book's
        state (`InstanceBook.facts`: O(1) to keep, where a copy of each is O(instances) and,
        its memory cold after the polls, 0.1 ms at 1,000 boxes)."""
        scored = self.scored
        if 4 * len(scored) > len(insts):
            return [scored[i] if i in scored else i.facts for i in insts], None
        at = self._positions
        placed = {}
        for inst, cand in scored.items():
            placed[insts.index(inst) if at is None else at[inst]] = cand  # few scored
        order = tuple(placed[p] for p in sorted(placed))
        return SkippedFacts(insts, self.every.facts.frozen(), placed), order

    def _trim_read(self, members: set[InstanceState], resident) -> None:
        """Trim the windows of the model that scoring the skipped instances would read:
        `CostModel.contenders`' wherever the model could add slots to other models' rounds, and
        the retirement rule's on the `resident` ones it judges."""
        every, cost, model = self.every, self.cost, self.plan.call.model

        def reads(name: str) -> bool:
            inst = every.get(name)
            if inst not in members:
                return False
            return cost.adds_slot(inst, model, inst.rows[model]) or (  # type: ignore[union-attr]
                name in resident and _reads(inst, members, model)
            )

        # a hot instance is never read so (no slot added, not resident cold) until it leaves
        # the hot pool
        cost.placed.trim_due(model, self.plan.now, reads, every.hot(), every.left_hot)  # type: ignore[arg-type]

    def _absent_skipped(self, members: set[InstanceState]) -> bool:
        """A skipped instance needs a fresh replica: the model is absent there."""
        every, model, scored = self.every, self.plan.call.model, self.scored
        for name in every.absent(model):
            inst = every.get(name)
            if inst in members and inst not in scored:
                return True
        return False

    def _retired_skipped(self, members: set[InstanceState], model_work: float | None) -> bool:
        """A skipped instance needs its retired replica reopened."""
        every, model, scored = self.every, self.plan.call.model, self.scored
        if model_work is None or model_work <= 0.0:
            return False
        kept, cost, prof = self.cost.placed.kept.get(model) or {}, self.cost, self.plan.profile
        for name in every.resident_cold(model):
            inst = every.get(name)
            if inst not in scored and _reads(inst, members, model):
                total = kept.get(name, 0.0)
                if (0.0 if 0.0 > total else total) < cost.keep_cost_on(
                    inst, model, prof, inst.rows[model]
                ):  # type: ignore[union-attr]
                    return True
        return False

    def _retired(self) -> CandidateCost | None:
        return self.retired if self.best is None else None


def _reads(inst: InstanceState | None, members: set, model: str) -> bool:
    """`CostModel.retired` reads the model's windows there (resident on a cold instance, which
    the caller checked, placeable, and no in-flight forward opens the model there)."""
    return inst in members and not inst.opening(model)  # type: ignore[union-attr]


def _before(cand: CandidateCost, other: CandidateCost | None) -> bool:
    """`cand` ranks before `other` (lower rank, ties by name); anything ranks before None."""
    if other is None:
        return True
    a, b = cand.rank_s, other.rank_s
    return a < b or (a == b and cand.instance < other.instance)


def _reaches(bound: float, cand: CandidateCost) -> bool:
    """`bound` is `cand`'s rank or above, but for rounding: the instance can at best tie it."""
    key = cand.rank_s
    return bound >= key - _RELATIVE_SLACK * abs(key) - 1e-12


def _above(bound: float, cand: CandidateCost | None) -> bool:
    """`bound` (a lower bound of Eq. (1), summed in another order) is surely above `cand`'s rank."""
    if cand is None:
        return False
    key = cand.rank_s
    return bound > key + _RELATIVE_SLACK * abs(key) + 1e-12
