"""Explanations rendered only when someone reads them: the per-candidate breakdown of a placement
whose ranking skipped instances (`ranking.rank`), scored from what was captured at placement time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from talariad.router.cost import (
    ACTIVATION,
    KV_OCCUPANCY,
    OTHER_CALLS,
    STAGING_SLACK,
    STATE,
    CallPlan,
    GainFacts,
    Inputs,
    contenders_of,
    gain_of,
    keep_cost_s,
    passes_eq2,
    score,
    spare_of,
)
from talariad.router.messages import CandidateCost, ModelState
from talariad.router.search.costmodel import CostModel
from talariad.router.search.logged import thaw
from talariad.types import KVState, Pool

_RESIDENT = ModelState.RESIDENT.value  # as a cost row holds it


class SkippedFacts(NamedTuple):
    """A ranking's entries where it scored few: its instances in order, the state of the book's
    facts (`InstanceBook.facts.frozen()`) the skipped ones render from, and the scored
    candidates by their place in `insts`."""

    insts: list
    facts: tuple
    scored: dict[int, CandidateCost]

    def entries(self) -> list:
        facts, scored = thaw(self.facts), self.scored
        return [scored.get(i) or facts[inst.name] for i, inst in enumerate(self.insts)]


class LazyCandidates(Sequence):
    """The per-candidate breakdown of one placement, scored from captured inputs when first read."""

    __slots__ = ("_cost", "_plan", "_entries", "_leases", "_counts", "_kept", "_busy")
    __slots__ += ("_model_work", "_gain", "_rendered", "_scored")

    def __init__(
        self,
        cost: CostModel,
        plan: CallPlan,
        entries: list | SkippedFacts,
        leases: tuple,
        counts: tuple,
        kept: tuple | None,
        busy: tuple | None,
        model_work: float | None,
        gain: float | GainFacts | None,
        scored: tuple[CandidateCost, ...] | None = None,
    ) -> None:
        """entries: per instance its candidate, or where it was skipped its
        `InstanceState.facts` (or the scored ones and the book's facts, `SkippedFacts`);
        leases, counts, kept, busy: the states (`logged.thaw`) of the lease charges and counts
        and the (instance, model) and (instance, None) work sums (`LeaseBook.held`,
        `PlacedWork.held_kept`, `held_busy`; the sums None without a placement time);
        model_work: the model's placed work where the retirement rule applies, else None;
        gain: Eq. (2)'s gain, or the facts it is worked out from (`CostModel.gain_facts`), None
        where no skipped candidate needs a replica; scored: the candidates among `entries` in
        their order, where the ranking kept them (None: `scored` reads the entries)."""
        self._cost, self._plan, self._entries = cost, plan, entries
        self._leases, self._counts, self._kept, self._busy = leases, counts, kept, busy
        self._model_work, self._gain, self._scored = model_work, gain, scored
        self._rendered: tuple[CandidateCost, ...] | None = None

    def _all(self) -> tuple[CandidateCost, ...]:
        if self._rendered is None:
            self._leases, self._counts = thaw(self._leases), thaw(self._counts)
            self._kept = thaw(self._kept) if self._kept is not None else None
            self._busy = thaw(self._busy) if self._busy is not None else None
            if type(self._gain) is GainFacts:
                window = self._cost.knobs.control_window_s
                self._gain = gain_of(self._plan, self._gain, self._busy, window)
            entries = self._entries
            if type(entries) is SkippedFacts:
                entries = entries.entries()
            self._rendered = tuple(self._render(e) if type(e) is tuple else e for e in entries)
            self._entries, self._leases, self._counts, self._scored = [], {}, {}, None
            self._kept = self._busy = None
        return self._rendered

    def _render(self, facts: tuple) -> CandidateCost:
        """`CostModel.evaluate` and Eq. (2) at placement time for an instance with no session KV
        and no overlay for the model (`CostModel.retired`, `contenders` and `spare_s` included)."""
        cost, plan, gain = self._cost, self._plan, self._gain
        model, prof = plan.call.model, plan.profile
        name, pool, rows, ov_work_s, ov_hbm, ov_calls = facts
        kept, busy = self._kept, self._busy
        row = rows[model]
        mu_facts = (row[KV_OCCUPANCY], row[STAGING_SLACK])  # `replica_facts`
        retired = False
        if row[STATE] == _RESIDENT and pool is not Pool.HOT and self._model_work is not None:
            total = kept.get(name, 0.0) if kept else 0.0
            keep = keep_cost_s(cost.knobs, model, prof, mu_facts, row[ACTIVATION])
            retired = (0.0 if 0.0 > total else total) < keep
        per_model = self._leases.get(name)
        if per_model:
            leased, leased_all = per_model.get(model, 0.0), per_model.get(None, 0.0)
        else:
            leased = leased_all = 0.0
        contenders, held = 0.0, self._counts.get(name)
        if row[OTHER_CALLS] is not None and not (held and held.get(model)):
            # `CostModel.contenders`: no overlay call of the model here, so all of them are others'
            calls = row[OTHER_CALLS] + ov_calls + (held.get(None, 0) if held else 0)
            share = None  # no placement time
            if busy is not None:
                total, own = busy.get(name, 0.0), kept.get(name, 0.0) if kept else 0.0
                share = (0.0 if 0.0 > total else total) - (0.0 if 0.0 > own else own)
            contenders = contenders_of(calls, share, cost.knobs.retire_window_s)
        cand = score(
            plan,
            Inputs(
                name,
                row,
                None,
                KVState.MISSING,
                0,
                leased,
                leased_all,
                ov_work_s,
                ov_hbm,
                retired,
                contenders,
            ),
            cost.knobs,
        )
        if cand.needs_replica and cand.feasible and gain is not None and not math.isinf(gain):
            if plan.now is None:
                spare = math.inf
            else:
                total = busy.get(name, 0.0)  # type: ignore[union-attr]
                spare = spare_of(0.0 if 0.0 > total else total, cost.knobs.control_window_s)
            state = ModelState(row[STATE])
            if not passes_eq2(cost.knobs, plan, mu_facts, state, cand, min(gain, spare)):
                cand = cand._replace(feasible=False, reason="retired" if retired else "eq2")
        return cand

    def __getitem__(self, i):
        return self._all()[i]

    def scored(self) -> list[CandidateCost]:
        """The candidates the ranking scored, in instance order (reading them renders none)."""
        if self._rendered is not None:
            return list(self._rendered)
        if self._scored is not None:
            return list(self._scored)  # no scan of every instance's entry
        return [e for e in self._entries if type(e) is not tuple]  # type: ignore[union-attr]

    def __len__(self) -> int:
        if self._rendered is not None:
            return len(self._rendered)
        entries = self._entries
        return len(entries.insts if type(entries) is SkippedFacts else entries)  # type: ignore[union-attr]

    def __iter__(self):
        return iter(self._all())

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(self._all())

    def __repr__(self) -> str:
        return repr(self._all())


def weighed(candidates: Sequence[CandidateCost]) -> Sequence[CandidateCost]:
    """The candidates a ranking weighed: those it scored where it skipped some (`LazyCandidates`,
    whose others are rendered only when read), else all."""
    return candidates.scored() if isinstance(candidates, LazyCandidates) else candidates
