"""The planner core: from windows of session demand per model, which instance pins which model hot
and which time-shares its models cold, one priced move at a time.

Sans-IO: every input carries `now`; it reads no clock and moves nothing. The daemon carries a move
out with the `talaria-ctl pool move` mechanics, the simulator with its own instances; both tell the
planner when a move begins and ends.

The delay model (docs/planner.md): a model's load is the instance-seconds per second its calls
need (prefill plus batched decode, from its `LatencyProfile`). A hot instance queues its model's
calls; a cold instance with several busy models runs rounds of length R = W / (1 - u) (W: the
switches of one round, u: the load it carries), capped by the round bound, and a call waits for its
model's slot, restores its prefix and is stretched over rounds when its slot is shorter than the
call. The planner minimises the sum over models of calls per second x expected wait per call.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from talariad.types import LatencyProfile, Pool, SwitchPath

HOT_SHARE = 0.9
"""A hot instance takes its model's load up to this utilisation; the rest overflows to the
model's cold takers (the router prefers the resident hot instance until it queues)."""
_SATURATED = (
    0.95  # utilisation at which the queueing term stops growing and the backlog term starts
)


@dataclass(frozen=True, slots=True)
class Role:
    """What one instance does: pin one model (hot) or time-share its models in rounds (cold)."""

    pool: Pool
    models: tuple[str, ...]

    @classmethod
    def hot(cls, model: str) -> Role:
        return cls(Pool.HOT, (model,))

    @classmethod
    def cold(cls, models: Iterable[str]) -> Role:
        return cls(Pool.COLD, tuple(models))

    def __str__(self) -> str:
        return f"{self.pool.value}:{','.join(self.models)}"


@dataclass(frozen=True, slots=True)
class Seat:
    """An instance as the planner sees it: what it time-shares when it is cold (its configured
    models) and whether the planner may move it."""

    name: str
    cold_models: tuple[str, ...]
    movable: bool = True


@dataclass(frozen=True, slots=True)
class Assignment:
    """Every instance's role, in instance order."""

    roles: tuple[tuple[str, Role], ...]

    @classmethod
    def of(cls, roles: Mapping[str, Role]) -> Assignment:
        return cls(tuple(roles.items()))

    def role(self, name: str) -> Role:
        return dict(self.roles)[name]

    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.roles)

    def takers(self, model: str, without: str | None = None) -> tuple[str, ...]:
        """Instances that take `model`'s calls (leaving out `without`)."""
        return tuple(n for n, r in self.roles if n != without and model in r.models)

    def with_role(self, name: str, role: Role) -> Assignment:
        return Assignment(tuple((n, role if n == name else r) for n, r in self.roles))

    def unserved(self, models: Iterable[str], without: str | None = None) -> list[str]:
        return [m for m in models if not self.takers(m, without)]

    def __str__(self) -> str:
        return " ".join(f"{n}={r}" for n, r in self.roles)


def moved_models(before: Role, after: Role) -> frozenset[str]:
    """Models whose placement a role change moves: those it adds or drops, and all of them when
    the instance changes pool."""
    if len(before.models) == 1 and before.models == after.models:
        return frozenset()  # one model alone on an instance runs alike in either pool
    if before.pool is not after.pool:
        return frozenset(before.models) | frozenset(after.models)
    return frozenset(before.models) ^ frozenset(after.models)


def assignments(
    seats: Sequence[Seat], models: Sequence[str], fixed: Mapping[str, Role] | None = None
) -> list[Assignment]:
    """Every assignment in the planner's space (each instance hot on one model, or cold on its
    own models; `fixed` instances keep the role given) that leaves no model without a taker."""
    fixed = fixed or {}
    options = [
        [fixed[s.name]]
        if s.name in fixed
        else [*(Role.hot(m) for m in models), Role.cold(s.cold_models)]
        for s in seats
    ]
    out = []
    for combo in itertools.product(*options):
        a = Assignment(tuple(zip((s.name for s in seats), combo, strict=True)))
        if not a.unserved(models):
            out.append(a)
    return out


