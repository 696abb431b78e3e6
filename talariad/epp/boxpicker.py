"""The pool's placement: one `Router` whose placement targets are boxes (`router.boxes`), fed by
the boxes' snapshots (`epp.poller`), asked once per call that Envoy hands over (`epp.contract`).

A call's body is read with the dialect parsers the box's gateway reads it with (`calls.routes`;
a conversation's resent messages once, `calls.reading`),
its session with the same rules and its branch with the same `PrefixBranches`, so the picker and
the box agree on what a call is; the box's router then places it on an instance. Design:
docs/pool.md.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass
from itertools import count

from talariad.calls import routes
from talariad.calls.branches import PrefixBranches, Prompt
from talariad.calls.errors import APIError
from talariad.calls.placement import Placement, refusal
from talariad.calls.reading import BodyReader
from talariad.calls.session import header_session
from talariad.calls.spec import CallSpec, bare_call_id
from talariad.config import resolve_model
from talariad.gc_tuning import PacedCollector
from talariad.router import CallRequest, Decision, DecisionKind, InstanceSnapshot, Router
from talariad.router.box_policies import BOX_POLICIES, BoxStats
from talariad.router.router import DECISION_LOG
from talariad.router.search.lazy import weighed
from talariad.types import KVLocation, KVState
from talariad.wire.box import BoxModel, BoxSnapshot

from .config import BOX_MAX_CONNECTIONS, CONVERSATION_BYTES, box_call_capacity
from .contract import EPPRequest, ImmediateAnswer, Pick
from .replies import answer

MAX_OPEN_CALLS = 100_000  # picked calls whose end was never reported are failed past this
HEADER_CALL_MAX_S = 330.0
"""A call placed at its request headers whose end no access-log entry reported (the feed is lossy
by design) is failed this long after it was placed: the gateway's route timeout (300 s) and slack,
past which Envoy has ended it anyway."""
MAX_BRANCHES_NOTED = 8  # a session's branches remembered for placing its returns at headers
_RATE_WINDOW_S = 10.0
_RATE_GRAIN_S = 0.1
"""Decisions are counted per tenth of a second: a burst's 100k decisions left the rate's window
one by one in one pick (10 ms)."""
_RESOLVED_MAX = 1024


@dataclass(slots=True)
class _Held:
    """What the picker installed of a box: its session view (the mapping the router holds), the
    `sessions_epoch` that names it (None: the box sends no changes), the target's basis, when
    the installed target was taken (the picker's clock), the target itself and the `etag` of
    the snapshot it came in (None: the box sends none)."""

    epoch: int | None
    sessions: dict[tuple[str, str], KVLocation]
    basis: list[tuple[str, int]]
    taken: float
    target: InstanceSnapshot
    etag: str | None


@dataclass(slots=True)
class _Open:
    """A picked call until its response ends: where it went and what its lease will hold."""

    box: str
    endpoint: str
    kv_len: int
    branch: tuple[str, str] | None  # (session branch, model): what its lease is for
    status: int = 0


@dataclass(slots=True)
class _Noted:
    """A branch's last placed call, what a return to it at request headers is judged by: its
    body's length (a return resends the conversation, so its body is no shorter) and the router's
    estimate of its prompt."""

    body_bytes: int
    prompt_tokens: int
    max_tokens: int


class BoxPicker:
    """`Picker` over boxes. `pick` runs on the server's event loop: sync, no IO, bounded.

    `place` is the part after the body is read, the same for the running picker and the
    simulator's pool (one picker, two clocks); `policy` names the box-level policy
    (`router.box_policies.BOX_POLICIES`)."""

    ARRIVAL_GRACE_S = 1.0
    """How long past its expiry a lease stays in the book for a call that arrived in time and is
    still being read (a lease is judged at the call's arrival, `CallRequest.arrived_at`)."""

    def __init__(
        self,
        router: Router,
        max_branches: int = 4,
        policy: str = "talaria",
        box_max_connections: int = BOX_MAX_CONNECTIONS,
        conversation_bytes: int = CONVERSATION_BYTES,
    ) -> None:
        """`box_max_connections`: a box's connection limit when its snapshot does not say;
        `conversation_bytes`: each of the branch text and kept bodies at most
        (`EPPConfig.conversation_bytes`)."""
        self.router = router
        self.box_max_connections = box_max_connections
        self._capacity: dict[str, int] = {}  # box -> calls it takes at once (its snapshot's)
        self._load: Counter[str] = Counter()  # box -> calls picked for it and not ended
        self.policy = BOX_POLICIES.get(policy)(router, random.Random(router.knobs.seed))
        self.branches = PrefixBranches(
            max_branches, router.knobs.max_sessions, max_bytes=conversation_bytes
        )
        # a conversation's resent messages are read once
        self.reader = BodyReader(max_bytes=conversation_bytes)
        self.placement = Placement(
            router, self.branches, self.policy, self.ARRIVAL_GRACE_S, holds_kv=False
        )
        self.endpoints: dict[str, str] = {}  # box -> "ip:port"
        self._boxes_at: dict[str, str] = {}  # "ip:port" -> box
        self._models: dict[str, list[BoxModel]] = {}  # box -> its models
        self._resolved: dict[str, BoxModel | None] = {}  # requested name -> model (a cache)
        self._versions: dict[str, int] = {}
        self._seen_at: dict[str, float] = {}
        self._held: dict[str, _Held] = {}
        self._open: OrderedDict[str, _Open] = OrderedDict()
        self._branch_open: dict[tuple[str, str], str] = {}  # a branch's open call
        self._box_calls: OrderedDict[str, str] = OrderedDict()  # box's call id -> ours
        self._rr = count()
        self._fallback_rr = count()
        self._decided: deque[list[int]] = deque()  # [grain, decisions in it], oldest first
        self._decided_n = 0  # their sum
        # the sessions the headers name -> their branches' last calls (returns at headers)
        self._noted: OrderedDict[str, dict[tuple[str, str], _Noted]] = OrderedDict()
        self._at_headers: deque[tuple[float, str]] = deque()  # (placed at, call id), in order
        self._pool_models: frozenset[str] | None = None  # every model some box serves (a cache)
        # `talariad epp`'s collector, paced by installs and picks (`gc_tuning.PacedCollector`)
        self.collector: PacedCollector | None = None
        self._names: list[str] | None = None  # the boxes' names, in `endpoints` order (a cache)

    # --- boxes (the poller's `BoxFeed`) -----------------------------------------------------
    def box_seen(self, name: str, endpoint: str, snap: BoxSnapshot, now: float) -> bool:
        """A box answered: install its target as it comes (our own version: a box restart resets
        its own; taken its age before `now`), its session changes merged into the view held, and
        the profiles it refined (the picker sees no rounds). False, and nothing installed, when
        the sessions are changes to a view not held, or the models are those held and none are:
        the view is dropped, ask for it whole."""
        target, held = snap.target, self._held.get(name)
        base = target.sessions_base
        if base is not None and (held is None or held.epoch != base):
            self._held.pop(name, None)
            return False
        if snap.models is None and name not in self._models:  # "as before", and none held
            self._held.pop(name, None)
            return False
        self._set_endpoint(name, endpoint)
        if snap.models is not None:  # None: a stream's frame, its models those of the one before
            self._set_models(name, snap.models)
        if snap.max_connections is not None:
            self._capacity[name] = box_call_capacity(snap.max_connections)
        self._seen_at[name] = now
        taken = now - target.age_s
        if held is not None and base is not None:
            sessions, changed = held.sessions, frozenset(target.merge_into(held.sessions))
            # an idle box re-sends the target installed; installed again before it goes stale
            # (the router's freshness is its taking), else it would take no new call
            renew = taken - held.taken >= self.router.knobs.staleness_s / 2
            install = bool(changed) or held.basis != target.basis or renew
        else:  # whole: a new mapping, the router diffs it
            sessions, changed, install = {}, None, True
            target.merge_into(sessions)
        if install:
            self._versions[name] = version = self._versions.get(name, 0) + 1
            box = target.placement_target(name, version, taken, sessions, changed)
            self.placement.observe(box, now)
            stats = BoxStats(name, target.healthy, target.queue, target.kv_util, target.instances)
            self.policy.observe(stats, now)
        else:  # the box re-sent the target installed (the daemon polls its instances less often
            # than we poll it) and no session changed: the installed target stands
            taken, box = held.taken, held.target  # type: ignore[union-attr]
        self._held[name] = _Held(snap.sessions_epoch, sessions, target.basis, taken, box, snap.etag)
        self._answered(name, box.healthy, now)
        return True

    def box_same(self, name: str, age_s: float, now: float) -> bool:
        """A box answered that its snapshot still says what the one held does (`304`: the
        `etag` matched) but its age: it is fresh; the target installed stands, installed again,
        taken `age_s` before `now`, before it goes stale (as `box_seen` renews an idle box's;
        sooner: an unchanged box answers only every `poll_hold_s` and `poll_interval_s`, at most
        half the staleness bound, and its instances' age varies by their telemetry period).
        False, and nothing done, when no target is held (ask for the snapshot whole)."""
        held = self._held.get(name)
        if held is None:
            return False
        self._seen_at[name] = now
        taken = now - age_s
        if taken - held.taken >= self.router.knobs.staleness_s / 4:
            self._versions[name] = version = self._versions.get(name, 0) + 1
            # the same target and view, taken later: no session changed
            box = dataclasses.replace(
                held.target, version=version, taken_at=taken, sessions_changed=frozenset()
            )
            self.placement.observe(box, now)
            held.taken, held.target = taken, box
        self._answered(name, held.target.healthy, now)
        return True

    def _answered(self, name: str, healthy: bool, now: float) -> None:
        """What any answer of a box does: its health heard, what expired by now let go."""
        self.router.heartbeat(name, now, healthy=healthy)
        self.placement.expire(now)
        if self.collector is not None:
            self.collector.tick()
        self._expire_at_headers(now)

    def since(self, name: str) -> int | None:
        """The token to poll `name` with (`?since=`): the epoch of its session view held; None:
        ask for the view whole."""
        held = self._held.get(name)
        return None if held is None else held.epoch

    def etag(self, name: str) -> str | None:
        """The `etag` to poll `name` with (`If-None-Match`): its snapshot's held, None: none."""
        held = self._held.get(name)
        return None if held is None else held.etag

    def _set_models(self, name: str, models: list[BoxModel]) -> None:
        """The box's models, and a profile only when this box refined it anew: boxes refine
        their own, and taking every box's on every poll would swap them back and forth, voiding
        cached cost rows."""
        if self._models.get(name) == models:
            return
        if _names(self._models.get(name, [])) != _names(models):
            self._resolved.clear()
            self._pool_models = None
        before = {m.name: m.profile for m in self._models.get(name, [])}
        for m in models:
            if before.get(m.name) != m.profile:
                self.router.set_profile(m.name, m.profile)
        self._models[name] = models

    def box_lost(self, name: str, now: float) -> None:
        """The box stopped answering: no new call and no lease return goes there."""
        self.router.heartbeat(name, now, healthy=False)

    def box_gone(self, name: str, now: float) -> None:
        """Discovery dropped the box: forget it and its leases."""
        self.router.remove_instance(name, now)
        self._boxes_at.pop(self.endpoints.pop(name, ""), None)
        self._names = None
        self._models.pop(name, None)
        self._resolved.clear()
        self._pool_models = None
        self._seen_at.pop(name, None)
        self._held.pop(name, None)
        self._capacity.pop(name, None)

    def _set_endpoint(self, name: str, endpoint: str) -> None:
        old = self.endpoints.get(name)
        if old != endpoint:
            self._boxes_at.pop(old or "", None)
            self.endpoints[name], self._boxes_at[endpoint] = endpoint, name
            self._names = None

    # --- calls (the `Picker` protocol) ------------------------------------------------------
    def pick(self, request: EPPRequest, now: float) -> Pick | ImmediateAnswer:
        """A call path's body picks a box by placement; any other request any healthy box."""
        try:
            planned = self.plan(request)
        except APIError as err:
            return answer(request.path, err)
        if planned is None:  # an unknown model is the box's to answer (404)
            return self._any_box(request, now)
        call, requested = planned
        decision = self.place(call, request.path, requested, now)
        if isinstance(decision, Pick) and call.session_id is not None:
            self._note(request, call)
        if self.collector is not None:
            self.collector.count()
        return decision

    # --- lease returns at request headers (docs/pool.md, "Lease returns at headers") ------------
    def lease_return(self, request: EPPRequest, now: float) -> Pick | None:
        """A call placed from its request headers alone, as its session's lease return, when that
        is unambiguous (`_returning`); None: decide on the body. The call is in flight on its box
        from now on and ends by `logged` (Envoy's access log), as a body-placed call ends by
        `finished`."""
        self._expire_at_headers(now)
        found = self._returning(request, now)
        if found is None:
            return None
        key, noted, lease = found
        declared = int(request.headers["content-length"])
        # the prompt grows as the body does (a return resends its conversation, and more)
        tokens = max(noted.prompt_tokens * declared // max(noted.body_bytes, 1), lease.kv_len)
        call = CallRequest(
            request.call_id,
            key[0],
            key[1],
            tokens,
            min(lease.kv_len, tokens),
            noted.max_tokens,
            request.arrived,
        )
        decision = self.placement.place(call, now)
        if (
            decision.kind is not DecisionKind.LEASE_HIT
            or decision.instance is None
            or self.full(decision.instance)
        ):
            # the router judged the lease otherwise (its prefix gone), or its box is at its
            # connection limit: undone (its in-flight record or its place in the router's
            # queue), and the body decides (another box with room, or 429 pool_full)
            self.placement.failed(call.call_id, now)
            return None
        self._count(now)
        endpoint = self.endpoints[decision.instance]
        self._remember(call.call_id, _Open(decision.instance, endpoint, tokens, key))
        self._at_headers.append((now, call.call_id))
        noted.body_bytes, noted.prompt_tokens = declared, tokens
        return Pick(
            call.call_id, endpoint, decision.kind.value, self._fallback(decision, key[1], now)
        )

    def _returning(self, request: EPPRequest, now: float):
        """(branch key, its last call, its lease) when the headers name a session whose one live
        branch (a live lease or a call in flight, over every model) holds a live lease on a box
        that serves every model of the pool, with no call of it in flight, and the body is no
        shorter than that branch's last; else None."""
        if request.method != "POST" or request.path.split("?", 1)[0] not in routes.ROUTES:
            return None
        declared = request.headers.get("content-length", "")
        session = header_session(request.headers)
        if not declared.isdigit() or session is None or self.policy.name != "talaria":
            return None
        branches = self._noted.get(session)
        if not branches:
            return None
        at = now if request.arrived is None else min(request.arrived, now)
        live = []
        for key, noted in branches.items():
            lease = self.router.lease(*key)
            if key in self._branch_open or (lease is not None and lease.live(at)):
                live.append((key, noted, lease))
        if len(live) != 1:
            return None
        key, noted, lease = live[0]
        if key in self._branch_open or lease is None or int(declared) < noted.body_bytes:
            return None
        box = lease.instance
        if box not in self.endpoints or not self.router.placeable(box, key[1], now):
            return None
        if not self.pool_models() <= {m.name for m in self._models.get(box, ())}:
            return None
        return key, noted, lease

    def pool_models(self) -> frozenset[str]:
        """Every model some box serves."""
        if self._pool_models is None:
            self._pool_models = frozenset(m.name for ms in self._models.values() for m in ms)
        return self._pool_models

    def _note(self, request: EPPRequest, call: CallRequest) -> None:
        """Remember a placed call's branch under the session its headers name (if they do)."""
        session = header_session(request.headers)
        if session is None:
            return
        branches = self._noted.get(session)
        if branches is None:
            branches = self._noted[session] = {}
        self._noted.move_to_end(session)
        key = (call.session_id, call.model)
        branches.pop(key, None)  # most recent last
        branches[key] = _Noted(len(request.body), call.prompt_tokens, call.max_tokens)
        while len(branches) > MAX_BRANCHES_NOTED:
            del branches[next(iter(branches))]
        while len(self._noted) > self.router.knobs.max_sessions:
            self._noted.popitem(last=False)

    def logged(self, call_id: str, endpoint: str | None, status: int, ok: bool, now: float) -> None:
        """Envoy's access-log entry for a call placed at its headers: the box that served it, its
        status and whether its response ended well; settles it as `served` and `finished` do."""
        if call_id not in self._open:
            return  # another replica's call, or settled already (its branch's next call)
        self.served(call_id, endpoint, status, now)
        self.finished(call_id, ok, now)

    def _expire_at_headers(self, now: float) -> None:
        """Fail the calls placed at headers that no access-log entry settled in time."""
        while self._at_headers and self._at_headers[0][0] < now - HEADER_CALL_MAX_S:
            _, call_id = self._at_headers.popleft()
            if call_id in self._open:
                self.finished(call_id, False, now)

    def plan(self, request: EPPRequest) -> tuple[CallRequest, str] | None:
        """A call's body as the router's request, and the model id the client sent; None for
        any other request (a probe, a model list, a model no box serves). Raises the API's 400
        for a body its dialect refuses."""
        read = (
            self.reader.read(request.path, request.body, header_session(request.headers))
            if request.method == "POST"
            else None
        )
        model = self._resolve(read[0].requested) if read is not None else None
        if read is None or model is None:
            return None
        spec, prompt = read
        return self._call(request, spec, prompt, model), spec.requested

    def place(
        self, call: CallRequest, path: str, requested: str, now: float
    ) -> Pick | ImmediateAnswer:
        """Place one planned call (its session branch named, its prefix counted); `requested`:
        the model id the client sent, for a refusal's wording."""
        branch = None if call.session_id is None else (call.session_id, call.model)
        if branch is not None:
            self._settle_answered(branch, call.judged_at(now))
        decision = self.placement.place(call, now)
        self._count(now)
        if decision.instance is None:
            return self._refuse(path, requested, decision, now)
        if self.full(decision.instance):
            moved = self._off_full_box(decision, call.model, now)
            if moved is None:
                self.placement.failed(call.call_id, now)
                return answer(path, self._pool_full())
            decision = moved
        endpoint = self.endpoints[decision.instance]
        # the lease will say the box holds the prompt (the answer's length is not seen here)
        self._remember(call.call_id, _Open(decision.instance, endpoint, call.prompt_tokens, branch))
        fallback = self._fallback(decision, call.model, now)
        return Pick(call.call_id, endpoint, decision.kind.value, fallback)

    def capacity(self, box: str) -> int:
        """Calls `box` takes at once: its connection limit (its snapshot's, else the configured
        one) less those kept for what is not a call."""
        return self._capacity.get(box) or box_call_capacity(self.box_max_connections)

    def full(self, box: str) -> bool:
        """This picker has as many calls open on `box` as it takes: it gets no more (one more
        would be closed at its accept, or wait in the gateway for a connection)."""
        return self._load[box] >= self.capacity(box)

    def _off_full_box(self, d: Decision, model: str, now: float) -> Decision | None:
        """The placement moved off its full box to the next-best one that takes calls (as a
        fallback is chosen), recorded for explain; None when every box is full."""
        endpoint = self._fallback(d, model, now)
        box = None if endpoint is None else self._boxes_at.get(endpoint)
        if box is None or not self.router.forwarded(d.call_id, box, now):
            return None
        moved = d._replace(instance=box, reason=f"{d.reason}; {d.instance} at its connection limit")
        self.router.record(moved)
        return moved

    def _pool_full(self) -> APIError:
        total = sum(self.capacity(b) for b in self.endpoints)
        return APIError(
            429,
            f"every box of the pool is at its connection limit ({total} calls at once); "
            "try again shortly",
            type="rate_limit_exceeded",
            code="pool_full",
            headers={"Retry-After": "1"},
        )

    def _fallback(self, d: Decision, model: str, now: float) -> str | None:
        """The endpoint of the next-best box for a placed call, where Envoy retries it if it
        never reached its pick: the cheapest other feasible candidate the router weighed (scored:
        reading the ones its ranking skipped would score them all), else
        the next other box open to the model (a lease or a session's home weighs only itself).
        One more candidate, not a second placement: its lease and load follow where it is served
        (`served`)."""
        others = (c for c in weighed(d.candidates) if c.feasible and c.instance != d.instance)
        for c in sorted(others, key=lambda c: c.rank_s):
            if self._open_to(c.instance, model, now):
                return self.endpoints[c.instance]
        if self._names is None:  # not a list a pick: 1,000 boxes make it 30 µs of a lease return
            self._names = list(self.endpoints)
        names, start = self._names, next(self._fallback_rr)
        for i in range(len(names)):
            name = names[(start + i) % len(names)]
            if name != d.instance and self._open_to(name, model, now):
                return self.endpoints[name]
        return None

    def _open_to(self, box: str, model: str, now: float) -> bool:
        return (
            box in self.endpoints and not self.full(box) and self.router.placeable(box, model, now)
        )

    def _settle_answered(self, branch: tuple[str, str], now: float) -> None:
        """A branch's next call means its previous answer ended: settle that call now, unless its
        box answered an error. Why: Envoy reports the response's end to the EPP a few ms after
        the client has it (its headers too, under load), and an agent's next call can arrive
        first, before the lease it should hit."""
        prev = self._branch_open.get(branch)
        rec = None if prev is None else self._open.get(prev)
        if rec is not None and rec.status < 400:
            self.finished(prev, True, now)  # type: ignore[arg-type]

    def _call(
        self, request: EPPRequest, spec: CallSpec, prompt: Prompt, model: BoxModel
    ) -> CallRequest:
        """The router's request, planned as the box's gateway plans it (`spec.plan_call`); the
        box's config may also clamp an Anthropic client's output limit, which the picker does not
        see, so it clamps only where the client set none."""
        clamp_to = model.max_context if not spec.max_tokens else None
        max_tokens = spec.max_tokens or model.default_max_tokens
        _, _, call = self.placement.plan(
            request.call_id,
            spec,
            prompt,
            request.headers,
            model.name,
            max_tokens,
            clamp_to,
            request.arrived,
        )
        return call

    def _refuse(self, path: str, requested: str, d: Decision, now: float) -> ImmediateAnswer:
        """429 with `retry-after` when boxes are busy (the picker cannot hold a call: a held
        one leaves the router's queue at once) or their snapshots are late (a picker starved by
        a burst polls late: the boxes are not down, and the call is worth sending again), 503
        when no box is healthy."""
        if d.kind is DecisionKind.OVERLOAD_QUEUE:
            self.placement.failed(d.call_id, now)
        if not self.healthy_boxes(now):
            late = any(
                s.healthy and s.instance in self.endpoints for s in self.router.instances(now)
            )
            return answer(path, _boxes_late() if late else _no_box())
        return answer(path, refusal(d, requested, "box"))

    def _any_box(self, request: EPPRequest, now: float) -> Pick | ImmediateAnswer:
        """Round robin over the healthy boxes (model lists, probes, unknown models)."""
        boxes = self.healthy_boxes(now)
        if not boxes:
            return answer(request.path, _no_box())
        box = boxes[next(self._rr) % len(boxes)]
        return Pick(request.call_id, self.endpoints[box], "round_robin")

    def served(
        self,
        call_id: str,
        endpoint: str | None,
        status: int,
        now: float,
        box_call_id: str | None = None,
    ) -> None:
        """Envoy's response headers: re-target the call if Envoy served it elsewhere; the box's
        own id for the call (its `CALL_ID_HEADER`, inside the response id the client sees) is
        kept for `explain`, as long as its decision is."""
        if box_call_id and box_call_id != call_id:
            self._box_calls[box_call_id] = call_id
            while len(self._box_calls) > DECISION_LOG:
                self._box_calls.popitem(last=False)
        rec = self._open.get(call_id)
        if rec is None:
            return
        rec.status = status
        box = self._boxes_at.get(endpoint or "")
        if box is not None and box != rec.box and self.router.forwarded(call_id, box, now):
            self._load[rec.box] -= 1
            self._load[box] += 1
            rec.box, rec.endpoint = box, endpoint or rec.endpoint

    def finished(self, call_id: str, ok: bool, now: float) -> None:
        """The response ended: a success installs the session's lease on the box that served
        it (its KV taken as on a device there; the box's next snapshot says where it is)."""
        rec = self._open.pop(call_id, None)
        if rec is None:
            return
        self._load[rec.box] -= 1
        if rec.branch is not None and self._branch_open.get(rec.branch) == call_id:
            del self._branch_open[rec.branch]
        if ok and rec.status < 400:
            self.placement.completed(call_id, rec.box, KVState.DEVICE, rec.kv_len, now)
        else:
            self.placement.failed(call_id, now)

    def _remember(self, call_id: str, rec: _Open) -> None:
        self._open[call_id] = rec
        self._load[rec.box] += 1
        if rec.branch is not None:
            self._branch_open[rec.branch] = call_id
        while len(self._open) > MAX_OPEN_CALLS:  # the server lost their ends: release them
            old, lost = self._open.popitem(last=False)
            self._load[lost.box] -= 1
            if lost.branch is not None and self._branch_open.get(lost.branch) == old:
                del self._branch_open[lost.branch]
            self.placement.failed(old, 0.0)  # `failed` reads no clock

    # --- reads ------------------------------------------------------------------------------
    def explain(self, call_id: str) -> Decision | None:
        """The router's latest decision for the call, with every box it weighed: `call_id` is
        the id Envoy gave the call (`x-request-id`) or the response id the client saw
        (`chatcmpl-…`, `msg_…`, `resp_…`: the box's call id, mapped to the picker's)."""
        found = self.router.explain(call_id)
        if found is None:
            bare = bare_call_id(call_id)
            found = self.router.explain(self._box_calls.get(bare, bare))
        return found

    def healthy_boxes(self, now: float) -> list[str]:
        """Boxes passing their health check with a fresh snapshot at `now`, by name."""
        return sorted(
            s.instance
            for s in self.router.instances(now)
            if s.healthy and s.fresh and s.instance in self.endpoints
        )

    def decisions_per_s(self, now: float) -> float:
        self._trim(now)
        return self._decided_n / _RATE_WINDOW_S

    def _count(self, now: float) -> None:
        grain = math.floor(now / _RATE_GRAIN_S)
        if self._decided and self._decided[-1][0] >= grain:  # the clock went back: the newest
            self._decided[-1][1] += 1
        else:
            self._decided.append([grain, 1])
        self._decided_n += 1
        self._trim(now)

    def _trim(self, now: float) -> None:
        oldest = math.floor((now - _RATE_WINDOW_S) / _RATE_GRAIN_S)
        while self._decided and self._decided[0][0] < oldest:
            self._decided_n -= self._decided.popleft()[1]

    def _resolve(self, requested: str) -> BoxModel | None:
        """The model `requested` names on some box (cached until a box's models change: the
        walk is O(boxes), the pick must not be)."""
        if requested not in self._resolved:
            if len(self._resolved) >= _RESOLVED_MAX:  # names are the clients' to choose
                self._resolved.clear()
            self._resolved[requested] = self._lookup(requested)
        return self._resolved[requested]

    def _lookup(self, requested: str) -> BoxModel | None:
        """A name, an exact alias, then a glob, over every box's models."""
        return resolve_model([m for ms in self._models.values() for m in ms], requested)

    def status(self, now: float) -> dict:
        """Every box: its state, snapshot age, sessions, calls in flight and leases."""
        # a box's sessions: those this picker saw end there, and those the box says it holds
        # (what a restarted picker knows)
        sessions: dict[str, set[str]] = {}
        for e in self.router.sessions():
            if e.instance is not None:
                sessions.setdefault(e.instance, set()).add(e.session_id)
        rows = []
        for s in self.router.instances(now):
            seen = self._seen_at.get(s.instance)
            rows.append(
                {
                    "name": s.instance,
                    "endpoint": self.endpoints.get(s.instance),
                    "state": "healthy"
                    if s.healthy and s.fresh
                    else "stale"
                    if s.healthy
                    else "down",
                    "snapshot_age_s": None if seen is None else round(now - seen, 3),
                    "sessions": len(
                        sessions.get(s.instance, set()) | self.router.held_sessions(s.instance)
                    ),
                    "in_flight": s.in_flight,
                    "capacity": self.capacity(s.instance),
                    "leases": s.leases,
                }
            )
        return {
            "policy": self.policy.name,
            "boxes": rows,
            "decisions_per_s": round(self.decisions_per_s(now), 3),
        }


def _names(models: list[BoxModel]) -> list[tuple]:
    """What resolving a requested name reads of a box's models."""
    return [(m.name, tuple(m.aliases)) for m in models]


def _boxes_late() -> APIError:
    return APIError(
        429,
        "the pool's boxes are up but their snapshots are late; try again shortly",
        type="rate_limit_exceeded",
        code="boxes_late",
        headers={"Retry-After": "1"},
    )


def _no_box() -> APIError:
    return APIError(
        503,
        "no box of the pool is healthy now",
        type="api_error",
        code="no_healthy_box",
        headers={"Retry-After": "1"},
    )
