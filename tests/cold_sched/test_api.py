"""The driver-facing contract: validation, the action/finish protocol, tokens and stops, cancel,
KV-state updates, telemetry and the integrity check."""

from __future__ import annotations

import pytest

from talariad.cold_sched import (
    ColdScheduler,
    Decode,
    Idle,
    Prefill,
    SchedKnobs,
    SubmittedCall,
    Switch,
    ablation,
)
from talariad.types import KVState, SwitchPath
from tests.cold_sched.driver import PROFILE

PROFILES = {"A": PROFILE, "B": PROFILE}


def sched(**knobs) -> ColdScheduler:
    return ColdScheduler(SchedKnobs(**knobs), PROFILES, ["A", "B"])


def call(cid: str, model: str = "A", at: float = 0.0, **kw) -> SubmittedCall:
    return SubmittedCall(
        cid, kw.pop("session", cid), model, kw.pop("prompt", 1000), arrived_at=at, **kw
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [("gamma", 1.0), ("gamma", 0.0), ("ttft_target_s", 0.0), ("tpot_target_s", -1.0),
     ("max_batch", 0), ("max_sp_batch", 0), ("kv_capacity_tokens", 0), ("max_prefill_tokens", 0),
     ("sp_hold_s", -1.0), ("max_switch_share", 1.0)],
)  # fmt: skip
def test_knobs_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"SchedKnobs.{field}="):
        SchedKnobs(**{field: value})


def test_ablations_only_flip_the_three_switches():
    base = SchedKnobs(max_batch=7)
    assert ablation("round-only", base) == SchedKnobs(
        max_batch=7, sp=False, host_kv=False, d2d=False
    )
    assert ablation("talaria", base) == base
    with pytest.raises(ValueError, match="ablation 'fast'"):
        ablation("fast")


@pytest.mark.parametrize(
    ("bad", "field"),
    [(call("x", model="Z"), "model"), (call("x", prompt=0), "prompt_tokens"),
     (call("x", max_tokens=0), "max_tokens"), (call("x", prefix_tokens=2000), "prefix_tokens"),
     (call("x", prompt=2_000_000), "prompt_tokens")],
)  # fmt: skip
def test_submit_validation_names_the_field(bad, field):
    with pytest.raises(ValueError, match=f"SubmittedCall.{field}="):
        sched().submit(bad, 0.0)


def test_constructor_validation():
    with pytest.raises(ValueError, match="mode="):
        ColdScheduler(SchedKnobs(), PROFILES, ["A"], mode="hot")
    with pytest.raises(ValueError, match="no LatencyProfile"):
        ColdScheduler(SchedKnobs(), PROFILES, ["A", "C"])
    with pytest.raises(ValueError, match="distinct"):
        ColdScheduler(SchedKnobs(), PROFILES, ["A", "A"])


def test_protocol_errors():
    s = sched()
    s.submit(call("c1"), 0.0)
    with pytest.raises(ValueError, match="call_id"):
        s.submit(call("c1"), 0.0)
    first = s.next_action(0.0)
    assert first == Switch(None, "A", SwitchPath.D2D, PROFILE.open_s)
    with pytest.raises(RuntimeError, match="in flight"):
        s.next_action(0.1)
    with pytest.raises(ValueError, match="not the action in flight"):
        s.finish(Decode("A", []), 3.0, 3.0)
    with pytest.raises(ValueError, match="earlier"):
        s.finish(first, -1.0, 3.0)
    assert s.finish(first, 3.0, 3.0) == []
    assert s.finish(Idle(None), 3.0, 0.0) == []


def run_one(s: ColdScheduler, now: float, **finish_kw):
    action = s.next_action(now)
    return action, s.finish(action, now + 0.1, 0.1, **finish_kw)


def test_driver_reported_tokens_and_stops_decide_completion():
    s = sched()
    s.submit(call("c1", max_tokens=100), 0.0)
    s.submit(call("c2", max_tokens=100), 0.0)
    run_one(s, 0.0)  # switch
    prefill, _ = run_one(s, 0.1)
    assert isinstance(prefill, Prefill) and prefill.call_ids == ["c1", "c2"]
    decode, done = run_one(s, 0.2, tokens={"c1": 3, "c2": 0}, finished={"c1"})
    assert isinstance(decode, Decode) and [c.call_id for c in done] == ["c1"]
    assert (
        done[0].completion_tokens == 4
        and done[0].kv_len == 1004
        and done[0].kv_state is KVState.DEVICE
    )
    assert s.table.records["c2"].generated == 1
    s.check_integrity()


