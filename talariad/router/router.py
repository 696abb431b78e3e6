"""The router: a sans-IO state machine over calls, completions and telemetry (§3.3, §4.1).

Every method takes the time `now` (seconds, the shell's clock) and returns a value; nothing here
reads a clock, sleeps or does IO. `place()` records its own forward in the in-flight overlay, so
back-to-back decisions see each other before the next snapshot; `forwarded()` only re-stamps or
re-targets that record when the shell sent the call later or elsewhere.
"""

from __future__ import annotations

import random
from collections import OrderedDict

from talariad.router.knobs import RouterKnobs
from talariad.router.messages import (
    CallRequest,
    Decision,
    DecisionKind,
    ExpiryReport,
    InstanceSnapshot,
    InstanceStatus,
    Lease,
    SessionEntry,
)
from talariad.router.policies import POLICIES, Choice, ClusterView
from talariad.router.profiles import DemandTracker, ProfileBook
from talariad.router.search.costmodel import CostModel
from talariad.router.sessions import LeaseBook, SessionTable
from talariad.router.telemetry import InstanceBook
from talariad.types import KVState, LatencyProfile, RoundMeasurement

DECISION_LOG = 4096  # decisions kept for `explain()`
FREE_DECISIONS = 64
"""Decisions the log dropped freed per `observe` or `expire`, at most: after a burst the 4,096
waiting were freed in one box install (32 ms at 1,000 boxes, cold memory)."""
BUSY_TRIM_STEP = 64
"""Windows of placed work a telemetry event trims, at most (`Router._between`)."""
PLACE_EXPIRY_STEP = 32
"""Expired leases a placement drops before deciding, at most: a burst of sessions opened together
expires together, and one call must not pay for all of them (`expire` drops the rest in steps;
a lease is judged live at its consumption whatever the book holds)."""
MIN_RETRY_S = 0.05


