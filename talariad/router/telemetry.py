"""Instance telemetry intake: latest versioned snapshot, heartbeats, and the in-flight overlay.

The overlay (§4.1) is what the router itself forwarded since an instance's latest snapshot:
such calls are not yet in the snapshot's queues, so their predicted work, tokens, HBM and any
model they open are added on top of it. A forward stamped at or before `snapshot.taken_at` is
taken to be reflected in the snapshot and leaves the overlay (it stays in flight for counts).
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass

from talariad.router.knobs import RouterKnobs
from talariad.router.messages import CallRequest, InstanceSnapshot, ModelState
from talariad.router.search.logged import LoggedDict
from talariad.types import Pool

_OPEN = (ModelState.ACTIVE, ModelState.RESIDENT)
_NONE: set[str] = set()  # NOTE: returned for a model no instance is indexed under; never changed


@dataclass(slots=True)
class InFlight:
    """A call the router forwarded and has not yet seen complete or fail."""

    call: CallRequest
    instance: str
    forwarded_at: float
    work_s: float  # prefill + KV recovery + activation it adds to the instance's round
    new_tokens: int  # prompt tokens the instance must prefill (suffix + recompute)
    hbm_bytes: int  # KV bytes plus added weight bytes if it opens the model
    opens_model: bool
    counted: bool = False  # currently part of the overlay aggregates


class InstanceState:
    """Everything the router knows about one instance."""

    __slots__ = (
        "name",
        "snapshot",
        "taken_at",
        "allowed",
        "last_seen",
        "health_ok",
        "health_at",
        "inflight",
        "ov_work_s",
        "ov_hbm",
        "ov_calls",
        "ov_model",
        "rows",
        "open_share",
        "closed",
        "facts",
        "log",
    )

    def __init__(self, name: str, log: LoggedDict | None = None) -> None:
        self.name = name
        self.log = log  # the book's facts by name (`InstanceBook.facts`): `facts` set there too
        self.snapshot: InstanceSnapshot | None = None
        self.taken_at = float("-inf")  # snapshot fields copied out for the per-call filter
        self.allowed: frozenset[str] = frozenset()
        self.rows: dict[str, tuple] = {}  # per-model cost rows cached by the cost model
        self.last_seen = float("-inf")
        self.health_ok = False
        self.health_at = float("-inf")
        self.inflight: dict[str, InFlight] = {}
        # model -> (queued tokens, running calls), where it is open (Eq. 2)
        self.open_share: dict[str, tuple[int, int]] = {}
        self.closed = False
        """Cordoned or drained by the operator: no new placement (`allowed` stays empty)."""
        self.facts: tuple = ()
        """What a placement's lazy explanation reads about this instance, as one immutable
        value replaced on every change: (name, pool, cost rows, overlay work, overlay HBM,
        overlay calls). Not the snapshot's models, whose parts the rows copy: what an explanation
        holds outlives the call, and the collector walks it. `rows` is replaced too, never
        changed (`set_row`)."""
        self._reset_overlay()

    def open_load(self, model: str) -> tuple[int, int] | None:
        """(queued tokens, running calls) of `model` (snapshot + overlay) if it is open here on
        a healthy instance (active, resident, or being opened by an in-flight forward), else
        None."""
        if self.snapshot is None or not self.health_ok:
            return None
        res = self.snapshot.models.get(model)
        ov = self.ov_model.get(model)
        if not (ov is not None and ov[2] > 0) and (res is None or res.state not in _OPEN):
            return None
        queued, running = (res.queued_tokens, res.running_calls) if res is not None else (0, 0)
        return (queued + ov[0], running + ov[1]) if ov is not None else (queued, running)

    def healthy(self) -> bool:
        """Passes the health check: has telemetry and its latest health report is good."""
        return self.snapshot is not None and self.health_ok

    def fresh(self, now: float, knobs: RouterKnobs) -> bool:
        """Snapshot within the staleness bound and no missed heartbeat."""
        return (
            self.snapshot is not None
            and now - self.taken_at <= knobs.staleness_s
            and now - self.last_seen <= knobs.heartbeat_s
        )

    def placeable(self, model: str, now: float, knobs: RouterKnobs) -> bool:
        """Eligible for non-reserved placement of `model`."""
        return self.health_ok and self.fresh(now, knobs) and model in self.allowed

    def report_health(self, healthy: bool, now: float) -> None:
        if now >= self.health_at:
            self.health_ok, self.health_at = healthy, now
        self.last_seen = max(self.last_seen, now)

    def add(self, rec: InFlight) -> None:
        self.inflight[rec.call.call_id] = rec
        snap = self.snapshot
        if snap is None or rec.forwarded_at >= snap.taken_at:
            self._count(rec, +1)

    def remove(self, call_id: str) -> InFlight | None:
        rec = self.inflight.pop(call_id, None)
        if rec is not None and rec.counted:
            self._count(rec, -1)
        return rec

    def install(self, snapshot: InstanceSnapshot) -> None:
        self.snapshot = snapshot
        self.taken_at, self.rows = snapshot.taken_at, {}
        self.allowed = frozenset() if self.closed else snapshot.allowed_models
        self._reset_overlay()
        for rec in self.inflight.values():
            rec.counted = False
            # NOTE: >=: a forward stamped at the snapshot's own instant was placed after it was
            # taken (the simulator samples and places at one `now`), so the snapshot lacks it
            if rec.forwarded_at >= snapshot.taken_at:
                self._count(rec, +1)

    def set_row(self, model: str, row: tuple) -> None:
        """Cache the cost model's row for `model` (a new dict: explanations keep the old one)."""
        self.rows = {**self.rows, model: row}
        self._refresh_facts()

    def _refresh_facts(self) -> None:
        snap = self.snapshot
        self.facts = (
            self.name,
            snap.pool if snap is not None else None,
            self.rows,
            self.ov_work_s,
            self.ov_hbm,
            self.ov_calls,
        )
        if self.log is not None:
            self.log.set(self.name, self.facts)

    def opening(self, model: str) -> int:
        """In-flight forwards (not yet in a snapshot) that open `model` here."""
        row = self.ov_model.get(model)
        return row[2] if row else 0

    def check_integrity(self) -> None:
        work, hbm, per_model = 0.0, 0, defaultdict(lambda: [0, 0, 0])
        for rec in self.inflight.values():
            if rec.instance != self.name:
                raise AssertionError(f"{rec.call.call_id} misfiled under {self.name}")
            if rec.counted:
                work, hbm = work + rec.work_s, hbm + rec.hbm_bytes
                row = per_model[rec.call.model]
                row[0] += rec.new_tokens
                row[1] += 1
                row[2] += int(rec.opens_model)
        if abs(work - self.ov_work_s) > 1e-6 or hbm != self.ov_hbm:
            raise AssertionError(f"overlay of {self.name} out of step with its in-flight calls")
        if dict(per_model) != {m: r for m, r in self.ov_model.items() if any(r)}:
            raise AssertionError(f"per-model overlay of {self.name} out of step")
        if self.ov_calls != sum(r[1] for r in per_model.values()):
            raise AssertionError(f"overlay call count of {self.name} out of step")
        snap = self.snapshot
        pool = snap.pool if snap is not None else None
        want = (self.name, pool, self.rows, self.ov_work_s, self.ov_hbm, self.ov_calls)
        if self.facts != want:
            raise AssertionError(f"explanation facts of {self.name} out of step")

    def _reset_overlay(self) -> None:
        self.ov_work_s = 0.0
        self.ov_hbm = 0
        self.ov_calls = 0
        self.ov_model: dict[str, list[int]] = {}  # model -> [new tokens, calls, opening calls]
        self._refresh_facts()

    def _count(self, rec: InFlight, sign: int) -> None:
        row = self.ov_model.get(rec.call.model)
        if row is None:
            row = self.ov_model[rec.call.model] = [0, 0, 0]
        row[0] += sign * rec.new_tokens
        row[1] += sign
        row[2] += sign if rec.opens_model else 0
        self.ov_work_s = max(0.0, self.ov_work_s + sign * rec.work_s)
        self.ov_hbm += sign * rec.hbm_bytes
        self.ov_calls += sign
        rec.counted = sign > 0
        self._refresh_facts()


