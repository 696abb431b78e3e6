"""The discrete-event simulator: closed-loop sessions in virtual time through the real `Router`
and one `SimInstance` (real `ColdScheduler`) per configured instance.

One event heap (time, seq, kind, payload): a session's call is released one gap after its
previous response and placed as the gateway would; an idle instance asks its scheduler for the
next action when something changed. Telemetry is sampled lazily, just before the router decides,
so the router sees state at most one heartbeat stale, as in the daemon. Design:
docs/internals.md.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from talariad.instance.core import Done
from talariad.perfmodel.memory import SimMemory, memory_spec
from talariad.perfmodel.profiles import ProfileSet
from talariad.replay.bounds import rank_bounds, single_tenant_bounds
from talariad.replay.metrics import CallRecord, RoundRecord, RunResult, SessionRecord
from talariad.replay.trace import Trace, TraceCall
from talariad.router import CallRequest, Decision, DecisionKind, Lease, Router
from talariad.sim.configs import SimConfig
from talariad.sim.instance import SimInstance
from talariad.types import LatencyProfile, RoundMeasurement, SwitchPath

RELEASE, RETRY, DONE, WAKE, TIMER = range(5)  # TIMER: a callback a subclass schedules
REFRESH_S = 1.0  # re-publish an unchanged snapshot this often (the router's staleness bound is 2 s)
MAX_VIRTUAL_S = 1e7
_BEYOND = math.nextafter(MAX_VIRTUAL_S, math.inf)  # end < _BEYOND: the step ends by MAX_VIRTUAL_S


@dataclass(slots=True)
class Pending:
    """One call between its release and its completion."""

    session: int
    call: TraceCall
    call_id: str
    intended_s: float
    instance: str | None = None
    resident: bool | None = None
    opened: bool = False
    avoidable: bool = False
    reserved: bool | None = None  # a returning call: a lease was installed for it
    lease_hit: bool = False  # ... and the router placed it through that lease


class Simulator:
    def __init__(
        self,
        trace: Trace,
        config: SimConfig,
        pset: ProfileSet,
        on_session_done: Callable[[], None] | None = None,
        fast_decodes: bool = True,
    ) -> None:
        """fast_decodes: finish runs of identical decode steps in one call (`SimInstance.
        finish_decodes`); False steps every one through the instance core (the same result)."""
        self.fast_decodes = fast_decodes
        missing = sorted(set(trace.models()) - set(pset.models))
        if missing:
            raise ValueError(f"trace models {missing} have no profile in set {pset.name!r}")
        self.trace, self.cfg, self.profiles = trace, config, pset.profiles()
        spec = memory_spec(pset)
        if config.overhead_free:
            self.profiles = {m: overhead_free(p) for m, p in self.profiles.items()}
            spec = dataclasses.replace(spec, hbm_bytes=1 << 60, host_kv_bytes=1 << 60, prices=None)
        self.router = Router(config.router, self.profiles, policy=config.policy)
        self.instances = {
            i.name: SimInstance(
                i.name,
                i.pool,
                list(i.models),
                config.sched,
                self.profiles,
                SimMemory(spec, config.sched.d2d, config.sched.host_kv),
                config.prewarm,
            )
            for i in config.instances
        }
        self.on_session_done = on_session_done or (lambda: None)
        self._heap: list = []
        self._seq = 0
        self._pending: dict[str, Pending] = {}
        self._last_inst: dict[int, str] = {}
        self._leased: dict[int, bool] = {}  # session -> its last completion installed a lease
        self._starts: dict[int, float] = {}
        self._left = len(trace.sessions)
        self._now = 0.0
        self.result = RunResult(
            config.name,
            policy=config.policy if config.load or config.tau_s is not None else None,
            load=config.load,
            tau_s=config.tau_s,
        )

    # ---- the loop -------------------------------------------------------------------------

    def run(self) -> RunResult:
        t0 = time.perf_counter()
        self._first_look()
        for s, _ in enumerate(self.trace.sessions):
            self._push(self._start_s(s), RELEASE, (s, 0))
        handlers = (self._release, self._retry, self._done, self._wake, self._timer)
        while self._heap and self._left:
            now, _, kind, payload = heapq.heappop(self._heap)
            self._now = now
            if now > MAX_VIRTUAL_S:
                raise RuntimeError(
                    f"{self.cfg.name}: no progress by t={now:.0f}s ({self._left} sessions left)"
                )
            handlers[kind](now, payload)
        if self._left:
            raise RuntimeError(
                f"{self.cfg.name}: event queue ran dry with {self._left} sessions left"
            )
        self._finish_result()
        self.result.wall_clock_s = time.perf_counter() - t0
        return self.result

    def _start_s(self, s: int) -> float:
        """When session `s` starts (a subclass may give each session its own start)."""
        return s * self.cfg.start_interval_s

    def _timer(self, now: float, callback: Callable[[float], None]) -> None:
        callback(now)

    def _push(self, t: float, kind: int, payload) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, payload))

    # ---- sessions and placement -----------------------------------------------------------

    def _release(self, now: float, payload: tuple[int, int]) -> None:
        s, k = payload
        call = self.trace.sessions[s][k]
        if k == 0:
            self._starts[s] = now
        pending = Pending(s, call, f"{call.session_id}#{k}", now)
        self._pending[pending.call_id] = pending
        self._place(pending, now)

    def _retry(self, now: float, call_id: str) -> None:
        self._place(self._pending[call_id], now)

    def _first_look(self) -> None:
        """The router's first view of every instance, at t=0."""
        for inst in self.instances.values():
            self.router.observe(inst.snapshot(0.0), 0.0)

    def _place(self, p: Pending, now: float) -> None:
        req = request(p)
        self._telemetry(now)
        self._dispatch(p, req, self.router.place(req, now), now)

    def _dispatch(self, p: Pending, req: CallRequest, decision: Decision, now: float) -> None:
        """Carry out the router's decision: hold the call for a retry, or submit it."""
        c = p.call
        if p.reserved is None and c.call_idx > 0:  # the first attempt decides whether it hit
            p.reserved = self._leased.pop(p.session, False)
            p.lease_hit = decision.kind is DecisionKind.LEASE_HIT
        if not decision.kind.places:
            self._push(now + (decision.retry_after_s or self.cfg.heartbeat_s), RETRY, p.call_id)
            return
        inst = self.instances[decision.instance]
        p.instance = inst.name
        p.resident = inst.resident(c.model)
        p.opened = not p.resident
        others = (o for o in self.instances.values() if o is not inst)
        p.avoidable = p.opened and any(o.resident(c.model) for o in others)
        inst.submit(
            p.call_id,
            c.session_id,
            c.model,
            max(c.prompt_tokens, 1),
            c.prefix_tokens,
            req.max_tokens,
            now,
        )
        if not inst.busy:
            self._step(inst, now)

    # ---- instances ------------------------------------------------------------------------

    def _step(self, inst: SimInstance, now: float) -> None:
        end, wake = inst.start(now)
        # NOTE: an action ending strictly before every queued event would be popped next anyway:
        # finish it here instead of a heap round trip (ties go through the heap, which orders them)
        while end is not None and (not self._heap or end < self._heap[0][0]) and self._left:
            if end > MAX_VIRTUAL_S:
                break
            if self.fast_decodes:  # a run of identical decode steps, without one call chain each
                until = min(self._heap[0][0], _BEYOND) if self._heap else _BEYOND
                reached, ahead = inst.finish_decodes(until)
                if reached is not None:
                    self._now = now = reached
                    end, wake = (ahead, None) if ahead is not None else inst.start(now)
                    continue
            self._now = now = end
            for c in inst.finish(now):
                self._complete(inst, c, now)
            end, wake = inst.start(now)
        if end is not None:
            self._push(end, DONE, inst.name)
        elif wake is not None:
            self._push(wake, WAKE, inst.name)

    def _wake(self, now: float, name: str) -> None:
        inst = self.instances[name]
        if not inst.busy:
            self._step(inst, now)

    def _done(self, now: float, name: str) -> None:
        inst = self.instances[name]
        for done in inst.finish(now):
            self._complete(inst, done, now)
        self._step(inst, now)

    def _complete(self, inst: SimInstance, done: Done, now: float) -> None:
        c = done.completion
        p = self._pending.pop(c.call_id)
        self._leased[p.session] = self._settle(inst, p, done, now) is not None
        s, k = p.session, p.call.call_idx
        prev = self._last_inst.get(s)
        self._last_inst[s] = inst.name
        source = done.call.kv_source
        self.result.calls.append(
            CallRecord(
                p.call.session_id,
                k,
                p.call.model,
                inst.name,
                p.intended_s,
                c.first_token_at,
                now,
                same_instance=None if k == 0 else prev == inst.name,
                model_resident=p.resident,
                opened_model=p.opened,
                avoidable_open=p.avoidable,
                kv_source=source,
                parked_times=c.parked_times,
                park_cost_s=c.park_cost_s,
                reserved=p.reserved,
                lease_hit=p.lease_hit,
            )
        )
        session = self.trace.sessions[s]
        if k + 1 < len(session):
            self._push(now + session[k + 1].gap_s, RELEASE, (s, k + 1))
        else:
            self._left -= 1
            self.result.sessions.append(
                SessionRecord(p.call.session_id, p.call.model, self._starts[s], now)
            )
            self.on_session_done()

    def _settle(self, inst: SimInstance, p: Pending, done: Done, now: float) -> Lease | None:
        """Tell the router the call completed; returns the lease it installed, if any."""
        c = done.completion
        return self.router.completed(c.call_id, inst.name, done.kv_state, done.kv_len, now)

    # ---- telemetry ------------------------------------------------------------------------

    def _telemetry(self, now: float) -> None:
        self._refresh(self.router, self.instances.values(), now)

    def _refresh(
        self, router: Router, insts: Iterable[SimInstance], now: float
    ) -> list[tuple[str, str, RoundMeasurement]]:
        """Publish what changed of `insts` to `router`; returns the round measurements fed."""
        fed = []
        for inst in insts:
            if now - inst.published_at < self.cfg.heartbeat_s:
                continue
            if inst.version != inst.published_version or now - inst.published_at >= REFRESH_S:
                router.observe(inst.snapshot(now), now)
            else:
                router.heartbeat(inst.name, now)
            for model, measured in inst.round_measurements():
                router.round_summary(inst.name, model, measured, now)
                fed.append((inst.name, model, measured))
        router.expire(now)
        return fed

    # ---- results --------------------------------------------------------------------------

    def _finish_result(self) -> None:
        r = self.result
        alone = single_tenant_bounds(self.trace, self.profiles)
        r.sessions = sorted(
            (
                SessionRecord(x.session_id, x.model, x.start_s, x.end_s, alone[x.session_id])
                for x in r.sessions
            ),
            key=lambda x: x.session_id,
        )
        if self.cfg.start_interval_s == 0:  # the strict bound assumes sessions start together
            r.rank_bounds = rank_bounds(self.trace, self.profiles)
        r.calls.sort(key=lambda x: (x.session_id, x.call_idx))
        for inst in self.instances.values():
            r.switches += inst.core.switches
            s = inst.sched
            r.rounds += [
                RoundRecord(
                    x.index,
                    inst.name,
                    x.wall_s,
                    x.active_s,
                    x.switch_s,
                    inst.model.hbm_by_round.get(x.index, 0),
                )
                for x in s.round_summaries
            ]
            if (last := open_round(inst, self._now)) is not None:
                r.rounds.append(last)
            r.hbm_peak_bytes = max(r.hbm_peak_bytes, inst.model.hbm_peak)
            r.sp_admitted += s.sp_admitted
            r.sp_parked += s.sp_parked
        r.switches.sort(key=lambda w: (w.at_s, w.instance))


