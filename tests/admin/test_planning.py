"""The daemon's planner shell without processes: demand windows from the gateway's counters and the
router's sessions, a move carried out through the operator (which refuses a manual move meanwhile),
manual moves taken over, and `pool plan` replies."""

from __future__ import annotations

import asyncio

import pytest

from talariad.admin.operator import ActionRefused, Operator
from talariad.admin.planning import PlannerShell
from talariad.config import TalariaConfig
from talariad.gateway.metrics import GatewayMetrics
from talariad.perfmodel.profiles import load_set
from talariad.router.messages import SessionEntry

PROFILES = load_set("paper-tp8").profiles()
Q, G, H = "qwen3-235b", "glm5-nvfp4", "qwen3.5-122b"


def config(mode: str = "auto") -> TalariaConfig:
    return TalariaConfig.model_validate(
        {
            "models": [{"name": m, "profile": m} for m in (Q, G, H)],
            "instances": [
                {"name": "hot0", "pool": "hot", "models": [Q]},
                {"name": "cold0", "pool": "cold", "models": [Q, G, H]},
            ],
            "planner": {"mode": mode, "window_s": 60, "persistence": 1.0},
        }
    )


class State:
    def __init__(self) -> None:
        self.roles = {"hot0": ("hot", [Q]), "cold0": ("cold", [Q, G, H])}

    def pool_of(self, name: str) -> str:
        return self.roles[name][0]

    def serving_models(self, name: str) -> list[str]:
        return list(self.roles[name][1])


class Moves(Operator):
    """The operator's refusal rule with a move that only changes the fake state."""

    def __init__(self, state: State) -> None:
        self.automatic = None
        self.state, self.done = state, []

    async def move(self, name, to, model="", force=False, automatic=False):
        if self.automatic is not None and not automatic:
            raise ActionRefused(
                "failed_precondition", f"an automatic move is in progress ({self.automatic})"
            )
        assert self.automatic is not None  # the shell marks its move before it starts
        with pytest.raises(ActionRefused, match="automatic move is in progress"):
            await Operator.move(self, "cold0", "hot", G)  # a manual move meanwhile
        self.state.roles[name] = (to, [model] if to == "hot" else [Q])
        self.done.append((name, to, model))


class Router:
    def __init__(self) -> None:
        self.rows: list[SessionEntry] = []

    def profiles(self):
        return PROFILES

    def sessions(self):
        return tuple(self.rows)


class Clock:
    t = 1000.0

    def __call__(self) -> float:
        return self.t


def shell(mode: str = "auto"):
    state, metrics, router, clock = State(), GatewayMetrics(), Router(), Clock()
    op = Moves(state)
    s = PlannerShell(config(mode), state, op, router, metrics.registry, lambda _: None, clock)
    s._last = (clock.t, s._counters())
    return s, state, op, metrics, router, clock


def traffic(metrics: GatewayMetrics, router: Router, clock: Clock, rates: dict[str, float]):
    """One 60 s window of calls: 2K new and 30K cached prompt tokens, 300 out, 40 s per session."""
    for model, per_s in rates.items():
        n = int(per_s * 60)
        series = metrics.model(model)
        series.finished("stop").inc(n)
        series.prompt_tokens.inc(32_000 * n)
        series.generation_tokens.inc(300 * n)
        metrics.cached_tokens.labels(model, "device").inc(30_000 * n)
        router.rows += [
            SessionEntry(f"{model}-{i}", "cold0", model, 30_000, clock.t + 30)
            for i in range(max(int(per_s * 40), 1))
        ]
    clock.t += 60


def test_a_window_reads_the_counters_and_the_session_table():
    s, _, _, metrics, router, clock = shell()
    traffic(metrics, router, clock, {G: 0.5})
    w = s.window(clock.t)
    d = w.models[G]
    assert d.calls_per_s == pytest.approx(0.5) and d.output_tokens_per_s == pytest.approx(150)
    assert d.new_tokens_per_s == pytest.approx(1000) and d.prefix_tokens == pytest.approx(30_000)
    assert d.sessions == 20 and w.models[Q].calls_per_s == 0
    assert s.window(clock.t + 60).models[G].calls_per_s == 0  # deltas, not totals


def test_auto_carries_the_move_out_and_refuses_a_manual_one_meanwhile():
    s, state, op, metrics, router, clock = shell()
    for _ in range(3):
        traffic(metrics, router, clock, {Q: 0.02, G: 0.3, H: 0.1})
        asyncio.run(s.tick())
        if op.done:
            break
    assert op.done == [("hot0", "hot", G)]
    assert s.planner.current.role("hot0").models == (G,) and op.automatic is None
    event = s.history[0]
    assert event.outcome == "done" and event.by == "auto"
    assert any(w.startswith("move: gain") for w in event.why)
    reply = asyncio.run(s.plan(apply=False))
    assert reply.history[0].move.after == f"hot:{G}" and "hot0=hot:" + G in reply.assignment
    assert list(reply.history[0].why) == list(event.why)


def test_advise_proposes_and_apply_carries_it_out_once():
    s, state, op, metrics, router, clock = shell("advise")
    for _ in range(2):
        traffic(metrics, router, clock, {Q: 0.02, G: 0.3, H: 0.1})
        asyncio.run(s.tick())
    assert not op.done and s.proposal.move is not None
    reply = asyncio.run(s.plan(apply=True))
    assert reply.applied and op.done == [("hot0", "hot", G)]
    with pytest.raises(ActionRefused, match="no move proposed"):
        asyncio.run(s.plan(apply=True))  # the dwell holds G where it is now


def test_a_manual_move_is_taken_over_with_its_dwell():
    s, state, op, metrics, router, clock = shell("advise")
    state.roles["hot0"] = ("hot", [H])  # an operator pinned H by hand
    traffic(metrics, router, clock, {Q: 0.02, G: 0.3, H: 0.02})
    asyncio.run(s.tick())
    assert s.planner.current.role("hot0").models == (H,)
    assert s.planner.last_moved.keys() == {Q, H}