class InstanceBook:
    """All instances the router has heard of, in a fixed (name) order for determinism."""

    def __init__(self) -> None:
        self._by_name: dict[str, InstanceState] = {}
        self._ordered: list[InstanceState] = []
        self._calls: dict[str, InstanceState] = {}
        # model -> [open replicas, their queued tokens] over healthy instances: Eq. (2)'s k and
        # backlog, kept up to date by every event that can change them
        self._open: dict[str, list[int]] = {}  # model -> [k, queued tokens, running calls]
        self.closed: set[str] = set()
        """Instances closed to new placement; kept by name so a restarted instance stays closed."""
        # model -> instances whose snapshot has it resident on a cold instance / absent (not
        # listed, or listed absent): where the retirement rule and Eq. (2) may apply
        self._resident: defaultdict[str, set[str]] = defaultdict(set)
        self._absent: defaultdict[str, set[str]] = defaultdict(set)
        self._indexed: dict[str, list[set[str]]] = {}  # instance -> the sets it is in
        # model -> instances with an overlay for it (forwards not yet in a snapshot), and
        # (session, model) -> instances whose snapshot holds that session's KV: where a call's
        # cost depends on more than the snapshot row (`search.ranking.rank` scores those first)
        self._overlaid: defaultdict[str, set[str]] = defaultdict(set)
        self._holders: dict[tuple[str, str], set[str]] = {}
        self._hot: set[str] = set()  # instances whose snapshot puts them in the hot pool
        self.left_hot = 0
        """Bumped whenever an instance leaves `hot()` (a new pool, or gone from the book)."""
        self.generation = 0
        """Bumped whenever an instance's snapshot, membership or closed state changes."""
        self.changes = 0
        """Bumped by those and by every heartbeat: whatever `placeable` reads but the clock."""
        # the instances `placeable` admits but for the clock (healthy, some model allowed), and
        # the oldest snapshot and heartbeat among them as heaps kept at every change: while both
        # are fresh a pick reads its eligible list here, built once per change of that set,
        # instead of filtering every instance after each snapshot (docs/pool.md "Scale")
        self._serving: dict[str, frozenset[str]] = {}  # name -> its allowed models
        self._serving_by_model: dict[str, list] = {}  # model -> [its list, `positions`]
        self._taken: list[tuple[float, str]] = []  # heap of (taken_at, name), stale entries too
        self._seen: list[tuple[float, str]] = []  # heap of (last_seen, name), the same
        self.facts = LoggedDict()
        """Every instance's `InstanceState.facts` by name: a ranking that skipped most
        instances keeps its state (O(1)) for the explanation, not a copy of each one's."""

    def open_replicas(self, model: str) -> tuple[int, int]:
        """(k, queued tokens) of `model` over its open replicas on healthy instances."""
        agg = self._open.get(model)
        return (agg[0], agg[1]) if agg is not None else (0, 0)

    def open_running(self, model: str) -> int:
        """The calls of `model` running (decoding) over its open replicas on healthy instances."""
        agg = self._open.get(model)
        return agg[2] if agg is not None else 0

    def resident_cold(self, model: str) -> set[str]:
        """Instances whose snapshot has `model` resident (not active) on a cold instance."""
        return self._resident.get(model) or _NONE

    def absent(self, model: str) -> set[str]:
        """Instances whose snapshot has `model` absent (a placement there opens a replica)."""
        return self._absent.get(model) or _NONE

    def overlaid(self, model: str) -> set[str]:
        """Instances with in-flight forwards of `model` counted in their overlay."""
        return self._overlaid.get(model) or _NONE

    def holders(self, key: tuple[str, str]) -> set[str]:
        """Instances whose snapshot holds the KV of (session, model) `key`."""
        return self._holders.get(key) or _NONE

    def _reoverlay(self, inst: InstanceState, models) -> None:
        """Move `inst` into or out of the `overlaid` sets of `models`."""
        known = inst.name in self._by_name
        for model in models:
            ov = inst.ov_model.get(model)
            if known and ov is not None and (ov[0] or ov[1] or ov[2]):
                self._overlaid[model].add(inst.name)
            elif model in self._overlaid:
                self._overlaid[model].discard(inst.name)

    def _rehold(self, name: str, old: dict, new: dict) -> None:
        """Move `name` in the `holders` sets from snapshot sessions `old` to `new`."""
        holders = self._holders
        for key in old.keys() - new.keys():
            names = holders[key]
            names.discard(name)
            if not names:
                del holders[key]
        for key in new.keys() - old.keys():
            holders.setdefault(key, set()).add(name)

    def _rehold_keys(self, name: str, sessions, keys) -> None:
        """Move `name` in the `holders` sets of `keys` only: O(changes), where the snapshot
        updated its predecessor's mapping in place (the old key set is gone)."""
        holders = self._holders
        for key in keys:
            if key in sessions:
                holders.setdefault(key, set()).add(name)
            elif (names := holders.get(key)) is not None:
                names.discard(name)
                if not names:
                    del holders[key]

    def hot(self) -> set[str]:
        """Instances whose snapshot puts them in the hot pool."""
        return self._hot

    def _index(self, inst: InstanceState) -> None:
        for held in self._indexed.pop(inst.name, ()):
            held.discard(inst.name)
        was_hot = inst.name in self._hot
        self._hot.discard(inst.name)
        snap = inst.snapshot
        if snap is not None and inst.name in self._by_name and snap.pool is Pool.HOT:
            self._hot.add(inst.name)
        elif was_hot:
            self.left_hot += 1
        if snap is None or inst.name not in self._by_name:
            return
        held = self._indexed[inst.name] = []
        for model in snap.allowed_models | snap.models.keys():
            state = snap.residency(model).state
            if state is ModelState.ABSENT:
                held.append(self._absent[model])
            elif state is ModelState.RESIDENT and snap.pool is not Pool.HOT:
                held.append(self._resident[model])
        for names in held:
            names.add(inst.name)

    def serving(self, model: str) -> list[InstanceState]:
        """The healthy instances allowed `model`, by name, fresh or not (read it, do not change
        it): `placeable` but for the clock."""
        held = self._serving_by_model.get(model)
        if held is None:
            insts = [i for i in self._ordered if i.name in self._serving and model in i.allowed]
            held = self._serving_by_model[model] = [insts, None]
        return held[0]

    def positions(self, model: str, insts: list[InstanceState]) -> dict[InstanceState, int] | None:
        """Each instance's place in `insts` where that is `serving(model)`'s current list (built
        once per list), else None: a ranking's members and where their entries go."""
        held = self._serving_by_model.get(model)
        if held is None or held[0] is not insts:
            return None
        if held[1] is None:
            held[1] = {inst: i for i, inst in enumerate(insts)}
        return held[1]

    def oldest(self) -> tuple[float, float]:
        """The oldest snapshot time and heartbeat among the serving instances (inf: none)."""
        taken, seen = self._taken, self._seen
        return (taken[0][0] if taken else math.inf), (seen[0][0] if seen else math.inf)

    def _restate(self, inst: InstanceState) -> None:
        """Keep the serving set and its heaps in step with `inst`'s health, models and clocks
        (after every change of them): O(log instances), amortised."""
        name, serving = inst.name, self._serving
        now_in = inst.health_ok and bool(inst.allowed) and self._by_name.get(name) is inst
        if now_in != (name in serving) or (now_in and serving[name] != inst.allowed):
            self._serving_by_model.clear()
        if now_in:
            serving[name] = inst.allowed
            heapq.heappush(self._taken, (inst.taken_at, name))
            heapq.heappush(self._seen, (inst.last_seen, name))
        else:
            serving.pop(name, None)
        self._settle(self._taken, "taken_at")
        self._settle(self._seen, "last_seen")

    def _settle(self, heap: list[tuple[float, str]], field: str) -> None:
        """Drop the heap's top entries that no longer stand for a serving instance's value; a
        heap grown past a few entries per instance is built again."""
        serving, by_name = self._serving, self._by_name
        if len(heap) > 4 * len(serving) + 64:
            heap[:] = [(getattr(by_name[n], field), n) for n in serving]
            heapq.heapify(heap)
            return
        while heap:
            at, name = heap[0]
            if name in serving and getattr(by_name[name], field) == at:
                return
            heapq.heappop(heap)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def names(self):
        """The names of every instance (a live view)."""
        return self._by_name.keys()

    def get(self, name: str) -> InstanceState | None:
        return self._by_name.get(name)

    def all(self) -> list[InstanceState]:
        return self._ordered

    def observe(self, snapshot: InstanceSnapshot, now: float) -> bool:
        """Install a snapshot unless an equal or newer version is already installed."""
        inst = self._by_name.get(snapshot.instance) or self._add(snapshot.instance)
        if inst.snapshot is not None and snapshot.version <= inst.snapshot.version:
            return False
        old = inst.snapshot.sessions if inst.snapshot is not None else {}
        inst.install(snapshot)
        self.generation += 1
        self.changes += 1
        self._index(inst)
        if old is snapshot.sessions and snapshot.sessions_changed is not None:
            self._rehold_keys(inst.name, snapshot.sessions, snapshot.sessions_changed)
        else:
            self._rehold(inst.name, old, snapshot.sessions)
        self._reoverlay(inst, self._overlaid.keys() | inst.ov_model.keys())  # recounted
        inst.report_health(snapshot.healthy, now)
        self._restate(inst)
        self._reshare(inst, inst.open_share.keys() | snapshot.models.keys() | inst.ov_model.keys())
        return True

    def heartbeat(self, name: str, now: float, healthy: bool) -> bool:
        inst = self._by_name.get(name)
        if inst is None:
            return False
        before = inst.health_ok
        inst.report_health(healthy, now)
        self.changes += 1
        self._restate(inst)
        if inst.health_ok != before and inst.snapshot is not None:
            self._reshare(
                inst, inst.open_share.keys() | inst.snapshot.models.keys() | inst.ov_model.keys()
            )
        return True

    def set_closed(self, name: str, closed: bool) -> None:
        (self.closed.add if closed else self.closed.discard)(name)
        inst = self._by_name.get(name)
        self.generation += 1
        self.changes += 1
        if inst is not None:
            inst.closed = closed
            inst.allowed = (
                frozenset() if closed or inst.snapshot is None else inst.snapshot.allowed_models
            )
            self._restate(inst)

    def remove(self, name: str) -> list[InFlight]:
        inst = self._by_name.pop(name, None)
        if inst is None:
            return []
        inst.health_ok = False  # gone: it no longer counts as an open replica
        self.generation += 1
        self.changes += 1
        self._reshare(inst, set(inst.open_share))
        self._index(inst)
        self._reoverlay(inst, list(self._overlaid))
        if inst.snapshot is not None:
            self._rehold(name, inst.snapshot.sessions, {})
        self._ordered.remove(inst)
        self._restate(inst)  # no longer in the book: leaves the serving set
        for call_id in inst.inflight:
            self._calls.pop(call_id, None)
        return list(inst.inflight.values())

    def add_inflight(self, rec: InFlight) -> bool:
        inst = self._by_name.get(rec.instance)
        if inst is None:
            return False
        self.pop_inflight(rec.call.call_id)
        inst.add(rec)
        self._calls[rec.call.call_id] = inst
        self._reshare(inst, (rec.call.model,))
        self._reoverlay(inst, (rec.call.model,))
        return True

    def inflight(self, call_id: str) -> InFlight | None:
        inst = self._calls.get(call_id)
        return inst.inflight.get(call_id) if inst is not None else None

    def pop_inflight(self, call_id: str) -> InFlight | None:
        inst = self._calls.pop(call_id, None)
        if inst is None:
            return None
        rec = inst.remove(call_id)
        if rec is not None:
            self._reshare(inst, (rec.call.model,))
            self._reoverlay(inst, (rec.call.model,))
        return rec

    def _reshare(self, inst: InstanceState, models) -> None:
        """Move `inst`'s share of the open-replica aggregates of `models` to its current state."""
        for model in list(models):
            old = inst.open_share.pop(model, None)
            agg = self._open.setdefault(model, [0, 0, 0])
            if old is not None:
                agg[0] -= 1
                agg[1] -= old[0]
                agg[2] -= old[1]
            new = inst.open_load(model)
            if new is not None:
                inst.open_share[model] = new
                agg[0] += 1
                agg[1] += new[0]
                agg[2] += new[1]

    def check_integrity(self) -> None:
        for inst in self._ordered:
            inst.check_integrity()
            if self.facts.live.get(inst.name) is not inst.facts:
                raise AssertionError(f"facts of {inst.name} out of step with the book's")
            for call_id in inst.inflight:
                if self._calls.get(call_id) is not inst:
                    raise AssertionError(f"call {call_id} not indexed to {inst.name}")
        if len(self._calls) != sum(len(i.inflight) for i in self._ordered):
            raise AssertionError("call index holds calls no instance has in flight")
        fresh: dict[str, list[int]] = {}
        for inst in self._ordered:
            models = inst.snapshot.models.keys() if inst.snapshot else set()
            for model in inst.open_share.keys() | inst.ov_model.keys() | models:
                load = inst.open_load(model)
                if load != inst.open_share.get(model):
                    raise AssertionError(f"open-replica share of {inst.name}/{model} out of step")
                if load is not None:
                    agg = fresh.setdefault(model, [0, 0, 0])
                    agg[0] += 1
                    agg[1] += load[0]
                    agg[2] += load[1]
        if {m: a for m, a in self._open.items() if a != [0, 0, 0]} != fresh:
            raise AssertionError("open-replica aggregates out of step with the instances")
        resident: defaultdict[str, set[str]] = defaultdict(set)
        absent: defaultdict[str, set[str]] = defaultdict(set)
        for inst in self._ordered:
            snap = inst.snapshot
            for model in snap.allowed_models | snap.models.keys() if snap else ():
                state = snap.residency(model).state
                if state is ModelState.ABSENT:
                    absent[model].add(inst.name)
                elif state is ModelState.RESIDENT and snap.pool is not Pool.HOT:
                    resident[model].add(inst.name)
        for index, want in ((self._resident, resident), (self._absent, absent)):
            if {m: names for m, names in index.items() if names} != want:
                raise AssertionError("per-model residency index out of step with the snapshots")
        overlaid: defaultdict[str, set[str]] = defaultdict(set)
        holders: defaultdict[tuple[str, str], set[str]] = defaultdict(set)
        for inst in self._ordered:
            for model, ov in inst.ov_model.items():
                if ov[0] or ov[1] or ov[2]:
                    overlaid[model].add(inst.name)
            for key in inst.snapshot.sessions if inst.snapshot else ():
                holders[key].add(inst.name)
        serving = {i.name for i in self._ordered if i.health_ok and i.allowed}
        if self._serving.keys() != serving:
            raise AssertionError("serving set out of step with the instances' health and models")
        if serving and self.oldest() != (
            min(i.taken_at for i in self._ordered if i.name in serving),
            min(i.last_seen for i in self._ordered if i.name in serving),
        ):
            raise AssertionError("oldest serving snapshot or heartbeat out of step")
        if {m: names for m, names in self._overlaid.items() if names} != overlaid:
            raise AssertionError("per-model overlay index out of step with the overlays")
        if self._holders != holders:
            raise AssertionError("session KV index out of step with the snapshots")
        hot = {i.name for i in self._ordered if i.snapshot and i.snapshot.pool is Pool.HOT}
        if self._hot != hot:
            raise AssertionError("hot-pool index out of step with the snapshots")

    def _add(self, name: str) -> InstanceState:
        inst = InstanceState(name, self.facts)
        inst.closed = name in self.closed
        self._by_name[name] = inst
        self._ordered = sorted(self._by_name.values(), key=lambda i: i.name)
        self._serving_by_model.clear()  # by name order: a newcomer may serve once installed
        return inst
