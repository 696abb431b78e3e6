"""`compare --suite shift`: demand that shifts between models during a run, on the paper's models
with a hot and a cold instance, and the planner (`talariad.planner`) driving the same moves it
proposes in the daemon, on the simulator's clock.

Workloads: `shift` (four phases of model popularity: one model busy; that model cooling while a
cold one heats; a model unseen so far appearing; all models busy) and `stationary` (one mix for
the same length: the control). Policies: the static config as shipped (`static`), the same box
with the planner in auto (`auto`), the best static assignment chosen with hindsight over the whole
run (`oracle-static`: every assignment of the planner's space is run, the lowest SCT p95 wins),
swap-on-demand as llama-swap does it (`swap`) and every model in cold rounds (`all-cold`).
Design: docs/planner.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from talariad.config import AblationConfig, PlannerConfig, PolicyConfig
from talariad.instance.core import Done
from talariad.knobs import planner_knobs, router_knobs
from talariad.perfmodel import dists
from talariad.perfmodel.memory import SimMemory, memory_spec
from talariad.perfmodel.profiles import ProfileSet
from talariad.planner import (
    Assignment,
    DemandMeter,
    Move,
    Planner,
    PlannerKnobs,
    Role,
    Seat,
    assignments,
)
from talariad.replay.generate import draw_gaps, realize, session_shape
from talariad.replay.metrics import RunResult, nearest_rank
from talariad.replay.trace import Trace
from talariad.sim.configs import InstanceSpec, SimConfig, base_knobs
from talariad.sim.instance import SimInstance
from talariad.sim.simulator import TIMER, Simulator
from talariad.types import Pool

WORKLOADS = ("shift", "stationary")
POLICIES = ("static", "auto", "oracle-static", "swap", "all-cold")
ROW_FIELDS = (
    "workload",
    "phase",
    "policy",
    "sct_p50_s",
    "sct_p95_s",
    "ttft_p95_s",
    "moves",
    "move_cost_s",
    "moves_per_model_hour",
)
PHASE_S = 1800.0
SESSIONS_PER_MIN = 3.0
MAX_DEPTH = 187  # §2.1: the deepest session of the characterization
GAP_CAP_S = 10.0  # §5.1: the fixed replay caps tool gaps at 10 s


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    duration_s: float
    mix: dict[str, float]
    """Model -> share of the sessions starting in the phase."""
    sessions_per_min: float = SESSIONS_PER_MIN


def shift_phases(models: Sequence[str]) -> list[Phase]:
    """Four phases on three models a, b, c: a busy (c unseen); c appearing; a cooling while b
    heats; all busy."""
    a, b, c = models[:3]
    return [
        Phase("a-busy", PHASE_S, {a: 0.7, b: 0.3}),
        Phase("c-appears", PHASE_S, {a: 0.3, b: 0.2, c: 0.5}),
        Phase("a-cools-b-heats", PHASE_S, {a: 0.05, b: 0.6, c: 0.35}),
        Phase("all-busy", PHASE_S, {a: 1 / 3, b: 1 / 3, c: 1 / 3}),
    ]


def stationary_phases(models: Sequence[str]) -> list[Phase]:
    """The control: one mix for as long as the shifting run, the shipped hot model the busiest."""
    a, b, c = models[:3]
    return [Phase("stationary", 4 * PHASE_S, {a: 0.6, b: 0.2, c: 0.2})]


@dataclass(frozen=True)
class Workload:
    name: str
    trace: Trace
    starts: tuple[float, ...]
    phases: tuple[Phase, ...]

    def bounds(self) -> list[tuple[str, float, float]]:
        """(phase, start, end) on the run's clock; the last phase runs on to the end."""
        out, t = [], 0.0
        for i, p in enumerate(self.phases):
            end = float("inf") if i == len(self.phases) - 1 else t + p.duration_s
            out.append((p.name, t, end))
            t += p.duration_s
        return out

    @property
    def duration_s(self) -> float:
        return sum(p.duration_s for p in self.phases)


def workload(name: str, phases: Sequence[Phase], seed: int) -> Workload:
    """Sessions arrive as a Poisson process per phase, each on a model drawn from the phase's mix,
    shaped as the §2.1 characterization (depth, prompts, reuse, gaps capped at 10 s)."""
    rng = np.random.default_rng(seed)
    sessions, starts, t0 = [], [], 0.0
    for phase in phases:
        models, weights = zip(*phase.mix.items(), strict=True)
        p = np.array(weights) / sum(weights)
        t = t0 + rng.exponential(60.0 / phase.sessions_per_min)
        while t < t0 + phase.duration_s:
            model = models[rng.choice(len(models), p=p)]
            depth = min(dists.DEPTH.sample_int(rng), MAX_DEPTH)
            shape = session_shape(rng, max(depth, 1), compact=True)
            gaps = draw_gaps(rng, len(shape.prompts), GAP_CAP_S)
            sessions.append(realize(shape, f"{name}-{len(sessions):04d}", model, gaps))
            starts.append(t)
            t += rng.exponential(60.0 / phase.sessions_per_min)
        t0 += phase.duration_s
    return Workload(name, Trace(sessions), tuple(starts), tuple(phases))