class Router:
    """Session-aware placement with soft reservations; `policy` picks a registered policy."""

    def __init__(
        self, knobs: RouterKnobs, profiles: dict[str, LatencyProfile], policy: str = "talaria"
    ) -> None:
        self.knobs = knobs
        self._policy = POLICIES.get(policy)(knobs, random.Random(knobs.seed))
        self._profiles = ProfileBook(profiles, knobs.ewma_alpha)
        self._leases, self._instances = LeaseBook(), InstanceBook()
        self._sessions = SessionTable(knobs.max_sessions)
        self._demand = DemandTracker(knobs.control_window_s)
        self._cost = CostModel(knobs, self._profiles, self._leases, self._sessions)
        self._view = ClusterView(
            knobs, self._instances, self._sessions, self._leases, self._cost, self._demand
        )
        self._queued: OrderedDict[str, float] = OrderedDict()  # call id -> first held at
        self._drained: set[str] = set()  # instances that get no new leases
        self._decisions: OrderedDict[str, Decision] = OrderedDict()
        # NOTE: freeing a decision frees what its explanation kept (its candidates, the cost
        # rows and book states it shared with others): the ones the log drops are freed by the
        # next `observe` or `expire`, off the placement path (at most a log's length waits)
        self._dropped: list[Decision] = []

    @property
    def policy(self) -> str:
        return self._policy.name

    def retune(self, knobs: RouterKnobs) -> None:
        """Replace the knobs live (config reload); books, leases and sessions are kept."""
        for part in (self, self._policy, self._cost, self._view):
            part.knobs = knobs

    # --- telemetry ---------------------------------------------------------------------------
    def observe(self, snapshot: InstanceSnapshot, now: float) -> bool:
        """Install a snapshot; False if an equal or newer version is already installed."""
        self._between(now)
        if not self._instances.observe(snapshot, now):
            return False
        inst = self._instances.get(snapshot.instance)
        self._cost.prime(inst, self._instances)  # off the placement path
        return True

    def heartbeat(self, instance: str, now: float, healthy: bool = True) -> bool:
        """A heartbeat carrying the instance's health-check result; False if unknown."""
        self._between(now)
        return self._instances.heartbeat(instance, now, healthy)

    def _between(self, now: float) -> None:
        """Work a telemetry event does for the placements that follow: free a step of the
        decisions the log dropped and of the window events that left (`DemandTracker.free`),
        and trim a step of the placed work that left its windows (`PlacedWork.advance`: exact
        whenever done, and a burst's windows all leave together; a placement that trimmed them
        all took 25-50 ms at 1,000 boxes)."""
        del self._dropped[:FREE_DECISIONS]
        self._cost.placed.advance(now, BUSY_TRIM_STEP)
        self._demand.free()
        self._cost.placed.free()

    def remove_instance(self, instance: str, now: float) -> list[Lease]:
        """Forget an instance (supervisor removed it); its leases go, its calls leave flight."""
        self._instances.remove(instance)
        return self._leases.drop_instance(instance)

    def close_instance(self, instance: str, drain: bool) -> list[Lease]:
        """Place no new calls on `instance`. Cordon (drain=False) keeps serving its leases; drain
        also drops them and installs no new ones. Returns the leases dropped."""
        self._instances.set_closed(instance, True)
        if not drain:
            self._drained.discard(instance)
            return []
        self._drained.add(instance)
        return self._leases.drop_instance(instance)

    def reopen_instance(self, instance: str) -> None:
        """Undo cordon or drain."""
        self._instances.set_closed(instance, False)
        self._drained.discard(instance)

    def closed_instances(self) -> frozenset[str]:
        """Instances closed to new placement (cordoned or drained)."""
        return frozenset(self._instances.closed)

    def drained_instances(self) -> frozenset[str]:
        """The closed instances whose leases were dropped (drain, not cordon)."""
        return frozenset(self._drained)

    def revoke(self, session_id: str, model: str | None = None) -> list[Lease]:
        """Drop the session's lease for `model` (None: every model); returns those dropped."""
        # by key, not a scan of the book: an evicted branch's session is forgotten in a pick,
        # and a scan of a burst's 100k leases took it 20 ms
        models = list(self._leases.by_model) if model is None else [model]
        return [le for m in models if (le := self._leases.take((session_id, m))) is not None]

    def forget_session(self, session_id: str) -> tuple[bool, list[Lease]]:
        """Drop the session's row, KV records and leases; (was it known, leases dropped)."""
        dropped = self.revoke(session_id)
        return self._sessions.forget(session_id) or bool(dropped), dropped

    def round_summary(
        self, instance: str, model: str, measured: RoundMeasurement, now: float
    ) -> LatencyProfile:
        """Fold an instance's round measurements for `model` into the profile EWMA."""
        return self._profiles.refresh(model, measured)

    def set_profile(self, model: str, profile: LatencyProfile) -> bool:
        """Take `model`'s profile as another router refined it (a box's, for the pool's picker,
        which sees no rounds); False when it is unchanged, so cached cost rows stay valid."""
        return self._profiles.put(model, profile)

    # --- calls -------------------------------------------------------------------------------
    def place(self, call: CallRequest, now: float) -> Decision:
        """Algorithm 1 (or the configured baseline) for one arriving or held call."""
        self._leases.expire(call.judged_at(now), PLACE_EXPIRY_STEP)
        if call.call_id not in self._queued:
            suffix = call.prompt_tokens - call.prefix_tokens
            self._demand.record(call.model, now, self._profiles.get(call.model).prefill_s(suffix))
        choice = self._policy.choose(call, self._view, now)
        if choice.instance is not None:
            decision = self._forward(call, choice, choice.kind, now)
        else:
            decision = self._overload(call, choice, now)
        self.record(decision)
        return decision

    def forwarded(self, call_id: str, instance: str, now: float) -> bool:
        """The shell sent `call_id` to `instance` at `now`; False if the call or instance is
        unknown. Re-stamps the overlay record, or moves it if the shell chose another instance."""
        rec = self._instances.inflight(call_id)
        inst = self._instances.get(instance)
        if rec is None or inst is None:
            return False
        self._instances.pop_inflight(call_id)
        plan = self._cost.plan(rec.call)
        return self._instances.add_inflight(self._cost.inflight(plan, inst, None, now))

    def completed(
        self,
        call_id: str,
        instance: str,
        kv_state: KVState,
        kv_len: int,
        now: float,
        prefix_handle: str | None = None,
    ) -> Lease | None:
        """The call finished on `instance`, leaving its prefix in `kv_state`. Updates the session
        table, releases the overlay, and installs the successor lease (None when none is)."""
        self._queued.pop(call_id, None)
        rec = self._instances.pop_inflight(call_id)
        if rec is None:
            return None
        call = rec.call
        self._policy.on_completed(call, instance, kv_state, kv_len, now)
        if call.session_id is None:
            return None
        self._sessions.completed(call.session_id, call.model, instance, kv_state, kv_len, now)
        if not self._lease_allowed(instance, kv_state):
            return None
        handle = prefix_handle or f"{call.session_id}/{call.model}@{instance}:{kv_len}"
        lease = Lease(
            call.session_id,
            call.model,
            instance,
            handle,
            kv_len,
            now,
            now + self.knobs.tau_s,
            self._return_work_s(call, kv_state, kv_len),
        )
        self._leases.install(lease)
        return lease

    def _return_work_s(self, call: CallRequest, kv_state: KVState, kv_len: int) -> float:
        """What a lease holds for the session's return: the prefill of a suffix as long as this
        call's, plus the restore of its prefix if it lives on the host, at most
        `admission_unit_s`."""
        prof = self._profiles.get(call.model)
        work = prof.prefill_s(max(call.prompt_tokens - call.prefix_tokens, 0))
        if kv_state is KVState.HOST:
            work += prof.restore_s(kv_len)
        return min(work, self.knobs.admission_unit_s)

    def failed(self, call_id: str, now: float) -> bool:
        """The call failed or was abandoned: release its overlay and queue place, no lease."""
        held = self._queued.pop(call_id, None) is not None
        return self._instances.pop_inflight(call_id) is not None or held

    def expire(self, now: float, limit: int | None = None) -> ExpiryReport:
        """Drop expired leases, held calls past `queue_timeout_s`, and long-idle session rows:
        at most `limit` leases and `limit` rows (the report says whether more are due)."""
        del self._dropped[:FREE_DECISIONS]
        leases = self._leases.expire(now, limit)
        timed_out = []
        while self._queued:
            call_id, since = next(iter(self._queued.items()))
            if now - since < self.knobs.queue_timeout_s:
                break
            self._queued.popitem(last=False)
            timed_out.append(call_id)
        idle_before = now - self.knobs.session_idle_s
        self._sessions.forget_idle(idle_before, limit)
        pending = limit is not None and (
            # the demand window's departed work too, ahead of the placement that reads it
            self._demand.trim_due(now, limit)
            or self._leases.due(now)
            or self._sessions.idle(idle_before)
        )
        return ExpiryReport(tuple(leases), tuple(timed_out), pending)

    # --- read-only views ---------------------------------------------------------------------
    def sessions(self) -> tuple[SessionEntry, ...]:
        return self._sessions.entries(self._leases)

    def leases(self) -> tuple[Lease, ...]:
        return self._leases.all()

    def lease(self, session_id: str, model: str) -> Lease | None:
        """The lease installed for (session, model), live or not yet expired away."""
        return self._leases.get((session_id, model))

    def explain(self, call_id: str) -> Decision | None:
        """The latest decision for `call_id`, with its kind and per-candidate breakdown."""
        return self._decisions.get(call_id)

    def recent(self, limit: int) -> tuple[Decision, ...]:
        """The latest `limit` decisions, newest first."""
        return tuple(reversed(list(self._decisions.values())[-limit:])) if limit > 0 else ()

    def held_prefix(self, session_id: str, model: str) -> int:
        """The longest prefix of (session, model) that any instance's snapshot holds, in tokens
        (0: none does): what a shell that has not seen the session's calls (a restarted picker)
        can still count on reusing."""
        key = (session_id, model)
        lens = []
        for name in self._instances.holders(key):
            snap = self._instances.get(name).snapshot
            loc = snap.sessions.get(key) if snap is not None else None
            if loc is not None:
                lens.append(loc.kv_len)
        return max(lens, default=0)

    def held_sessions(self, instance: str) -> set[str]:
        """The sessions whose prefix `instance`'s installed snapshot says it holds."""
        inst = self._instances.get(instance)
        return (
            set()
            if inst is None or inst.snapshot is None
            else {s for s, _ in inst.snapshot.sessions}
        )

    def installed(self) -> list[tuple[InstanceSnapshot, float]]:
        """Each instance's installed snapshot, in the order the instances were first seen, with
        when it last held: the latest health report while that one is good (an instance heard
        from with no new snapshot says nothing changed), else its taking."""
        return [
            (i.snapshot, max(i.taken_at, i.last_seen) if i.health_ok else i.taken_at)
            for i in self._instances.all()
            if i.snapshot is not None
        ]

    def profiles(self) -> dict[str, LatencyProfile]:
        return self._profiles.all()

    @property
    def profiles_epoch(self) -> int:
        """Grows whenever a profile changes (a reader can tell its copy is current)."""
        return self._profiles.epoch

    def in_flight(self) -> dict[str, str]:
        """Call id -> instance for every call forwarded and not yet completed or failed."""
        return {cid: i.name for i in self._instances.all() for cid in i.inflight}

    def instances(self, now: float) -> tuple[InstanceStatus, ...]:
        """Every known instance with its health, freshness, load and lease charge at `now`."""
        return tuple(
            InstanceStatus(
                i.name,
                i.snapshot.version,
                i.snapshot.pool,
                i.healthy(),
                i.fresh(now, self.knobs),
                len(i.inflight),
                self._leases.count(i.name),
                i.ov_work_s,
                self.retired(i.name, now),
            )
            for i in self._instances.all()
        )

    def placeable(self, instance: str, model: str, now: float) -> bool:
        """`instance` is healthy, fresh and open to `model` at `now`."""
        inst = self._instances.get(instance)
        return inst is not None and inst.placeable(model, now, self.knobs)

    def retired(self, instance: str, now: float) -> tuple[str, ...]:
        """Resident models the retirement rule takes out of `instance`'s rotation at `now`."""
        inst = self._instances.get(instance)
        return () if inst is None or inst.snapshot is None else self._cost.retired_models(inst, now)

    def held(self) -> tuple[str, ...]:
        """Calls held at the gateway by the "queue" overload policy, oldest first."""
        return tuple(self._queued)

    def check_integrity(self) -> None:
        self._leases.check_integrity()
        self._instances.check_integrity()
        self._cost.check_integrity(self._instances)
        if len(self._queued) > self.knobs.queue_limit:
            raise AssertionError("gateway queue over its limit")

    # --- internals ---------------------------------------------------------------------------
    def _forward(
        self, call: CallRequest, choice: Choice, kind: DecisionKind, now: float
    ) -> Decision:
        inst = self._instances.get(choice.instance)  # type: ignore[arg-type]
        cand = choice.best
        if cand is not None and cand.instance != choice.instance:
            cand = None  # `inflight` scores the instance (reading candidates would render them all)
        plan = self._cost.plan(call) if choice.plan is None else choice.plan
        self._instances.add_inflight(self._cost.inflight(plan, inst, cand, now))
        self._cost.record_placed(plan, inst.name, now)  # keeps the model in its rotation there
        self._queued.pop(call.call_id, None)
        self._policy.on_placed(call, inst.name, now)
        return Decision(
            call.call_id,
            kind,
            inst.name,
            self.policy,
            now,
            choice.reason,
            None,
            choice.candidates,
            call.session_id,
        )

    def _overload(self, call: CallRequest, choice: Choice, now: float) -> Decision:
        mode = self.knobs.overload
        if mode == "spill" and choice.spill is not None:
            spilled = Choice(
                choice.spill,
                choice.kind,
                choice.candidates,
                choice.reason + "; spill ignoring feasibility",
                plan=choice.plan,
            )
            return self._forward(call, spilled, DecisionKind.OVERLOAD_SPILL, now)
        retry = self._retry_after(call.model)
        if mode == "queue":
            since = self._queued.get(call.call_id)
            if since is None and len(self._queued) < self.knobs.queue_limit:
                self._queued[call.call_id] = since = now
            if since is not None and now - since < self.knobs.queue_timeout_s:
                wait = min(retry, self.knobs.queue_timeout_s - (now - since))
                return self._refuse(call, choice, DecisionKind.OVERLOAD_QUEUE, now, wait, "held")
            self._queued.pop(call.call_id, None)
            why = "queue full" if since is None else "queue timeout"
            return self._refuse(call, choice, DecisionKind.OVERLOAD_REJECT, now, retry, why)
        return self._refuse(call, choice, DecisionKind.OVERLOAD_REJECT, now, retry, "rejected")

    def _refuse(
        self,
        call: CallRequest,
        choice: Choice,
        kind: DecisionKind,
        now: float,
        retry: float,
        why: str,
    ) -> Decision:
        return Decision(
            call.call_id,
            kind,
            None,
            self.policy,
            now,
            f"{choice.reason}; {why}",
            max(retry, MIN_RETRY_S),
            choice.candidates,
            call.session_id,
        )

    def _retry_after(self, model: str) -> float:
        """Earliest relief: the soonest round end among healthy instances that allow `model`."""
        ends = [
            i.snapshot.round_remaining_s
            for i in self._instances.all()
            if i.healthy() and model in i.snapshot.allowed_models
        ]
        return min(ends) if ends else self.knobs.heartbeat_s

    def _lease_allowed(self, instance: str, kv_state: KVState) -> bool:
        return (
            self._policy.installs_leases
            and self.knobs.leases_enabled
            and kv_state is not KVState.MISSING
            and instance in self._instances
            and instance not in self._drained
        )

    def record(self, decision: Decision) -> None:
        """Keep `decision` for `explain` (a box-level peer's, decided beside the router, too)."""
        self._decisions[decision.call_id] = decision
        self._decisions.move_to_end(decision.call_id)
        if len(self._decisions) > DECISION_LOG:
            dropped = self._dropped
            if len(dropped) >= DECISION_LOG:
                del dropped[:FREE_DECISIONS]  # no snapshot for that long: freed here
            dropped.append(self._decisions.popitem(last=False)[1])
