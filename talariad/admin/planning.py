"""The daemon's clock around the planner core (`talariad.planner`): every `planner.window_s` it reads
the gateway's per-model counters and the router's session table into a demand window, asks the
core for a proposal and, in `auto`, carries the move out with the operator's `pool move` mechanics
(drain, restart in the new role, reopen), one at a time. `talaria-ctl pool plan` reads the latest
proposal; `--apply` carries it out once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from talariad.admin import admin_pb2
from talariad.admin.operator import ActionRefused, DaemonState, Operator
from talariad.config import TalariaConfig
from talariad.knobs import planner_knobs
from talariad.planner import (
    Assignment,
    DemandWindow,
    ModelDemand,
    Move,
    Planner,
    Proposal,
    Role,
    Seat,
    moved_models,
)
from talariad.router import Router
from talariad.types import LatencyProfile, Pool

log = logging.getLogger("talariad.planner")
HISTORY = 32


@dataclass
class MoveEvent:
    at: float
    move: Move
    by: str
    outcome: str = "moving"
    took_s: float = 0.0
    why: tuple[str, ...] = ()


def hosted_models(cfg: TalariaConfig) -> list[str]:
    """Models some instance hosts, in config order: the ones the planner keeps served."""
    hosted = {m for i in cfg.instances for m in i.models}
    return [m.name for m in cfg.models if m.name in hosted]


def _totals(registry: CollectorRegistry, metric: str) -> dict[str, float]:
    """A counter's `_total` samples summed per `model` label."""
    out: dict[str, float] = {}
    for family in registry.collect():
        if family.name != metric:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                m = sample.labels.get("model", "")
                out[m] = out.get(m, 0.0) + sample.value
    return out