# ---- demand -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelDemand:
    """One model's demand over a window, per second of the window."""

    calls_per_s: float = 0.0
    new_tokens_per_s: float = 0.0
    """Prompt tokens per second that need prefill (not covered by a reusable prefix)."""
    output_tokens_per_s: float = 0.0
    sessions: float = 0.0
    """Sessions live in the window (a call of theirs completed in it)."""
    prefix_tokens: float = 0.0
    """Mean reusable prefix of a call: what a return restores or recomputes after a switch."""
    waiting: float = 0.0
    """Sessions waiting on a slot (mean of the telemetry samples; reasons only)."""
    round_s: float | None = None
    """The round time its cold instance measured (reasons only)."""

    def blend(self, new: ModelDemand, alpha: float) -> ModelDemand:
        def mix(a: float, b: float) -> float:
            return (1 - alpha) * a + alpha * b

        return ModelDemand(
            mix(self.calls_per_s, new.calls_per_s),
            mix(self.new_tokens_per_s, new.new_tokens_per_s),
            mix(self.output_tokens_per_s, new.output_tokens_per_s),
            mix(self.sessions, new.sessions),
            mix(self.prefix_tokens, new.prefix_tokens) if new.calls_per_s else self.prefix_tokens,
            mix(self.waiting, new.waiting),
            new.round_s if new.round_s is not None else self.round_s,
        )


@dataclass(frozen=True, slots=True)
class DemandWindow:
    start_s: float
    end_s: float
    models: Mapping[str, ModelDemand]


@dataclass(slots=True)
class _Tally:
    calls: int = 0
    new_tokens: int = 0
    output_tokens: int = 0
    prefix_tokens: int = 0
    sessions: set[str] = field(default_factory=set)
    waiting_sum: float = 0.0
    waiting_n: int = 0
    round_s: float | None = None


class DemandMeter:
    """Counts completed calls and telemetry samples into windows (one per `window()`)."""

    def __init__(self, models: Sequence[str], now: float) -> None:
        self.models = tuple(models)
        self._start = now
        self._t: dict[str, _Tally] = {m: _Tally() for m in self.models}

    def call(
        self, model: str, session: str, new_tokens: int, prefix_tokens: int, output_tokens: int
    ) -> None:
        t = self._t.get(model)
        if t is None:
            return  # a model the planner does not place
        t.calls += 1
        t.new_tokens += max(new_tokens, 0)
        t.prefix_tokens += max(prefix_tokens, 0)
        t.output_tokens += max(output_tokens, 0)
        t.sessions.add(session)

    def sample(self, model: str, waiting: int, round_s: float | None = None) -> None:
        t = self._t.get(model)
        if t is None:
            return
        t.waiting_sum += waiting
        t.waiting_n += 1
        if round_s is not None:
            t.round_s = round_s

    def window(self, now: float) -> DemandWindow:
        span = max(now - self._start, 1e-9)
        out = {
            m: ModelDemand(
                t.calls / span,
                t.new_tokens / span,
                t.output_tokens / span,
                float(len(t.sessions)),
                t.prefix_tokens / t.calls if t.calls else 0.0,
                t.waiting_sum / t.waiting_n if t.waiting_n else 0.0,
                t.round_s,
            )
            for m, t in self._t.items()
        }
        window = DemandWindow(self._start, now, out)
        self._start, self._t = now, {m: _Tally() for m in self.models}
        return window


# ---- the delay model --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlannerKnobs:
    window_s: float = 60.0
    """Length of one demand window."""
    smoothing: float = 0.5
    """Weight of the newest window in the demand estimate (an EWMA over windows)."""
    persistence: float = 0.1
    """Weight of the newest window in the slow demand estimate: a move must also pay off under
    it, so a burst of a few sessions does not move a model (two timescales, one hysteresis)."""
    horizon_s: float = 600.0
    """How long a move's gain is expected to last (its payback horizon)."""
    margin: float = 2.0
    """A move is taken when its expected gain over the horizon exceeds margin x its cost."""
    min_gain: float = 0.5
    """... and it lowers the expected delay by at least this fraction (hysteresis)."""
    dwell_s: float = 900.0
    """A model that moved does not move again for this long."""
    warmup_windows: int = 2
    """Windows seen before the first proposal."""
    round_cap_s: float = 8.0
    """Longest round the cold scheduler runs (the round bound γ·T_TTFT)."""


