"""Budgets: Eq. (4) decode share, Eq. (5) round bound, and how shortfalls are reported."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talariad.cold_sched import (
    ColdScheduler,
    Decode,
    Prefill,
    SchedKnobs,
    SubmittedCall,
    Switch,
    ablation,
    decode_iterations,
    plan_slot,
)
from talariad.types import KVState, SwitchPath
from tests.cold_sched.driver import PROFILE, Session, Turn, VirtualDriver

FAST_OPEN = dataclasses.replace(PROFILE, open_s=0.15)  # first open costs what a D2D switch does


def decode_share_ok(d: int, round_s: float, tpot_s: float, step_s: float) -> bool:
    """Eq. (4) as written, the oracle: d_m * (T_TPOT - t_D) >= U_m."""
    return d * (tpot_s - step_s) >= round_s - d * step_s - 1e-9


@settings(max_examples=60, deadline=None)
@given(
    round_s=st.floats(0.5, 60.0),
    tpot=st.floats(0.02, 1.0),
    frac=st.floats(0.01, 0.99),
)
def test_decode_iterations_is_the_least_d_satisfying_eq4(round_s, tpot, frac):
    step = tpot * frac
    d = decode_iterations(round_s, tpot, step)
    assert d is not None and decode_share_ok(d, round_s, tpot, step)
    assert d == 1 or not decode_share_ok(d - 1, round_s, tpot, step)


def test_tpot_at_or_below_the_decode_step_is_infeasible():
    assert decode_iterations(8.0, 0.03, 0.03) is None
    assert decode_iterations(8.0, 0.02, 0.03) is None
    assert decode_iterations(8.0, 0.2, 0.03) == 40


def test_plan_slot_shares_the_round_bound_after_switches():
    plan = plan_slot(8.0, 2, 0.3, 0.2, 0.03)
    assert plan.budget_s == pytest.approx(3.85) and plan.decode_iters == 40
    assert plan.decode_reserve_s == pytest.approx(1.2) and plan.prefill_budget_s == pytest.approx(
        2.65
    )
    assert plan.feasible
    assert plan_slot(8.0, 3, 0.3, 0.1, 0.03).feasible  # 3 x 80 steps x 30 ms + 0.3 s = 7.5 s
    assert not plan_slot(8.0, 3, 0.3, 0.08, 0.03).feasible  # 3 x 100 steps x 30 ms + 0.3 s > 8 s


def test_switches_above_their_share_grow_the_round_and_mark_it_infeasible():
    plan = plan_slot(8.0, 2, 6.0, 0.2, 0.03, max_switch_share=0.5)
    assert not plan.feasible
    assert plan.budget_s == pytest.approx(3.0) and plan.decode_iters == 60  # round 12 s


def slot_steps(d: VirtualDriver, model: str, index: int = 0) -> list:
    """Actions of the index-th slot of `model`: after the switch into it, before the next one."""
    switches = d.actions(Switch)
    opened = [k for k, s in enumerate(switches) if s.action.to_model == model][index]
    start = switches[opened].end
    end = switches[opened + 1].start if opened + 1 < len(switches) else float("inf")
    return [s for s in d.steps if start <= s.start < end]


def test_a_burst_of_returns_never_pushes_decode_below_its_reservation():
    knobs = SchedKnobs()
    sched = ColdScheduler(knobs, {"A": FAST_OPEN, "B": FAST_OPEN}, ["A", "B"])
    sessions = [Session("bg", "A", [Turn(1000, 2000)]), Session("b1", "B", [Turn(1000, 200)])]
    burst = [
        SubmittedCall(
            f"r{i}#1", f"r{i}", "A", 20_000, 19_000, KVState.HOST, 4, 0.5 + 0.01 * i, True
        )
        for i in range(40)
    ]
    d = VirtualDriver(sched, sessions, burst)
    d.run(until=9.0)
    slot = slot_steps(d, "A", 0)  # A's first slot opens at 0.15 s; the burst lands in it
    plan = plan_slot(knobs.round_bound_s, 2, 0.3, knobs.tpot_target_s, PROFILE.decode_s(1))
    sp = [s.action for s in slot if isinstance(s.action, Prefill) and s.action.tag == "SP"]
    assert sp and all(len(a.calls) <= knobs.max_sp_batch for a in sp)
    decodes = [s for s in slot if isinstance(s.action, Decode)]
    assert len(decodes) >= plan.decode_iters == 40
    assert (
        sum(s.end - s.start for s in slot if isinstance(s.action, Prefill))
        <= plan.prefill_budget_s + 1e-9
    )
    assert slot[-1].end - slot[0].start <= plan.budget_s + 1e-9
    assert d.sched.telemetry(d.now).sp_parked > 0  # the rest waits, it is not squeezed in


def test_p_admits_all_waiting_work_and_reports_the_overrun_as_risk_instead_of_deferring():
    """§3.4: P admits the ordinary work waiting when the slot opens; prefill is best-effort, and a
    round pushed past Eq. (5) is reported as deadline risk, never rolled into a later round."""
    knobs = SchedKnobs()
    sched = ColdScheduler(knobs, {"A": FAST_OPEN, "B": FAST_OPEN}, ["A", "B"])
    sessions = [Session(f"a{i}", "A", [Turn(5000, 30)]) for i in range(30)]
    sessions.append(Session("b1", "B", [Turn(1000, 300)]))
    d = VirtualDriver(sched, sessions)
    d.run()
    first_slot = slot_steps(d, "A")
    first_p = [s.action for s in first_slot if isinstance(s.action, Prefill)]
    assert sum(len(a.calls) for a in first_p) == 30  # the whole queue, in its first slot
    tel = sched.telemetry(d.now)
    assert tel.risk_deferred == 0 and all(r.deferred == 0 for r in sched.round_summaries)
    assert tel.risk_prefill_shortfall > 0 and tel.risk_round_overrun > 0
    assert len(d.completions) == 31


def test_an_infeasible_round_plan_and_its_overrun_are_counted():
    slow = dataclasses.replace(
        PROFILE, switch_s={SwitchPath.D2D: 5.0, SwitchPath.H2D: 5.0}, open_s=5.0
    )
    sched = ColdScheduler(SchedKnobs(), {"A": slow, "B": slow}, ["A", "B"])
    sessions = [Session("a", "A", [Turn(1000, 100)]), Session("b", "B", [Turn(1000, 100)])]
    d = VirtualDriver(sched, sessions)
    d.run()
    tel = sched.telemetry(d.now)
    assert tel.risk_round_bound > 0 and tel.risk_round_overrun > 0
    assert len(d.completions) == 2


def test_tpot_infeasible_model_is_reported():
    slow_decode = dataclasses.replace(FAST_OPEN, decode_step_s=0.25)
    sched = ColdScheduler(SchedKnobs(), {"A": slow_decode, "B": FAST_OPEN}, ["A", "B"])
    d = VirtualDriver(sched, [Session("a", "A", [Turn(100, 5)]), Session("b", "B", [Turn(100, 5)])])
    d.run()
    assert sched.telemetry(d.now).tpot_infeasible == ["A"]
    assert len(d.completions) == 2


def test_round_summary_keeps_wall_active_switch_and_phases_apart():
    sched = ColdScheduler(ablation("talaria"), {"A": FAST_OPEN, "B": FAST_OPEN}, ["A", "B"])
    sessions = [
        Session("s", "A", [Turn(3000, 20), Turn(3500, 20, gap_s=0.3)]),
        Session("bg", "A", [Turn(500, 400)]),
        Session("b", "B", [Turn(1000, 100)]),
    ]
    d = VirtualDriver(sched, sessions)
    d.run()
    r0 = sched.round_summaries[0]
    assert r0.models == ["A", "B"] and r0.switches == 2
    assert r0.wall_s == pytest.approx(r0.active_s + r0.switch_s)
    assert r0.switch_s == pytest.approx(0.3)
    assert r0.wall_s == pytest.approx(r0.ended_at - r0.started_at)
    assert r0.sp_admitted == 1 and r0.phase_s["SP"] > 0 and r0.phase_s["P"] > 0
    assert r0.phase_s["Dfin"] > 0 and r0.phase_s["D1"] > 0
    assert r0.phase_s["restore"] == 0.0  # the return's prefix was still on device
    assert r0.decode_parked >= 1  # bg did not finish in A's slot


def test_an_over_budget_recompute_still_gets_its_protected_decode_steps():
    """Round-only drops a parked call's KV at every switch; its recompute overruns the slot's
    prefill budget, yet the slot still runs its d_m reserved decode steps (Eq. 4), so the call
    makes real progress each round instead of one token per round."""
    knobs = ablation("round-only")
    sched = ColdScheduler(knobs, {"A": PROFILE, "B": PROFILE}, ["A", "B"])
    long = Session("long", "A", [Turn(60_000, 400)])  # 6 s of prefill: over any slot's budget
    other = Session("b", "B", [Turn(1000, 30, gap_s=0.1)] * 60)
    d = VirtualDriver(sched, [long, other])
    d.run(until=600.0)
    done = d.completions.get("long#0")
    assert done is not None and done.completion_tokens == 400
    step = PROFILE.decode_s(1)
    plan = plan_slot(
        knobs.round_bound_s, 2, 2 * PROFILE.switch_cost_s(SwitchPath.H2D), knobs.tpot_target_s, step
    )
    a_prefills = [s for s in d.actions(Prefill) if "long#0" in s.action.call_ids]
    assert len(a_prefills) <= 400 // plan.decode_iters + 1  # one recompute per slot it decoded in
