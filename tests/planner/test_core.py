"""The planner core: its delay model, its moves' prices, hysteresis and dwell, and the property
that no sequence of demand windows strands a model or moves one twice inside its dwell."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talariad.perfmodel.profiles import load_set
from talariad.planner import (
    Assignment,
    DemandMeter,
    DemandWindow,
    ModelDemand,
    Planner,
    PlannerKnobs,
    Role,
    Seat,
    assignments,
    moved_models,
)
from talariad.types import Pool

Q, G, H = "qwen3-235b", "glm5-nvfp4", "qwen3.5-122b"
MODELS = (Q, G, H)
PROFILES = load_set("paper-tp8").profiles()
SEATS = (Seat("hot0", (Q,)), Seat("cold0", MODELS))
SHIPPED = Assignment.of({"hot0": Role.hot(Q), "cold0": Role.cold(MODELS)})


def demand(calls_per_s: float) -> ModelDemand:
    """Agent-shaped calls: 2K new tokens, 300 out, 30K reused prefix, 40 s of calls per session."""
    c = calls_per_s
    return ModelDemand(c, 2000 * c, 300 * c, 40 * c, 30_000)


def window(t: float, **rates: float) -> DemandWindow:
    names = {"q": Q, "g": G, "h": H}
    return DemandWindow(t - 60, t, {names[k]: demand(v) for k, v in rates.items()})


def planner(knobs: PlannerKnobs | None = None, seats=SEATS, current=SHIPPED) -> Planner:
    return Planner(seats, MODELS, PROFILES, current, knobs or PlannerKnobs())


def test_hot_model_cooling_while_a_cold_one_heats_moves_the_hot_instance():
    p = planner()
    for t in (60, 120):
        p.observe(window(t, q=0.02, g=0.3, h=0.02))
    prop = p.propose(120)
    assert prop.move is not None
    assert (prop.move.instance, prop.move.after) == ("hot0", Role.hot(G))
    assert prop.gain_s > PlannerKnobs().margin * prop.move.cost.total_s
    assert prop.delay_after_s < prop.delay_now_s
    assert any("gain" in r and "cost" in r for r in prop.reasons)
    c = prop.move.cost
    assert c.load_s == PROFILES[G].open_s  # the weights it loads
    assert c.drain_s > 0 and c.kv_s > 0  # Q's calls drain, Q's sessions lose their device KV


def test_a_burst_the_slow_estimate_does_not_confirm_holds():
    p = planner()
    for t in range(60, 1260, 60):
        p.observe(window(t, q=0.3, g=0.02, h=0.02))
    for t in (1260, 1320, 1380):  # a burst of G: the fast estimate says move, the slow one not yet
        p.observe(window(t, q=0.02, g=0.3, h=0.02))
    prop = p.propose(1380)
    assert prop.move is None
    assert "not yet a lasting shift" in prop.reasons[-1]
    for t in range(1440, 2400, 60):  # the shift lasts: the slow estimate follows
        p.observe(window(t, q=0.02, g=0.3, h=0.02))
        if (prop := p.propose(t)).move is not None:
            break
    assert prop.move is not None and prop.move.after == Role.hot(G)


def test_matching_demand_holds_and_says_why():
    p = planner()
    for t in (60, 120):
        p.observe(window(t, q=0.3, g=0.02, h=0.02))
    prop = p.propose(120)
    assert prop.move is None
    assert any(r.startswith("hold") for r in prop.reasons)


def test_no_proposal_during_warmup_or_a_move():
    p = planner()
    p.observe(window(60, q=0.02, g=0.3, h=0.02))
    assert p.propose(60).move is None
    p.observe(window(120, q=0.02, g=0.3, h=0.02))
    move = p.propose(120).move
    p.begin(move, 120)
    p.observe(window(180, q=0.02, g=0.3, h=0.02))
    assert p.propose(180).move is None
    with pytest.raises(ValueError):
        p.begin(move, 180)
    p.finish(move, 190)
    assert p.current.role("hot0") == Role.hot(G)


def test_dwell_keeps_a_moved_model_in_place():
    knobs = PlannerKnobs(dwell_s=600, persistence=1.0)  # one timescale: dwell alone holds it
    p = planner(knobs)
    for t in (60, 120):
        p.observe(window(t, g=0.3, q=0.02, h=0.02))
    move = p.propose(120).move
    p.begin(move, 120)
    p.finish(move, 125)
    for t in range(180, 700, 60):  # demand leaves G for H: pinning H would move G again
        p.observe(window(t, q=0.02, g=0.02, h=0.3))
        prop = p.propose(t)
        assert prop.move is None
        assert any(r.startswith(f"{G} moved") for r in prop.reasons)
    p.observe(window(780, q=0.02, g=0.02, h=0.3))
    assert p.propose(780).move is not None


def test_the_only_taker_never_moves():
    seats = (Seat("hot0", (Q,)), Seat("cold0", (G, H)))
    current = Assignment.of({"hot0": Role.hot(Q), "cold0": Role.cold((G, H))})
    p = planner(seats=seats, current=current)
    for t in (60, 120):
        p.observe(window(t, q=0.0, g=0.4, h=0.01))
    prop = p.propose(120)
    assert prop.move is None
    assert any("would have no instance" in r for r in prop.reasons)


def test_an_overloaded_cold_round_costs_more_than_a_hot_instance():
    d = {Q: demand(0.05), G: demand(0.3), H: demand(0.02)}
    p = planner()
    p.demand = d
    pinned_g = SHIPPED.with_role("hot0", Role.hot(G))
    assert p.delay(pinned_g).total_s_per_s < p.delay(SHIPPED).total_s_per_s


def test_assignments_cover_every_model():
    found = assignments(SEATS, MODELS)
    assert SHIPPED in found
    for a in found:
        assert not a.unserved(MODELS)
    assert Assignment.of({"hot0": Role.hot(Q), "cold0": Role.hot(G)}) not in found


def test_moved_models():
    assert moved_models(Role.hot(Q), Role.hot(G)) == {Q, G}
    assert moved_models(Role.cold((Q, G)), Role.cold((Q, H))) == {G, H}
    assert moved_models(Role.hot(Q), Role.cold((Q, G))) == {Q, G}
    assert moved_models(Role.hot(Q), Role.cold((Q,))) == set()  # alone, it runs alike


def test_meter_windows_count_calls_per_second():
    m = DemandMeter(MODELS, 0.0)
    m.call(Q, "s1", 1000, 5000, 100)
    m.call(Q, "s2", 3000, 0, 300)
    m.call("unknown", "s3", 1, 1, 1)
    m.sample(G, 2, round_s=6.0)
    w = m.window(10.0)
    assert w.models[Q].calls_per_s == pytest.approx(0.2)
    assert w.models[Q].new_tokens_per_s == pytest.approx(400)
    assert w.models[Q].sessions == 2 and w.models[Q].prefix_tokens == 2500
    assert w.models[G].waiting == 2 and w.models[G].round_s == 6.0
    assert m.window(20.0).models[Q].calls_per_s == 0


# ---- the property -------------------------------------------------------------------------

RATES = st.sampled_from([0.0, 0.01, 0.05, 0.15, 0.3, 0.6])
WINDOWS = st.lists(st.tuples(RATES, RATES, RATES, st.booleans()), min_size=1, max_size=30)
SEAT_SETS = st.sampled_from(
    [
        (SEATS, SHIPPED),
        (
            (Seat("c0", MODELS), Seat("c1", MODELS)),
            Assignment.of({"c0": Role.cold(MODELS), "c1": Role.cold(MODELS)}),
        ),
        (
            (Seat("h0", (Q,)), Seat("h1", (G,)), Seat("c0", MODELS)),
            Assignment.of({"h0": Role.hot(Q), "h1": Role.hot(G), "c0": Role.cold(MODELS)}),
        ),
        (
            (Seat("hot0", (Q,)), Seat("cold0", (G, H))),
            Assignment.of({"hot0": Role.hot(Q), "cold0": Role.cold((G, H))}),
        ),
    ]
)


@settings(max_examples=150, deadline=None)
@given(WINDOWS, SEAT_SETS, st.sampled_from([0.0, 0.5, 2.0]))
def test_no_window_sequence_strands_a_model_or_moves_one_inside_its_dwell(windows, layout, margin):
    seats, start = layout
    knobs = PlannerKnobs(dwell_s=300, margin=margin, min_gain=0.0, warmup_windows=1)
    p = Planner(seats, MODELS, PROFILES, start, knobs)
    moved_at: dict[str, float] = {}
    t = 0.0
    for q, g, h, slow in windows:
        t += 60.0
        p.observe(window(t, q=q, g=g, h=h))
        prop = p.propose(t)
        if prop.move is None:
            continue
        move = prop.move
        # during the move the instance takes no calls: every model keeps another taker
        assert not p.current.unserved(MODELS, without=move.instance)
        for m in move.models:
            assert t - moved_at.get(m, -1e9) >= knobs.dwell_s, f"{m} moved twice within dwell"
            moved_at[m] = t
        p.begin(move, t)
        p.finish(move, t + (90.0 if slow else 5.0), ok=True)
        assert not p.current.unserved(MODELS)
        assert all(r.pool is Pool.HOT or r.models for _, r in p.current.roles)
