"""Figure 4 with a scripted clock: a return arriving mid-slot is admitted by SP in the same slot
(with SP), or waits for its model's next slot (without SP); and the other two ablation switches."""

from __future__ import annotations

import dataclasses

import pytest

from talariad.cold_sched import ColdScheduler, Prefill, SchedKnobs, SubmittedCall, Switch, ablation
from talariad.types import KVState, SwitchPath
from tests.cold_sched.driver import PROFILE, Session, Turn, VirtualDriver

PROFILES = {"A": PROFILE, "B": PROFILE}


def figure4(config: str) -> VirtualDriver:
    sessions = [
        Session("bg", "A", [Turn(1000, 300)]),  # keeps A's slot decoding
        Session("s1", "A", [Turn(2000, 10), Turn(2400, 10, gap_s=0.39)]),
        Session("b1", "B", [Turn(1000, 300)]),
    ]
    driver = VirtualDriver(ColdScheduler(ablation(config), PROFILES, ["A", "B"]), sessions)
    driver.run()
    return driver


def switch_starts(driver: VirtualDriver) -> list[float]:
    return [st.start for st in driver.actions(Switch)]


def test_with_sp_a_mid_slot_return_is_admitted_in_the_same_slot():
    d = figure4("talaria")
    first, ret = d.completions["s1#0"], d.submitted["s1#1"]
    step = d.prefill_of("s1#1")
    assert step.action.tag == "SP" and step.active == "A"
    # same slot: no switch between the first call's completion and the return's prefill
    assert not [t for t in switch_starts(d) if first.finished_at <= t <= step.start]
    # TTFT excludes the rest of the round: the first token comes before A's slot even closes
    next_switch = min(t for t in switch_starts(d) if t > step.start)
    assert step.end < next_switch
    assert d.completions["s1#1"].ttft_s == pytest.approx(step.end - ret.arrived_at)
    assert d.completions["s1#1"].ttft_s < 0.5
    (item,) = step.action.calls
    assert item.cached_device_tokens == first.kv_len and item.restore_tokens == 0
    assert d.sched.sp_admitted == 1 and d.sched.sp_parked == 0


def test_without_sp_the_return_waits_for_the_models_next_slot():
    d = figure4("no-sp")
    ret = d.submitted["s1#1"]
    step = d.prefill_of("s1#1")
    assert step.action.tag == "P"
    between = [st.action for st in d.actions(Switch) if ret.arrived_at <= st.start <= step.start]
    assert [(s.from_model, s.to_model) for s in between] == [("A", "B"), ("B", "A")]
    back_to_a = max(st.end for st in d.actions(Switch) if st.start <= step.start)
    assert d.completions["s1#1"].ttft_s >= back_to_a - ret.arrived_at > 2.0
    # host KV is still on: the prefix saved at the switch is restored, not recomputed
    item = next(i for i in step.action.calls if i.call_id == "s1#1")
    assert item.restore_tokens == d.completions["s1#0"].kv_len and item.cached_device_tokens == 0
    assert d.sched.sp_admitted == 0 and d.sched.sp_parked == 1


def test_sp_ttft_is_far_below_no_sp_ttft():
    assert (
        figure4("talaria").completions["s1#1"].ttft_s * 10
        < figure4("no-sp").completions["s1#1"].ttft_s
    )


def test_round_only_is_the_same_scheduler_and_recomputes_lost_kv():
    sessions = [
        Session("s1", "A", [Turn(1500, 10), Turn(2400, 10, gap_s=0.39)]),
        Session("b1", "B", [Turn(500, 400)]),
    ]
    for config in ("round-only", "no-sp"):
        d = VirtualDriver(ColdScheduler(ablation(config), PROFILES, ["A", "B"]), sessions)
        d.run()
        assert type(d.sched) is ColdScheduler
        step = d.prefill_of("s1#1")
        crossed = [
            st
            for st in d.actions(Switch)
            if d.completions["s1#0"].finished_at <= st.start <= step.start
        ]
        assert crossed and step.action.tag == "P"
        (item,) = step.action.calls
        if config == "round-only":  # host KV off: what the switch released is recomputed
            assert (item.restore_tokens, item.cached_device_tokens, item.recompute_tokens) == (
                0,
                0,
                2400,
            )
            assert {st.action.path for st in crossed} == {SwitchPath.H2D}
        else:
            assert (item.restore_tokens, item.cached_device_tokens) == (1510, 0)