@dataclass(frozen=True, slots=True)
class ModelDelay:
    """The delay model's view of one model under one assignment."""

    model: str
    load: float
    """Instance-seconds per second its calls need."""
    wait_s: float
    """Expected delay of one of its calls."""
    calls_per_s: float
    where: str
    """Where its load goes and what it waits for, in words and numbers."""


@dataclass(frozen=True, slots=True)
class Delay:
    total_s_per_s: float
    """Sum over models of calls per second x expected delay per call."""
    models: tuple[ModelDelay, ...]


def switch_s(p: LatencyProfile) -> float:
    return p.switch_cost_s(SwitchPath.PARTIAL)


def prefill_load(d: ModelDemand, p: LatencyProfile) -> float:
    return d.calls_per_s * p.prefill_base_s + d.new_tokens_per_s * p.prefill_s_per_token


def load_of(d: ModelDemand, p: LatencyProfile) -> float:
    """Instance-seconds per second: prefill work plus the time at least one of its sessions
    decodes (decode steps are batched: n concurrent streams cost about one)."""
    stream = d.output_tokens_per_s * p.decode_step_s
    return prefill_load(d, p) + (1.0 - math.exp(-stream))


def prefill_service_s(d: ModelDemand, p: LatencyProfile) -> float:
    if d.calls_per_s <= 0:
        return 0.0
    return p.prefill_s(int(d.new_tokens_per_s / d.calls_per_s))


def service_s(d: ModelDemand, p: LatencyProfile) -> float:
    """One call alone: its prefill and its decode."""
    if d.calls_per_s <= 0:
        return 0.0
    out = d.output_tokens_per_s / d.calls_per_s
    return prefill_service_s(d, p) + out * p.decode_step_s


def cycle_s(d: ModelDemand) -> float:
    """The time between one session's calls (Little's law over its live sessions)."""
    return d.sessions / d.calls_per_s if d.calls_per_s > 0 else 0.0


def _pinned_wait(d: ModelDemand, p: LatencyProfile, share: float, u: float) -> float:
    """A call on an instance that runs only its model: it queues behind other calls' prefills
    (decode is batched, so decoding calls delay it little); past saturation, sessions are a closed
    loop (one call in flight each), so each call stretches by the overload times its cycle."""
    up = prefill_load(d, p) * share
    return _queue_wait(prefill_service_s(d, p), up) + max(0.0, u - 1) * cycle_s(d)


def _queue_wait(service: float, u: float) -> float:
    """M/D/1 queueing, its utilisation capped below saturation (the overload is charged apart)."""
    u = min(u, _SATURATED)
    return service * u / (2 * (1 - u))


def _shares(
    a: Assignment, loads: Mapping[str, float], without: str | None
) -> dict[str, dict[str, float]]:
    """instance -> model -> the load of that model it carries."""
    out: dict[str, dict[str, float]] = {n: {} for n in a.names() if n != without}
    for model, load in loads.items():
        hot = [n for n in a.takers(model, without) if a.role(n).pool is Pool.HOT]
        cold = [n for n in a.takers(model, without) if a.role(n).pool is Pool.COLD]
        rest = load
        if hot:
            each = load / len(hot) if not cold else min(load / len(hot), HOT_SHARE)
            for n in hot:
                out[n][model] = each
            rest = load - each * len(hot)
        if cold and rest > 1e-12:
            for n in cold:
                out[n][model] = rest / len(cold)
    return out


def expected_delay(
    a: Assignment,
    demand: Mapping[str, ModelDemand],
    profiles: Mapping[str, LatencyProfile],
    knobs: PlannerKnobs,
    without: str | None = None,
) -> Delay:
    """The delay model over assignment `a` (with instance `without` out of service, as during
    its move). A model with demand and no taker waits the whole horizon."""
    loads = {m: load_of(d, profiles[m]) for m, d in demand.items() if d.calls_per_s > 0}
    rows = []
    for model in loads:
        if not a.takers(model, without):
            d = demand[model]
            rows.append(
                ModelDelay(model, loads[model], knobs.horizon_s, d.calls_per_s, "no instance")
            )
    for name, carried in _shares(a, loads, without).items():
        rows += _instance_delay(name, a.role(name), carried, loads, demand, profiles, knobs)
    merged: dict[str, ModelDelay] = {}
    for r in rows:  # a model on several instances: its calls split as its load does
        prev = merged.get(r.model)
        if prev is None:
            merged[r.model] = r
            continue
        calls = prev.calls_per_s + r.calls_per_s
        w = r.calls_per_s / calls if calls > 0 else 0.5
        merged[r.model] = replace(
            prev,
            load=prev.load + r.load,
            wait_s=(1 - w) * prev.wait_s + w * r.wait_s,
            calls_per_s=calls,
            where=f"{prev.where}; {r.where}",
        )
    models = tuple(merged[m] for m in sorted(merged))
    return Delay(sum(r.calls_per_s * r.wait_s for r in models), models)