# ---- the box and its assignments ----------------------------------------------------------------


def seats(models: Sequence[str]) -> tuple[Seat, ...]:
    """The shipped box: `hot0` pins the first model; `cold0` may time-share every model."""
    return (Seat("hot0", (models[0],)), Seat("cold0", tuple(models)))


def shipped(models: Sequence[str]) -> Assignment:
    return Assignment.of({"hot0": Role.hot(models[0]), "cold0": Role.cold(models)})


def box(a: Assignment) -> tuple[InstanceSpec, ...]:
    return tuple(InstanceSpec(n, r.models, r.pool) for n, r in a.roles)


def _config(name: str, a: Assignment, pset: ProfileSet, models, policy="talaria", sched=None):
    return SimConfig(
        name,
        box(a),
        sched or base_knobs(pset, tuple(models)),
        router_knobs(PolicyConfig(), AblationConfig()),
        policy,
        start_interval_s=1.0,  # sessions start at their own times (nonzero: no strict rank bound)
    )


# ---- the simulator with the planner ------------------------------------------------------------


@dataclass(slots=True)
class MoveRecord:
    move: Move
    start_s: float
    end_s: float | None = None

    @property
    def out_s(self) -> float:
        """How long the instance took no calls: its drain and its restart."""
        return 0.0 if self.end_s is None else self.end_s - self.start_s


