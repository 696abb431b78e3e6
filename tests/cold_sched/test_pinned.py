"""Pinned mode (hot pool): one model, continuous batching, P and decode interleave, no switch."""

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
)
from tests.cold_sched.driver import PROFILE, Session, Turn, VirtualDriver


def pinned(**knobs) -> ColdScheduler:
    return ColdScheduler(SchedKnobs(**knobs), {"A": PROFILE}, ["A"], mode="pinned")


def call(cid: str, at: float, prompt: int = 1000, max_tokens: int = 50) -> SubmittedCall:
    return SubmittedCall(cid, cid, "A", prompt, max_tokens=max_tokens, arrived_at=at)


def test_prefill_and_decode_interleave_without_switches():
    d = VirtualDriver(pinned(), calls=[call("c1", 0.0), call("c2", 0.5)])
    d.run()
    kinds = [(type(s.action).__name__, tuple(s.action.call_ids)) for s in d.steps]
    first_p2 = kinds.index(("Prefill", ("c2",)))
    assert kinds[0] == ("Prefill", ("c1",)) and kinds[1] == ("Decode", ("c1",))
    assert (
        first_p2 > 1 and d.completions["c1"].finished_at > d.steps[first_p2].end
    )  # joined mid-decode
    assert kinds[first_p2 + 1] == ("Decode", ("c1", "c2"))
    assert not d.actions(Switch) and d.sched.telemetry(d.now).mode == "pinned"
    tel = d.sched.telemetry(d.now)
    assert tel.slot_phase is None and not d.sched.round_summaries
    assert tel.phase_totals_s["P"] > 0 and tel.phase_totals_s["D"] > 0


def test_continuation_reuses_the_device_prefix():
    d = VirtualDriver(pinned(), [Session("s", "A", [Turn(1000, 10), Turn(1500, 10, gap_s=0.2)])])
    d.run()
    (item,) = d.prefill_of("s#1").action.calls
    assert item.cached_device_tokens == d.completions["s#0"].kv_len == 1010
    assert item.recompute_tokens == 490 and item.restore_tokens == 0


def test_running_batch_and_kv_capacity_are_respected():
    calls = [call(f"c{i}", 0.0, prompt=1000, max_tokens=20) for i in range(5)]
    for knobs, cap in (({"max_batch": 2}, 2), ({"kv_capacity_tokens": 3100}, 3)):
        d = VirtualDriver(pinned(**knobs), calls=calls)
        d.run()
        assert max(len(s.action.call_ids) for s in d.actions(Decode)) == cap
        assert len(d.completions) == 5


def test_idle_when_empty_and_a_single_model_only():
    sched = pinned()
    assert sched.next_action(0.0) == Idle(None)
    with pytest.raises(ValueError, match="pinned mode serves exactly one model"):
        ColdScheduler(SchedKnobs(), {"A": PROFILE, "B": PROFILE}, ["A", "B"], mode="pinned")


def test_max_tokens_one_completes_at_prefill():
    sched = pinned()
    sched.submit(call("c", 0.0, max_tokens=1), 0.0)
    action = sched.next_action(0.0)
    assert isinstance(action, Prefill)
    (done,) = sched.finish(action, 0.1, 0.1)
    assert done.completion_tokens == 1 and done.ttft_s == pytest.approx(0.1)
    assert sched.next_action(0.1) == Idle(None)
