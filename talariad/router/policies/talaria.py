"""Talaria's session-aware residency routing: Algorithm 1 of the paper (§3.3, §4.1).

1. A live lease for (session, model) on a healthy instance allowed the model that still holds
   the prefix (device or host) is consumed and wins; any other lease for the pair is discarded.
2. Otherwise the placeable instances are scored by Eq. (1), filtered by round admission (Eq. 5)
   and HBM, and a fresh replica must pass Eq. (2).
3. The cheapest survivor wins, a feasible hot instance before a cold one; with none, a retired
   replica reopens, else the overload policy applies. Design: docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from talariad.router.boxes import prefix_rank
from talariad.router.cost import CallPlan
from talariad.router.messages import CallRequest, CandidateCost, DecisionKind, ModelState
from talariad.router.policies.base import POLICIES, Choice, ClusterView, Policy
from talariad.router.search.lazy import weighed
from talariad.router.search.ranking import rank
from talariad.types import KVState, Pool


@POLICIES.register("talaria")
class TalariaPolicy(Policy):
    installs_leases = True
    ranker = staticmethod(rank)  # `cost.rank_all` scores every instance: the reference it equals

    def choose(self, call: CallRequest, view: ClusterView, now: float) -> Choice:
        plan = view.cost.plan(call, now)
        hit, note = self._consume_lease(plan, view, now)
        if hit is not None:
            return hit
        home = self._session_home(plan, view, now) if self.knobs.session_home else None
        placed = self._cost_placement(plan, view, now, note)
        if home is None or placed.best is None or placed.instance == home.instance:
            return home or placed
        # home, unless staying costs more than a round bound over the cheapest elsewhere
        worse = home.best.rank_s - placed.best.rank_s  # type: ignore[union-attr]
        return home if worse <= self.knobs.round_budget_s else placed

    def _session_home(self, plan: CallPlan, view: ClusterView, now: float) -> Choice | None:
        """The call at the target holding its prefix, if that target can take it now (no replica
        to open, the HBM check, and the round check unless the prefix is on its device;
        `RouterKnobs.session_home`); None: by cost."""
        call, key = plan.call, plan.key
        if key is None:
            return None
        lease, rec = view.leases.get(key), plan.kv_record
        names = [lease.instance] if lease is not None else []
        names += [rec.instance] if rec is not None else []
        names += sorted(view.instances.holders(key), key=lambda n: _held_rank(view, n, key))
        for name in names:
            inst = view.instances.get(name)
            # `view.eligible` holds it: one instance's test, not a scan of that list
            if inst is None or not inst.placeable(call.model, now, view.knobs):
                continue
            kv = view.kv(inst, call)[0]
            if kv is KVState.MISSING:
                continue
            cand = view.cost.evaluate(plan, inst)
            # a prefix on its home's device is a continuation the box admits mid-slot, past its
            # round budget, as a lease is (the box keeps its own lease for the session): only
            # the HBM check and a replica to open rule its home out
            admits = cand.feasible or (kv is KVState.DEVICE and cand.reason == "round")
            if not admits or cand.needs_replica:
                return None  # its home cannot take it now
            whose = "its head's branch" if call.prefix_of else "its branch"
            why = f"the session's home: {whose} prefix is here"
            return Choice(inst.name, DecisionKind.COST, (cand,), why, best=cand, plan=plan)
        return None

    def _consume_lease(
        self, plan: CallPlan, view: ClusterView, now: float
    ) -> tuple[Choice | None, str]:
        call = plan.call
        if call.session_id is None:
            return None, ""
        lease = view.leases.take((call.session_id, call.model))  # consumed or discarded
        if lease is None:
            return None, ""
        inst = view.instances.get(lease.instance)
        if not lease.live(call.judged_at(now)):
            return None, "lease expired"
        if inst is None or not inst.healthy() or call.model not in inst.snapshot.allowed_models:
            return None, "lease instance unhealthy"
        if view.kv(inst, call)[0] is KVState.MISSING:
            return None, "lease prefix missing"
        cand = view.cost.evaluate(plan, inst)
        choice = Choice(inst.name, DecisionKind.LEASE_HIT, (cand,), "lease", best=cand, plan=plan)
        return choice, ""

    def _cost_placement(self, plan: CallPlan, view: ClusterView, now: float, note: str) -> Choice:
        insts = view.eligible(plan.call.model, now)
        ranking = self.ranker(view.cost, plan, insts, view.instances, view.demand, now)
        best, cands, spill = ranking.best, ranking.candidates, ranking.cheapest
        prefix = f"{note}; " if note else ""
        why = "min cost"
        considered = self._considered(cands, len(insts))
        if best is not None and self._cheaper_to_wait(best, considered):
            best, prefix = None, prefix + "an in-rotation replica within a round bound costs less; "
        if best is None:
            # the replicas in rotation are over their admission budget: the load no longer
            # allows concentrating the model, so the cheapest retired replica reopens
            best = ranking.retired
            why = "in-rotation replicas infeasible"
        if best is None and self._waits_where_served():
            best = min(
                (c for c in considered if c.reason in _QUEUES and not c.needs_replica),
                key=_total,
                default=None,
            )
            why = "queued where the model is served"
        if best is None:
            why = prefix + "no feasible instance"
            return Choice(None, DecisionKind.COST, cands, why, spill, plan=plan)
        if view.instances.get(best.instance).snapshot.pool is not Pool.HOT:
            hot_best = self._hot_best(plan, view, insts, now)
            if hot_best is not None:
                best, why = hot_best, "hot pool pins the model"
        kind = DecisionKind.REPLICA_OPEN if best.needs_replica else DecisionKind.COST
        why = f"{prefix}{why}; {_lifecycle(best, view, plan)}"
        return Choice(best.instance, kind, cands, why, best=best, plan=plan)

    def _waits_where_served(self) -> bool:
        """Under the "queue" overload policy a call that only the serving replicas' round budget
        (Eq. 5) or KV room refuses waits in the cheapest one's queue rather than at the gateway.
        Round admission chooses among instances; with none to choose it only delays the call:
        the replica's scheduler starts it at its model's next slot (or when KV room frees),
        while a gateway hold re-places it at retry intervals, after that slot may have opened,
        and the leased returns (which skip the round check) keep the round over budget."""
        return self.knobs.overload == "queue"

    def _considered(self, cands: Sequence[CandidateCost], eligible: int) -> Sequence[CandidateCost]:
        """The candidates a placement chooses among: with a candidate set smaller than the
        `eligible` instances (`RouterKnobs.cost_candidates`) the ones the ranking scored, since
        reading the others scores every instance (a prompt too long for any round: a thousand
        boxes); else all, as the reference reads them (a skipped one may still be the cheapest
        to queue at)."""
        k = self.knobs.cost_candidates
        return weighed(cands) if k is not None and eligible > k else cands

    def _cheaper_to_wait(self, best: CandidateCost, cands: Sequence[CandidateCost]) -> bool:
        """`best`'s price beyond Eq. (1) (a replica open, the delay it imposes on other models'
        calls) exceeds a round bound, and an in-rotation replica refused only by the round check
        costs less even after a whole round bound of waiting: the call waits for it (in its
        queue, see `_waits_where_served`, or at the gateway under the other overload policies)."""
        bound = self.knobs.round_budget_s
        if best.replica_s + best.contention_s <= bound:
            return False  # cheap: skip reading (rendering) the other candidates
        waits = (c.rank_s for c in cands if c.reason == "round" and not c.needs_replica)
        wait = min(waits, default=None)
        return wait is not None and wait + bound < best.rank_s

    def _hot_best(self, plan: CallPlan, view: ClusterView, insts: list, now: float):
        """The cheapest feasible hot instance allowed the model, or None."""
        if not view.instances.hot():
            return None  # no hot pool: skip reading every candidate's snapshot
        hot = [i for i in insts if i.snapshot.pool is Pool.HOT]
        if not hot:
            return None
        return self.ranker(view.cost, plan, hot, view.instances, view.demand, now).best


_QUEUES = ("round", "hbm")  # refusals an instance's own scheduler waits out (a slot, KV room)


def _held_rank(view: ClusterView, name: str, key: tuple[str, str]) -> tuple:
    """Holders of a prefix, best first: on a device before on the host, the longest, by name."""
    return (*prefix_rank(view.instances.get(name).snapshot.sessions[key]), name)


def _total(c) -> tuple[float, str]:
    return (c.rank_s, c.instance)


def _lifecycle(best, view: ClusterView, plan: CallPlan) -> str:
    """The replica decision behind a placement, for the explanation: open (a fresh replica),
    reopen (a retired one, past Eq. (2)) or keep (the model stays in the instance's rotation)."""
    if not best.needs_replica:
        return "keep"
    inst = view.instances.get(best.instance)
    absent = view.cost.model_state(inst, plan.call.model) is ModelState.ABSENT
    return "open replica" if absent else "reopen retired replica"