class ShiftSimulator(Simulator):
    """The simulator with per-session start times and, when given a planner, its moves carried out
    as the daemon's `pool move` does: close the instance to new calls, wait for its calls to
    finish, restart it in its new role (weights loaded, its sessions' KV gone), reopen it."""

    def __init__(
        self,
        wl: Workload,
        config: SimConfig,
        pset: ProfileSet,
        planner: Planner | None = None,
        on_session_done: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(wl.trace, config, pset, on_session_done)
        self.wl, self.planner, self.pset = wl, planner, pset
        self.moves: list[MoveRecord] = []
        self._retired: list[SimInstance] = []
        self._moving: MoveRecord | None = None
        self._loading = False  # the moving instance drained and is loading its new role
        if planner is not None:
            self.meter = DemandMeter(planner.models, 0.0)
            self._push(planner.knobs.window_s, TIMER, self._tick)

    def _start_s(self, s: int) -> float:
        return self.wl.starts[s]

    # ---- demand in, moves out -------------------------------------------------------------

    def _complete(self, inst: SimInstance, done: Done, now: float) -> None:
        call = self._pending[done.completion.call_id].call
        super()._complete(inst, done, now)
        if self.planner is not None:
            self.meter.call(
                call.model, call.session_id, call.new_tokens, call.prefix_tokens, call.output_tokens
            )
        self._check_drained(now)

    def _done(self, now: float, name: str) -> None:
        super()._done(now, name)
        self._check_drained(now)

    def _tick(self, now: float) -> None:
        planner = self.planner
        for inst in self.instances.values():
            for model, waiting in inst.sched.table.waiting.items():
                last = inst.sched.round_summaries[-1].wall_s if inst.sched.round_summaries else None
                self.meter.sample(model, len(waiting), last if inst.pool is Pool.COLD else None)
        planner.observe(self.meter.window(now))
        proposal = planner.propose(now)
        if proposal.move is not None:
            planner.begin(proposal.move, now)
            self._moving = MoveRecord(proposal.move, now)
            self.moves.append(self._moving)
            self.router.close_instance(proposal.move.instance, drain=True)
            self._check_drained(now)
        self._push(now + planner.knobs.window_s, TIMER, self._tick)

    def _check_drained(self, now: float) -> None:
        rec = self._moving
        if rec is None or self._loading:
            return
        name = rec.move.instance
        inst = self.instances[name]
        table = inst.sched.table
        if inst.busy or table.running or any(table.waiting.values()):
            return
        if any(p.instance == name for p in self._pending.values() if p.instance is not None):
            return
        self._loading = True
        # the restart loads the new role's first model; a cold role opens the rest in its rounds
        self._push(now + self.profiles[rec.move.after.models[0]].open_s, TIMER, self._restarted)

    def _restarted(self, now: float) -> None:
        rec = self._moving
        move, old = rec.move, self.instances[rec.move.instance]
        self._retired.append(old)
        spec = memory_spec(self.pset)
        inst = SimInstance(
            move.instance,
            move.after.pool,
            list(move.after.models),
            self.cfg.sched,
            self.profiles,
            SimMemory(spec, self.cfg.sched.d2d, self.cfg.sched.host_kv),
            prewarm=True,
        )
        self.instances[move.instance] = inst
        self.router.remove_instance(move.instance, now)
        self.router.observe(inst.snapshot(now), now)
        self.router.reopen_instance(move.instance)
        rec.end_s, self._moving, self._loading = now, None, False
        self.planner.finish(move, now)

    def _finish_result(self) -> None:
        super()._finish_result()
        for inst in self._retired:
            self.result.switches += inst.core.switches
        self.result.switches.sort(key=lambda w: (w.at_s, w.instance))


# ---- runs and rows -------------------------------------------------------------------------------


@dataclass
class Run:
    policy: str
    result: RunResult
    moves: list[tuple[float, float]]
    """(start, cost seconds) of each move: the planner's (drain and restart) or a swap's load."""
    note: str = ""


def run_policy(
    policy: str,
    wl: Workload,
    pset: ProfileSet,
    models: Sequence[str],
    planner_cfg: PlannerConfig | None = None,
    on_session_done: Callable[[], None] | None = None,
) -> Run:
    if policy == "oracle-static":
        return oracle(wl, pset, models, on_session_done)
    if policy == "swap":
        everywhere = Assignment.of({"w0": Role.cold(models), "w1": Role.cold(models)})
        # llama-swap reloads a model's weights and keeps no KV across a swap: no D2D staging and
        # no host KV; one model at a time on each instance, by the llama-swap placement rule
        base = base_knobs(pset, tuple(models))
        sched = dataclasses.replace(base, d2d=False, host_kv=False)
        cfg = _config("swap", everywhere, pset, models, "llama-swap", sched)
        result = ShiftSimulator(wl, cfg, pset, on_session_done=on_session_done).run()
        return Run(policy, result, [(w.at_s, w.latency_s) for w in result.switches])
    if policy == "all-cold":
        everywhere = Assignment.of({"c0": Role.cold(models), "c1": Role.cold(models)})
        cfg = _config("all-cold", everywhere, pset, models)
        return Run(policy, ShiftSimulator(wl, cfg, pset, on_session_done=on_session_done).run(), [])
    cfg = _config(policy, shipped(models), pset, models)
    if policy == "static":
        return Run(policy, ShiftSimulator(wl, cfg, pset, on_session_done=on_session_done).run(), [])
    if policy != "auto":
        raise ValueError(f"unknown policy {policy!r}; choose from {POLICIES}")
    knobs = planner_knobs(planner_cfg or PlannerConfig(), PolicyConfig())
    sim = ShiftSimulator(wl, cfg, pset, make_planner(pset, models, knobs), on_session_done)
    result = sim.run()
    return Run(policy, result, [(m.start_s, m.out_s) for m in sim.moves])


def make_planner(pset: ProfileSet, models: Sequence[str], knobs: PlannerKnobs) -> Planner:
    return Planner(seats(models), models, pset.profiles(), shipped(models), knobs)


def oracle(
    wl: Workload,
    pset: ProfileSet,
    models: Sequence[str],
    on_session_done: Callable[[], None] | None = None,
) -> Run:
    """Every assignment of the planner's space run over the whole workload; the lowest SCT p95."""
    best = None
    for a in assignments(seats(models), models):
        result = ShiftSimulator(wl, _config("oracle-static", a, pset, models), pset).run()
        p95 = nearest_rank((s.sct_s for s in result.sessions), 95)
        if best is None or p95 < best[0]:
            best = (p95, a, result)
        if on_session_done is not None:
            on_session_done()
    return Run("oracle-static", best[2], [], note=str(best[1]))


def rows(wl: Workload, run: Run, models: Sequence[str]) -> list[dict]:
    """One row per phase and one for the whole run (`all`)."""
    phase_of = {}
    for i, s in enumerate(wl.trace.sessions):
        phase_of[s[0].session_id] = next(
            name for name, a, b in wl.bounds() if a <= wl.starts[i] < b
        )
    out = []
    spans = [(*b, p.duration_s) for b, p in zip(wl.bounds(), wl.phases, strict=True)]
    whole = ("all", 0.0, float("inf"), wl.duration_s)
    for name, a, b, length in [*spans, whole] if len(spans) > 1 else [whole]:
        sessions = [
            s for s in run.result.sessions if name == "all" or phase_of[s.session_id] == name
        ]
        ids = {s.session_id for s in sessions}
        ttfts = [c.ttft_s for c in run.result.calls if c.session_id in ids]
        moves = [(t, c) for t, c in run.moves if a <= t < b]
        out.append(
            {
                "workload": wl.name,
                "phase": name,
                "policy": run.policy,
                "sct_p50_s": nearest_rank((s.sct_s for s in sessions), 50),
                "sct_p95_s": nearest_rank((s.sct_s for s in sessions), 95),
                "ttft_p95_s": nearest_rank(ttfts, 95),
                "moves": len(moves),
                "move_cost_s": sum((c for _, c in moves), 0.0),
                "moves_per_model_hour": len(moves) / (len(models) * length / 3600.0),
            }
        )
    return out