def _instance_delay(
    name: str,
    role: Role,
    carried: Mapping[str, float],
    loads: Mapping[str, float],
    demand: Mapping[str, ModelDemand],
    profiles: Mapping[str, LatencyProfile],
    knobs: PlannerKnobs,
) -> list[ModelDelay]:
    """The models' delays on one instance; each row carries the calls its share of the load
    brings."""
    busy = {m: x for m, x in carried.items() if x > 0}
    if not busy:
        return []
    u = sum(busy.values())
    if len(busy) == 1:  # a hot instance, or a cold one with one busy model: no switches
        ((m, x),) = busy.items()
        wait = _pinned_wait(demand[m], profiles[m], x / loads[m], u)
        calls = demand[m].calls_per_s * x / loads[m]
        return [ModelDelay(m, x, wait, calls, f"{name} {role.pool.value} u={u:.2f}")]
    switches = sum(switch_s(profiles[m]) for m in busy)
    cap = knobs.round_cap_s
    room = max(cap - switches, 1e-3)
    rnd = min(switches / (1 - u) if u < 1 else math.inf, cap)
    # a slot lasts at least as long as one call needs, up to an even share of the round bound
    # (the scheduler keeps a slot open while its calls run); slots share the load otherwise
    slots = {
        m: max((rnd - switches) * x / u, min(service_s(demand[m], profiles[m]), room / len(busy)))
        for m, x in busy.items()
    }
    fill = sum(slots.values())
    if fill > room:
        slots = {m: s * room / fill for m, s in slots.items()}
    rnd = switches + sum(slots.values())
    over = max(0.0, u + switches / cap - 1)
    rows = []
    for m, x in busy.items():
        d, p = demand[m], profiles[m]
        slot = slots[m]
        out = 1 - slot / rnd if rnd > 0 else 0.0
        residual = out * (rnd - slot) / 2
        restore = out * p.restore_s(int(d.prefix_tokens))
        t = service_s(d, p)
        stretch = max(0.0, t - slot) / max(slot, 1e-3) * (rnd - slot) if slot < t else 0.0
        stretch = min(stretch, knobs.horizon_s)
        queue = _pinned_wait(d, p, x / loads[m], 0.0)
        wait = residual + restore + stretch + queue + over * cycle_s(d)
        rows.append(
            ModelDelay(
                m,
                x,
                wait,
                d.calls_per_s * x / loads[m],
                f"{name} cold round {rnd:.1f} s (switches {switches:.1f} s, u={u:.2f}), "
                f"slot {slot:.1f} s",
            )
        )
    return rows


# ---- moves and proposals -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MoveCost:
    """What a move costs the sessions, in seconds of expected delay."""

    drain_s: float
    """Until the calls running on the instance finish."""
    load_s: float
    """Loading the weights of its new role."""
    kv_s: float
    """Recomputing the prefixes of the sessions whose KV it drops."""
    during_s: float
    """The extra delay the other instances' sessions see while it drains and loads."""

    @property
    def total_s(self) -> float:
        return self.kv_s + self.during_s

    @property
    def out_s(self) -> float:
        """How long the instance takes no calls."""
        return self.drain_s + self.load_s


@dataclass(frozen=True, slots=True)
class Move:
    instance: str
    before: Role
    after: Role
    cost: MoveCost

    @property
    def models(self) -> frozenset[str]:
        return moved_models(self.before, self.after)

    def __str__(self) -> str:
        return f"{self.instance}: {self.before} -> {self.after}"