def test_d2d_switch_hint_and_prediction_follow_the_knob():
    for config, path in (("talaria", SwitchPath.D2D), ("h2d-only", SwitchPath.H2D)):
        switches = [s for s in figure4(config).switches() if s.from_model is not None]
        assert switches and {s.path for s in switches} == {path}
        assert {s.predicted_s for s in switches} == {PROFILE.switch_cost_s(path)}


def test_new_session_arriving_mid_slot_does_not_bypass_p():
    sessions = [Session("bg", "A", [Turn(1000, 200)]), Session("b1", "B", [Turn(1000, 200)])]
    late = SubmittedCall("new#0", "new", "A", 500, max_tokens=5, arrived_at=3.5)  # A's slot is open
    d = VirtualDriver(ColdScheduler(SchedKnobs(), PROFILES, ["A", "B"]), sessions, [late])
    d.run()
    step = d.prefill_of("new#0")
    assert step.action.tag == "P"
    assert [t for t in switch_starts(d) if late.arrived_at < t < step.start]


def test_return_whose_prefix_was_evicted_is_not_sp_eligible():
    d = VirtualDriver(
        ColdScheduler(SchedKnobs(), PROFILES, ["A", "B"]), [Session("bg", "A", [Turn(1000, 200)])]
    )
    d.run(until=3.5)  # A is open and decoding
    sched = d.sched
    d.submit(SubmittedCall("s9#1", "s9", "A", 800, 600, KVState.HOST, 5, d.now, True), d.now)
    sched.set_kv_state("s9", "A", KVState.MISSING, 0, now=d.now)  # the host copy was dropped
    assert sched.telemetry(d.now).queues["A"].sp_eligible == 0
    d.run()
    assert d.prefill_of("s9#1").action.tag == "P"


def test_host_restorable_return_is_admitted_by_sp_with_a_restore():
    knobs = dataclasses.replace(SchedKnobs(), max_sp_batch=4)
    d = VirtualDriver(
        ColdScheduler(knobs, PROFILES, ["A", "B"]), [Session("bg", "A", [Turn(1000, 200)])]
    )
    d.run(until=3.5)
    d.submit(SubmittedCall("h#1", "h", "A", 900, 800, KVState.HOST, 5, d.now, True), d.now)
    d.run()
    (item,) = d.prefill_of("h#1").action.calls
    assert d.prefill_of("h#1").action.tag == "SP"
    assert (item.restore_tokens, item.recompute_tokens, item.cached_device_tokens) == (800, 100, 0)


def test_an_emptied_slot_holds_for_a_return_within_sp_hold():
    sessions = [
        Session("s1", "A", [Turn(2000, 10), Turn(2400, 10, gap_s=0.39)]),
        Session("b1", "B", [Turn(1000, 300)]),
    ]
    held = VirtualDriver(ColdScheduler(SchedKnobs(), PROFILES, ["A", "B"]), sessions)
    held.run()
    step = held.prefill_of("s1#1")
    assert step.action.tag == "SP" and held.completions["s1#1"].ttft_s < 0.5
    # held 0.39 s for s1#1, then sp_hold_s for a third call that never comes
    assert held.sched.round_summaries[0].phase_s["hold"] == pytest.approx(0.39 + 1.0)
    knobs = dataclasses.replace(SchedKnobs(), sp_hold_s=0.0)
    closed = VirtualDriver(ColdScheduler(knobs, PROFILES, ["A", "B"]), sessions)
    closed.run()
    assert closed.prefill_of("s1#1").action.tag == "P"
    assert closed.completions["s1#1"].ttft_s > 2.0


def test_sp_stays_open_after_an_sp_batch_that_finished_at_prefill():
    """A return whose SP prefill also produced its last token leaves nothing to decode; the slot is
    still at a decode boundary, so the next mid-slot return is SP-admitted, not sent to P."""
    from talariad.cold_sched import ColdScheduler, Idle, SchedKnobs, SubmittedCall
    from talariad.types import KVState
    from tests.cold_sched.driver import PROFILE

    s = ColdScheduler(SchedKnobs(), {"a": PROFILE, "b": PROFILE}, ["a", "b"])
    done, now = {}, 0.0

    def drive(now, stop):
        while True:
            a = s.next_action(now)
            if isinstance(a, Idle):
                if a.until is None or stop():
                    return now
                now = a.until
                continue
            now += a.predicted_s
            done.update((c.call_id, c) for c in s.finish(a, now, a.predicted_s))
            if stop():
                return now

    for sid in ("s1", "s2"):
        s.submit(SubmittedCall(f"{sid}#0", sid, "a", 1000, max_tokens=2, arrived_at=0.0), 0.0)
    now = drive(now, lambda: {"s1#0", "s2#0"} <= done.keys()) + 0.1
    s.submit(SubmittedCall("s1#1", "s1", "a", 1100, 1002, KVState.DEVICE, 1, now, True), now)
    now = drive(now, lambda: "s1#1" in done) + 0.05
    s.submit(SubmittedCall("s2#1", "s2", "a", 1100, 1002, KVState.DEVICE, 5, now, True), now)
    drive(now, lambda: "s2#1" in done)
    assert done["s1#1"].admitted_by == "SP" and done["s2#1"].admitted_by == "SP"