class PlannerShell:
    def __init__(
        self,
        cfg: TalariaConfig,
        state: DaemonState,
        operator: Operator,
        router: Router,
        registry: CollectorRegistry,
        snapshots: Callable[[str], object | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.mode = cfg.planner.mode
        self.state, self.op, self.router, self.registry = state, operator, router, registry
        self.snapshots, self.clock = snapshots, clock
        self.models = hosted_models(cfg)
        self.knobs = planner_knobs(cfg.planner, cfg.policy)
        seats = [
            Seat(i.name, tuple(i.models), i.name not in cfg.planner.fixed) for i in cfg.instances
        ]
        self.names = [i.name for i in cfg.instances]
        self.planner = Planner(seats, self.models, self._profiles(), self.assignment(), self.knobs)
        self.proposal: Proposal | None = None
        self.history: deque[MoveEvent] = deque(maxlen=HISTORY)
        self._last: tuple[float, dict] | None = None  # read when the loop starts
        self._proposed: str | None = None
        self.proposals = Counter(
            "talaria_planner_proposals",
            "Moves the planner proposed (counted when the proposal changes)",
            ["instance", "to"],
            registry=registry,
        )
        self.moves = Counter(
            "talaria_planner_moves",
            "Planner moves carried out, by outcome (done, failed)",
            ["instance", "to", "outcome"],
            registry=registry,
        )
        self.expected_delay = Gauge(
            "talaria_planner_expected_delay_seconds",
            "Expected session delay per second of the current assignment (the planner's model)",
            registry=registry,
        )
        self.moving = Gauge(
            "talaria_planner_moving", "1 while a planner move is in progress", registry=registry
        )

    # ---- what the daemon holds ---------------------------------------------------------------

    def _profiles(self) -> Mapping[str, LatencyProfile]:
        return self.router.profiles()

    def assignment(self) -> Assignment:
        """Every instance's role as the daemon runs it now (config, pool moves, pins)."""
        roles = {}
        for name in self.names:
            pool = Pool(self.state.pool_of(name))
            models = tuple(self.state.serving_models(name))
            roles[name] = Role(pool, models)
        return Assignment.of(roles)

    def _counters(self) -> dict[str, dict[str, float]]:
        return {
            "calls": _totals(self.registry, "talaria_requests_finished"),
            "prompt": _totals(self.registry, "talaria_prompt_tokens"),
            "output": _totals(self.registry, "talaria_generation_tokens"),
            "cached": _totals(self.registry, "talaria_prefix_cache_hit_tokens"),
        }

    def window(self, now: float) -> DemandWindow:
        """The demand since the last window: counter deltas per second, live sessions, waiting."""
        after = self._counters()
        start, before = self._last or (now, after)
        self._last = (now, after)
        span = max(now - start, 1e-6)

        def delta(key: str, model: str) -> float:
            return max(after[key].get(model, 0.0) - before[key].get(model, 0.0), 0.0)

        live: dict[str, set[str]] = {m: set() for m in self.models}
        for e in self.router.sessions():
            if e.model in live and e.last_used >= start:
                live[e.model].add(e.session_id)
        waiting = dict.fromkeys(self.models, 0)
        for name in self.names:
            snap = self.snapshots(name)
            for m, n in (getattr(snap, "queued", None) or {}).items():
                if m in waiting:
                    waiting[m] += n
        out = {}
        for m in self.models:
            calls, cached = delta("calls", m), delta("cached", m)
            out[m] = ModelDemand(
                calls / span,
                max(delta("prompt", m) - cached, 0.0) / span,
                delta("output", m) / span,
                float(len(live[m])),
                cached / calls if calls else 0.0,
                float(waiting[m]),
            )
        return DemandWindow(start, now, out)

    # ---- the loop ------------------------------------------------------------------------------

    async def run_forever(self) -> None:
        self._last = (self.clock(), self._counters())
        while True:
            await asyncio.sleep(self.knobs.window_s)
            try:
                await self.tick()
            except Exception:  # the planner never takes the daemon down with it
                log.exception("planner tick failed")

    async def tick(self) -> Proposal:
        now = self.clock()
        self._sync(now)
        self.planner.profiles = dict(self._profiles())
        self.planner.observe(self.window(now))
        proposal = self.propose(now)
        if self.mode == "auto" and proposal.move is not None:
            await self.apply(proposal.move, "auto")
        return proposal

    def propose(self, now: float) -> Proposal:
        self.proposal = p = self.planner.propose(now)
        self.expected_delay.set(p.delay_now_s)
        key = str(p.move) if p.move else None
        if key is not None and key != self._proposed:
            self.proposals.labels(p.move.instance, str(p.move.after)).inc()
            log.info("planner proposes %s: %s", p.move, p.reasons[-1])
        self._proposed = key
        return p

    def _sync(self, now: float) -> None:
        """Take the roles an operator gave by hand (`pool move`, `model pin`) as the planner's."""
        if self.planner.moving is not None:
            return
        held, old = self.assignment(), self.planner.current
        if held == old:
            return
        moved: set[str] = set()
        for (_, before), (_, after) in zip(old.roles, held.roles, strict=True):
            moved |= moved_models(before, after)
        self.planner.moved_by_hand(held, moved, now)

    async def apply(self, move: Move, by: str) -> MoveEvent:
        """Carry `move` out as `pool move` does; the operator refuses other moves meanwhile."""
        now = self.clock()
        why = self.proposal.reasons[-2:] if self.proposal and self.proposal.move == move else ()
        event = MoveEvent(now, move, by, why=tuple(why))
        self.history.appendleft(event)
        self.planner.begin(move, now)
        self.op.automatic = f"{move} by {by}"
        self.moving.set(1)
        ok = False
        try:
            model = move.after.models[0] if move.after.pool is Pool.HOT else ""
            await self.op.move(move.instance, move.after.pool.value, model, automatic=True)
            ok, event.outcome = True, "done"
        except ActionRefused as err:
            event.outcome = f"failed: {err}"
            log.warning("planner move %s failed: %s", move, err)
        finally:
            self.op.automatic = None
            self.moving.set(0)
            end = self.clock()
            event.took_s = end - now
            self.planner.finish(move, end, ok)
            if ok:  # what the daemon now runs (a refused restart leaves the old role)
                self.planner.current = self.assignment()
            self.propose(end)  # the applied proposal is spent: answer with a fresh one
            self.moves.labels(move.instance, str(move.after), "done" if ok else "failed").inc()
        log.info("planner move %s by %s: %s in %.1fs", move, by, event.outcome, event.took_s)
        return event

    # ---- the admin API ---------------------------------------------------------------------------

    async def plan(self, apply: bool) -> admin_pb2.PlanReply:
        now = self.clock()
        if self.mode == "off":
            raise ActionRefused("failed_precondition", "the planner is off (planner.mode: off)")
        if self.proposal is None or self.planner.moving is not None:
            self._sync(now)
            self.propose(now)
        p = self.proposal
        applied = False
        if apply:
            if self.planner.moving is not None:
                raise ActionRefused(
                    "failed_precondition", f"a move is in progress ({self.planner.moving})"
                )
            if p.move is None:
                raise ActionRefused(
                    "failed_precondition", f"no move proposed: {p.reasons[-1] if p.reasons else ''}"
                )
            event = await self.apply(p.move, "operator")
            if not event.outcome == "done":
                raise ActionRefused("failed_precondition", event.outcome)
            applied = True
        return self.reply(p, applied, now)

    def reply(self, p: Proposal, applied: bool, now: float) -> admin_pb2.PlanReply:
        return admin_pb2.PlanReply(
            mode=self.mode,
            assignment=[f"{n}={r}" for n, r in self.planner.current.roles],
            has_move=p.move is not None,
            move=_move(p.move) if p.move else None,
            delay_now_s=p.delay_now_s,
            delay_after_s=p.delay_after_s or 0.0,
            gain_s=p.gain_s or 0.0,
            reasons=list(p.reasons),
            applied=applied,
            moving=str(self.planner.moving) if self.planner.moving else "",
            history=[
                admin_pb2.PlanEvent(
                    age_s=now - e.at,
                    move=_move(e.move),
                    by=e.by,
                    outcome=e.outcome,
                    took_s=e.took_s,
                    why=list(e.why),
                )
                for e in self.history
            ],
            age_s=now - p.at_s,
        )


def _move(m: Move) -> admin_pb2.PlanMove:
    c = m.cost
    return admin_pb2.PlanMove(
        instance=m.instance,
        before=str(m.before),
        after=str(m.after),
        drain_s=c.drain_s,
        load_s=c.load_s,
        kv_s=c.kv_s,
        during_s=c.during_s,
        cost_s=c.total_s,
    )