def request(p: Pending) -> CallRequest:
    """The router's view of a pending call."""
    c = p.call
    return CallRequest(
        p.call_id, c.session_id, c.model, c.prompt_tokens, c.prefix_tokens, max(c.output_tokens, 1)
    )


def overhead_free(prof: LatencyProfile) -> LatencyProfile:
    """The profile with free switches, opens and restores (the fair-share reference)."""
    free = dict.fromkeys(SwitchPath, 0.0)
    return dataclasses.replace(
        prof, switch_s=free, fallback_s=0.0, open_s=0.0, restore_s_per_token=0.0
    )


def open_round(inst: SimInstance, end: float) -> RoundRecord | None:
    """The round still open when the last session finished (its slot is holding for returns
    that will not come), measured up to `end`."""
    cur, slot = inst.sched.rounds.current, inst.sched.slot
    if cur is None:
        return None
    active = cur.active_s + (end - slot.opened_at if slot is not None else 0.0)
    return RoundRecord(
        cur.index,
        inst.name,
        active + cur.switch_s,
        active,
        cur.switch_s,
        inst.model.hbm_by_round.get(cur.index, 0),
    )


def simulate(
    trace: Trace,
    config: SimConfig,
    pset: ProfileSet,
    on_session_done: Callable[[], None] | None = None,
) -> RunResult:
    """Run one configuration over one trace; same inputs give the same numbers."""
    return Simulator(trace, config, pset, on_session_done).run()