def test_decode_steps_already_run_count_toward_the_protected_reservation():
    """Eq. (4) reserves d_m decode iterations per slot; steps already run in the slot count toward
    them (§3.4: Dfin spends the *remaining* protected budget). A return that arrives late in A's
    slot, after d_m steps ran and with clock left for its prefill, is admitted by SP in that slot."""
    sessions = [
        Session("bg", "A", [Turn(1000, 300)]),
        Session("s1", "A", [Turn(2000, 10), Turn(2400, 10, gap_s=2.3)]),
        Session("b1", "B", [Turn(1000, 300)]),
    ]
    d = VirtualDriver(ColdScheduler(ablation("talaria"), PROFILES, ["A", "B"]), sessions)
    d.run()
    ret = d.submitted["s1#1"]
    slot_open = max(st.end for st in d.actions(Switch) if st.end <= ret.arrived_at)
    plan = d.sched.round_summaries[0]
    step = d.prefill_of("s1#1")
    reserve_s = 40 * PROFILE.decode_step_s  # d_m = ceil(gamma * T_TTFT / T_TPOT) = 40
    left_at_arrival = slot_open + (8.0 - 0.3) / 2 - ret.arrived_at
    assert 0 < left_at_arrival < reserve_s  # the whole-slot reading would refuse it
    assert step.action.tag == "SP" and step.active == "A"
    assert not [t for t in switch_starts(d) if ret.arrived_at <= t <= step.start]
    assert plan.sp_admitted >= 1


@pytest.mark.parametrize("config", ["talaria", "no-hkvr", "round-only"])
def test_a_call_parked_at_a_slot_end_keeps_its_kv_on_device_in_every_configuration(config):
    """A call still decoding when the round bound ends its slot is parked; its rows stay on
    device across the other model's slot (Eq. (4) prices a sequence active throughout the round),
    so it resumes from device in its model's next slot: no recompute, no restore, in every
    configuration alike."""
    sessions = [Session("long", "A", [Turn(3000, 600)]), Session("b1", "B", [Turn(1000, 600)])]
    d = VirtualDriver(ColdScheduler(ablation(config), PROFILES, ["A", "B"]), sessions)
    d.run()
    done = d.completions["long#0"]
    assert done.parked_times >= 1 and done.park_cost_s == pytest.approx(
        PROFILE.prefill_s(1) * done.parked_times
    )  # each resumption recomputes only the one token that yields logits
    resumes = [st.action for st in d.actions(Prefill) if "long#0" in st.action.call_ids][1:]
    assert resumes and all(
        i.restore_tokens == 0 and i.recompute_tokens == 1 for a in resumes for i in a.calls
    )


def test_dfin_drains_in_flight_decode_within_the_round_bound():
    """A's share was planned with B still waiting; once B's call is gone (its client left), the
    round has budget left and Dfin spends it finishing A's in-flight call instead of parking it."""
    fast = dataclasses.replace(PROFILE, open_s=0.15)
    sessions = [Session("a", "A", [Turn(1000, 150)]), Session("b", "B", [Turn(1000, 5)])]
    d = VirtualDriver(
        ColdScheduler(ablation("talaria"), {"A": fast, "B": fast}, ["A", "B"]), sessions
    )
    d.run(until=1.0)
    share = d.sched.slot.plan.budget_s
    assert d.sched.slot.model == "A" and share < 4.5  # 150 tokens at 30 ms do not fit the share
    assert d.core.cancel("b#0", d.now)
    d.run()
    assert d.completions["a#0"].parked_times == 0
    a_decode = d.decode_steps_of("A")
    assert a_decode[-1].end - a_decode[0].start > share
    assert d.sched.round_summaries[0].wall_s <= d.sched.knobs.round_bound_s + 1e-6