@dataclass(frozen=True, slots=True)
class Proposal:
    """The planner's answer at one moment: a move to take, or none, and why in numbers."""

    at_s: float
    current: Assignment
    move: Move | None
    delay_now_s: float
    """Expected delay per second of the current assignment."""
    delay_after_s: float | None
    gain_s: float | None
    """Expected delay saved over the horizon by the move (None: no move)."""
    reasons: tuple[str, ...]
    models: tuple[ModelDelay, ...] = ()

    @property
    def target(self) -> Assignment | None:
        return (
            None
            if self.move is None
            else self.current.with_role(self.move.instance, self.move.after)
        )


class Planner:
    """One box's planner. Moves happen one at a time: `begin` it, then `finish` it."""

    def __init__(
        self,
        seats: Sequence[Seat],
        models: Sequence[str],
        profiles: Mapping[str, LatencyProfile],
        current: Assignment,
        knobs: PlannerKnobs = PlannerKnobs(),
    ) -> None:
        missing = [m for m in models if m not in profiles]
        if missing:
            raise ValueError(f"no latency profile for {missing}")
        if current.unserved(models):
            raise ValueError(f"models without an instance: {current.unserved(models)}")
        self.seats = {s.name: s for s in seats}
        self.models = tuple(models)
        self.profiles = dict(profiles)
        self.knobs = knobs
        self.current = current
        self.demand: dict[str, ModelDemand] = {m: ModelDemand() for m in self.models}
        self.slow: dict[str, ModelDemand] = dict(self.demand)
        self.windows = 0
        self.moving: Move | None = None
        self.last_moved: dict[str, float] = {}
        self.history: list[tuple[float, Move, bool]] = []

    # ---- inputs --------------------------------------------------------------------------

    def observe(self, window: DemandWindow) -> None:
        first = self.windows == 0
        a = 1.0 if first else self.knobs.smoothing
        b = 1.0 if first else self.knobs.persistence
        for m in self.models:
            new = window.models.get(m, ModelDemand())
            self.demand[m] = self.demand[m].blend(new, a)
            self.slow[m] = self.slow[m].blend(new, b)
        self.windows += 1

    def begin(self, move: Move, now: float) -> None:
        if self.moving is not None:
            raise ValueError(f"a move is in progress ({self.moving})")
        self.moving = move
        for m in move.models:
            self.last_moved[m] = now

    def finish(self, move: Move, now: float, ok: bool = True) -> None:
        """The move ended: on success the instance holds its new role."""
        if ok:
            self.current = self.current.with_role(move.instance, move.after)
        self.moving = None
        self.history.append((now, move, ok))

    def moved_by_hand(self, current: Assignment, models: Iterable[str], now: float) -> None:
        """An operator moved an instance: take its roles and start the moved models' dwell."""
        self.current = current
        for m in models:
            self.last_moved[m] = now

    # ---- the decision --------------------------------------------------------------------

    def delay(self, a: Assignment, without: str | None = None) -> Delay:
        return expected_delay(a, self.demand, self.profiles, self.knobs, without)

    def propose(self, now: float) -> Proposal:
        now_delay = self.delay(self.current)
        base = dict(at_s=now, current=self.current, delay_now_s=now_delay.total_s_per_s)
        hold = dict(move=None, delay_after_s=None, gain_s=None, models=now_delay.models)
        lines = [f"expected delay {now_delay.total_s_per_s:.3f} s per s"] + [
            f"{r.model}: {r.calls_per_s:.3f} calls/s, load {r.load:.2f}, wait {r.wait_s:.2f} s/call ({r.where})"
            for r in now_delay.models
        ]
        if self.moving is not None:
            return Proposal(**base, **hold, reasons=(*lines, f"move in progress: {self.moving}"))
        if self.windows < self.knobs.warmup_windows:
            why = f"warming up: {self.windows} of {self.knobs.warmup_windows} demand windows seen"
            return Proposal(**base, **hold, reasons=(*lines, why))
        best, held = None, []
        for move, after in self._candidates(now, held):
            gain = (now_delay.total_s_per_s - after.total_s_per_s) * self.knobs.horizon_s
            net = gain - self.knobs.margin * move.cost.total_s
            if best is None or net > best[0]:
                best = (net, move, after, gain)
        if best is None:
            return Proposal(**base, **hold, reasons=(*lines, *held, "no instance may move"))
        net, move, after, gain = best
        c = move.cost
        priced = (
            f"best move {move}: delay {after.total_s_per_s:.3f} s per s, gain {gain:.1f} s over "
            f"{self.knobs.horizon_s:.0f} s; cost {c.total_s:.1f} s (drain {c.drain_s:.1f} s, "
            f"load {c.load_s:.1f} s, KV {c.kv_s:.1f} s, others wait {c.during_s:.1f} s)"
        )
        rel = 1 - after.total_s_per_s / now_delay.total_s_per_s if now_delay.total_s_per_s else 0
        slow, slow_rel = self._slow_gain(move)
        floor = self.knobs.min_gain
        if net <= 0:
            why = f"hold: gain {gain:.1f} s <= {self.knobs.margin:g} x cost {c.total_s:.1f} s"
        elif rel < floor:
            why = f"hold: it lowers the delay by {100 * rel:.0f}% < {100 * floor:.0f}%"
        elif slow <= self.knobs.margin * c.total_s or slow_rel < floor:
            why = (
                f"hold: under the slow demand estimate it gains {slow:.1f} s "
                f"({100 * slow_rel:.0f}%): not yet a lasting shift"
            )
        else:
            why = ""
        if why:
            return Proposal(**base, **hold, reasons=(*lines, *held, priced, why))
        take = (
            f"move: gain {gain:.1f} s (slow estimate {slow:.1f} s) > {self.knobs.margin:g} x "
            f"cost {c.total_s:.1f} s"
        )
        return Proposal(
            **base,
            move=move,
            delay_after_s=after.total_s_per_s,
            gain_s=gain,
            reasons=(*lines, *held, priced, take),
            models=after.models,
        )

    def _slow_gain(self, move: Move) -> tuple[float, float]:
        """The move's gain over the horizon and its relative gain under the slow estimate."""
        target = self.current.with_role(move.instance, move.after)
        before = expected_delay(self.current, self.slow, self.profiles, self.knobs).total_s_per_s
        after = expected_delay(target, self.slow, self.profiles, self.knobs).total_s_per_s
        return (before - after) * self.knobs.horizon_s, 1 - after / before if before else 0.0

    def _candidates(self, now: float, held: list[str]) -> Iterable[tuple[Move, Delay]]:
        """Every single-instance role change that keeps each model served during and after it
        and moves no model inside its dwell, with its delay model."""
        for name, role in self.current.roles:
            seat = self.seats.get(name)
            if seat is None or not seat.movable:
                continue
            stranded = self.current.unserved(self.models, without=name)
            if stranded:
                held.append(f"{name} cannot move: {', '.join(stranded)} would have no instance")
                continue
            for after in [*(Role.hot(m) for m in self.models), Role.cold(seat.cold_models)]:
                if after == role:
                    continue
                moved = moved_models(role, after)
                if not moved:
                    continue
                recent = [
                    m
                    for m in sorted(moved)
                    if now - self.last_moved.get(m, -math.inf) < self.knobs.dwell_s
                ]
                if recent:
                    continue
                target = self.current.with_role(name, after)
                if target.unserved(self.models):
                    continue
                yield Move(name, role, after, self._price(name, role, after)), self.delay(target)
        for m, t in sorted(self.last_moved.items()):
            if now - t < self.knobs.dwell_s:
                held.append(f"{m} moved {now - t:.0f} s ago (dwell {self.knobs.dwell_s:.0f} s)")

    def _price(self, name: str, before: Role, after: Role) -> MoveCost:
        loads = {m: load_of(d, self.profiles[m]) for m, d in self.demand.items() if d.calls_per_s}
        here = _shares(self.current, loads, None).get(name, {})
        drain = max((service_s(self.demand[m], self.profiles[m]) for m in here), default=0.0)
        busy = [m for m in after.models if self.demand[m].calls_per_s > 0] or list(after.models)
        load = max(self.profiles[m].open_s for m in busy)
        kv = 0.0
        for m, x in here.items():
            d, p = self.demand[m], self.profiles[m]
            kv += d.sessions * (x / loads[m]) * p.prefill_s(int(d.prefix_tokens))
        extra = self.delay(self.current, without=name).total_s_per_s
        extra -= self.delay(self.current).total_s_per_s
        return MoveCost(drain, load, kv, max(extra, 0.0) * (drain + load))