def test_cancel_waiting_and_refuse_in_flight():
    s = sched()
    s.submit(call("c1"), 0.0)
    s.submit(call("c2"), 0.0)
    assert s.cancel("c2", 0.0)
    switch, _ = run_one(s, 0.0)
    prefill = s.next_action(0.1)
    assert prefill.call_ids == ["c1"] and not s.cancel("c1", 0.1) and not s.cancel("nope", 0.1)
    s.finish(prefill, 0.2, 0.1)
    assert s.cancel("c1", 0.2)
    s.check_integrity()
    assert not s.table.records


def test_set_kv_state_and_telemetry():
    s = sched()
    s.submit(call("a1", at=0.0), 0.0)
    s.submit(call("b1", model="B", at=0.5), 0.5)
    s.set_kv_state("old", "A", KVState.HOST, 700, now=0.5)
    tel = s.telemetry(20.0)
    assert tel.queues["A"].waiting == 1 and tel.queues["B"].waiting == 1
    assert tel.queues["A"].oldest_wait_s == 20.0 and tel.ttft_at_risk == 2
    assert tel.active_model is None and tel.slot_phase is None and tel.round_remaining_s == 0.0
    assert ("old", "A", KVState.HOST, 700) in [
        (v.session_id, v.model, v.state, v.kv_len) for v in tel.sessions
    ]
    s.finish(s.next_action(20.0), 23.0, 3.0)  # first open of A
    tel = s.telemetry(23.0)
    assert tel.active_model == "A" and tel.slot_phase == "P"
    # this slot plus one slot and one switch for B, which still waits in this round
    plan = s.slot.plan
    assert tel.round_remaining_s == pytest.approx(
        2 * plan.budget_s + PROFILE.switch_cost_s(SwitchPath.D2D)
    )


def test_switch_demotes_device_kv_to_host_or_missing():
    for config, expected in (("talaria", KVState.HOST), ("no-hkvr", KVState.MISSING)):
        s = ColdScheduler(ablation(config), PROFILES, ["A", "B"])
        s.submit(call("a1", max_tokens=1), 0.0)
        s.submit(call("b1", model="B", max_tokens=1), 0.0)
        now = 0.0
        while (action := s.next_action(now)) != Idle(None):
            if isinstance(action, Idle):  # A's slot holds for a1's return, up to sp_hold_s
                assert action.until == pytest.approx(now + s.knobs.sp_hold_s)
                now = action.until
                continue
            now += 0.1
            path = SwitchPath.PARTIAL if isinstance(action, Switch) else None
            s.finish(action, now, 0.1, switch_path=path)
        assert s.ledger.get("a1", "A").state is expected
        assert s.ledger.get("b1", "B").state is KVState.DEVICE
        assert s.telemetry(now).measured_switch_s == {"B:partial": 0.1}


def test_check_integrity_catches_a_corrupt_ledger():
    s = sched()
    s.submit(call("c1"), 0.0)
    s.check_integrity()
    s.table.running.append("c1")  # listed as waiting and running at once
    with pytest.raises(RuntimeError, match="call table"):
        s.check_integrity()


def test_check_integrity_catches_a_device_total_out_of_step():
    s = sched()
    s.ledger.set("s1", "A", KVState.DEVICE, 100, 0.0)
    s.check_integrity()
    s.ledger.entries[("s1", "A")].kv_len = 300  # changed behind the ledger's totals
    with pytest.raises(RuntimeError, match="device tokens"):
        s.check_integrity()


def drive(s: ColdScheduler, step_s: float = 0.03) -> tuple[list, dict]:
    """Run every action to the end, each taking `step_s`; (actions, completions by call id)."""
    now, actions, done = 0.0, [], {}
    while (action := s.next_action(now)) != Idle(None):
        if isinstance(action, Idle):
            now = action.until
            continue
        actions.append(action)
        now += step_s
        path = action.path if isinstance(action, Switch) else None
        done.update({c.call_id: c for c in s.finish(action, now, step_s, switch_path=path)})
    return actions, done


def test_a_slot_end_with_no_other_model_waiting_runs_the_batch_on():
    """600 tokens at 0.03 s outlast two round bounds of 8 s: the slot closes, but with no other
    model waiting the next slot is A's again, so the call decodes on without a park or a second
    prefill."""
    s = sched()
    s.submit(call("a1", max_tokens=600), 0.0)
    actions, done = drive(s)
    assert len(s.round_summaries) >= 3  # the slot did close at the round bound
    assert s.decode_parked == 0 and done["a1"].parked_times == 0
    assert [type(a) for a in actions].count(Prefill) == 1
    assert done["a1"].completion_tokens == 600


def test_a_slot_end_parks_the_batch_when_another_model_waits():
    s = sched()
    s.submit(call("a1", max_tokens=600), 0.0)
    s.submit(call("b1", model="B", max_tokens=600), 0.0)
    actions, done = drive(s)
    assert s.decode_parked >= 2 and done["a1"].parked_times >= 1
    assert any(isinstance(a, Switch) for a in actions)
    assert {c.completion_tokens for c in done.values()} == {600}
