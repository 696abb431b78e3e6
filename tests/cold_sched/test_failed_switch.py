"""A switch that released the outgoing model but could not open the target (an SGLang resume
refused for memory): nothing is resident, the target's calls stay queued, the rotation moves on."""

from __future__ import annotations

from talariad.cold_sched import ColdScheduler, Prefill, SchedKnobs, SubmittedCall, Switch
from talariad.types import KVState
from tests.cold_sched.driver import PROFILE


def _sched() -> ColdScheduler:
    return ColdScheduler(SchedKnobs(), {m: PROFILE for m in "abc"}, ["a", "b", "c"])


def _submit(s: ColdScheduler, cid: str, model: str, now: float) -> None:
    s.submit(
        SubmittedCall(
            call_id=cid, session_id=cid, model=model, prompt_tokens=10, max_tokens=1, arrived_at=now
        ),
        now,
    )


def test_failed_switch_skips_the_slot_and_keeps_the_calls():
    s = _sched()
    for cid, model in (("a1", "a"), ("b1", "b"), ("c1", "c")):
        _submit(s, cid, model, 0.0)
    first = s.next_action(0.0)
    assert isinstance(first, Switch) and first.to_model == "a"
    s.finish(first, 1.0, 1.0)
    t = 1.0
    while not isinstance(action := s.next_action(t), Switch):
        t += 0.1
        s.finish(action, t, 0.1)
    assert (action.from_model, action.to_model) == ("a", "b")
    s.finish(action, t + 1, 1.0, switch_failed=True)
    assert s.active is None and s.failed_switches == 1 and s.slot is None
    assert s.ledger.get("a1", "a").state is KVState.HOST  # a was released all the same
    assert list(s.table.waiting["b"]) == ["b1"]  # re-queued, not lost
    nxt = s.next_action(t + 1)
    assert isinstance(nxt, Switch) and (nxt.from_model, nxt.to_model) == (
        None,
        "c",
    )  # b's slot skipped
    s.finish(nxt, t + 2, 1.0)
    assert isinstance(s.next_action(t + 2), Prefill)
    s.check_integrity()
