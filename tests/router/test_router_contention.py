"""Time-sharing in Talaria's placement: the delay a call's slots impose on other models' calls
(`contention_s`), Eq. (2)'s demand net of what the replicas in rotation absorb, and holding a
call for an in-rotation replica when every alternative costs more than a round bound of waiting."""

from __future__ import annotations

import pytest

from talariad.router import DecisionKind, ModelResidency, ModelState
from talariad.types import KVState, Pool
from tests.router.router_factories import MODEL, PROFILE, Snaps, call, cand, router

OTHER = "x"
BOTH = (MODEL, OTHER)


def _two_models(**knobs):
    return router(profiles={MODEL: PROFILE, OTHER: PROFILE}, **knobs), Snaps()


def _busy_with_other(snaps, name, now, running=2, own=None, **fields):
    """`name` serves OTHER (running calls) and has MODEL resident, with `own` as its residency."""
    models = {
        MODEL: own or ModelResidency(ModelState.RESIDENT),
        OTHER: ModelResidency(ModelState.ACTIVE, running_calls=running),
    }
    return snaps(name, now, models=models, allowed=BOTH, **fields)


def _idle(snaps, name, now, **fields):
    models = {MODEL: ModelResidency(ModelState.RESIDENT)}
    return snaps(name, now, models=models, allowed=BOTH, **fields)


def test_a_model_new_to_a_busy_cold_instance_pays_for_the_calls_it_delays_there():
    r, snaps = _two_models()
    r.observe(_busy_with_other(snaps, "a", 0.0, running=2), 0.0)
    r.observe(_idle(snaps, "b", 0.0), 0.0)
    d = r.place(call("c1", session="s1", prompt=2000, max_tokens=50), 0.1)
    a, b = cand(d, "a"), cand(d, "b")
    assert a.total_s == pytest.approx(b.total_s)  # Eq. (1) alone cannot tell them apart
    assert a.contention_s == pytest.approx(2 * (a.total_s - a.queue_s)) and b.contention_s == 0.0
    assert d.instance == "b"


def test_a_call_of_a_model_already_working_there_adds_no_slot_and_pays_no_contention():
    r, snaps = _two_models()
    own = ModelResidency(ModelState.RESIDENT, running_calls=1)
    r.observe(_busy_with_other(snaps, "a", 0.0, own=own), 0.0)
    r.observe(_busy_with_other(snaps, "h", 0.0, pool=Pool.HOT), 0.0)
    d = r.place(call("c1", session="s1"), 0.1)
    assert cand(d, "a").contention_s == 0.0 and cand(d, "h").contention_s == 0.0


def test_recent_work_of_other_models_counts_when_nothing_of_theirs_runs_now():
    r, snaps = _two_models()
    r.observe(_idle(snaps, "a", 0.0), 0.0)
    r.observe(_idle(snaps, "b", 0.0), 0.0)
    placed = r.place(call("o1", session="o1", prompt=50_000, model=OTHER), 0.0)
    assert placed.instance == "a"  # ties go by name
    r.observe(_idle(snaps, "a", 6.0), 6.0)  # it finished: nothing runs there now
    r.observe(_idle(snaps, "b", 6.0), 6.0)
    d = r.place(call("c1", session="s1"), 6.0)
    a = cand(d, "a")
    assert 0.0 < a.contention_s < a.total_s - a.queue_s  # the share of the window it was busy
    assert cand(d, "b").contention_s == 0.0 and d.instance == "b"


def test_a_long_call_keeps_its_instance_busy_until_a_window_after_it_would_end():
    """Work counts from its forward until a window after its predicted end: a 25 s decode
    placed at t = 0 still makes its instance busy at t = 40 (booked at the forward, it left
    the 30 s window at t = 30 while the instance was still decoding it), and no longer at 56."""
    r, snaps = _two_models()
    r.observe(_idle(snaps, "a", 0.0), 0.0)
    r.observe(_idle(snaps, "b", 0.0), 0.0)
    long = r.place(call("o1", session="o1", prompt=1000, max_tokens=2500, model=OTHER), 0.0)
    assert long.instance == "a"  # 0.1 s prefill + 25 s decode: predicted to end at 25.1
    for now, busy in ((40.0, True), (56.0, False)):
        r.observe(_idle(snaps, "a", now), now)  # nothing runs or waits there in the snapshot
        r.observe(_idle(snaps, "b", now), now)
        assert (r._cost.spare_s("a", now) < 30.0) is busy
        d = r.place(call(f"c{now:g}", session=None), now)
        assert (cand(d, "a").contention_s > 0.0) is busy
        assert d.instance == ("b" if busy else "a")


def _burst_on_a(r, snaps, n, queued_tokens=0):
    """`a` serves MODEL (in rotation), `b` does not hold it; n calls of MODEL arrive at once."""
    a_models = {MODEL: ModelResidency(ModelState.ACTIVE, queued_tokens=queued_tokens)}
    r.observe(snaps("a", 0.0, models=a_models, round_load_s=0.1), 0.0)
    r.observe(snaps("b", 0.0, models={}), 0.0)
    return [
        r.place(call(f"c{i}", session=f"s{i}", prompt=20_000), 0.1 + 0.001 * i) for i in range(n)
    ]


def test_eq2_gain_counts_only_the_arrivals_the_rotation_cannot_absorb():
    # a long control window: the replica in rotation absorbs the burst's arrivals over it, so
    # only the calls queued there count, and a second replica gains less than it costs (counted
    # whole, the 10 s of arrivals would add 5 s of gain and pass Eq. (2))
    r, snaps = router(control_window_s=120.0, retire_window_s=120.0), Snaps()
    used = _burst_on_a(r, snaps, 5)
    assert all(d.instance == "a" for d in used)
    assert cand(used[-1], "b").reason == "eq2"


def test_work_already_queued_on_the_rotation_still_pays_for_a_replica():
    r, snaps = router(control_window_s=120.0, retire_window_s=120.0), Snaps()
    used = _burst_on_a(r, snaps, 12, queued_tokens=400_000)
    opened = [d for d in used if d.instance == "b"]
    assert opened and opened[0].kind is DecisionKind.REPLICA_OPEN


def test_a_call_waits_for_an_in_rotation_replica_rather_than_delay_another_models_calls():
    # a serves MODEL but is over its round budget; b is free but busy with OTHER's 8 calls, each
    # of which a call of MODEL there would delay by its whole time on the instance
    r, snaps = _two_models(overload="queue")
    own = ModelResidency(ModelState.ACTIVE, running_calls=1)
    r.observe(snaps("a", 0.0, models={MODEL: own}, allowed=BOTH, round_load_s=100.0), 0.0)
    r.observe(_busy_with_other(snaps, "b", 0.0, running=8), 0.0)
    d = r.place(call("c1", session="s1", prompt=2000, max_tokens=500), 0.1)
    assert cand(d, "a").reason == "round" and cand(d, "b").feasible
    assert d.instance == "a" and "in-rotation replica" in d.reason  # in a's queue, not b's rotation
    assert r.held() == ()


def test_a_cheap_alternative_is_not_held_back():
    r, snaps = _two_models()
    own = ModelResidency(ModelState.ACTIVE, running_calls=1)
    r.observe(snaps("a", 0.0, models={MODEL: own}, allowed=BOTH, round_load_s=100.0), 0.0)
    r.observe(_busy_with_other(snaps, "b", 0.0, running=1), 0.0)
    d = r.place(call("c1", session="s1", prompt=200, max_tokens=5), 0.1)
    assert d.instance == "b"  # its contention is under a round bound: no reason to wait


def test_another_models_live_lease_is_a_return_about_to_run_there():
    r, snaps = _two_models()
    r.observe(_idle(snaps, "a", 0.0), 0.0)
    r.observe(_idle(snaps, "b", 0.0), 0.0)
    # a session of OTHER was served on b: its lease says its return will run there shortly
    first = r.place(call("o1", session="o1", model=OTHER), 0.0)
    lease = r.completed("o1", first.instance, KVState.DEVICE, 1010, 0.5)
    assert lease is not None and lease.instance == "a"
    r.observe(_idle(snaps, "a", 0.6), 0.6)
    r.observe(_idle(snaps, "b", 0.6), 0.6)
    d = r.place(call("c1", session="s1"), 0.6)
    a = cand(d, "a")
    assert a.contention_s == pytest.approx(a.total_s - a.queue_s)  # one call to delay, not a share
    assert cand(d, "b").contention_s == 0.0 and d.instance == "b"


def test_a_replica_on_an_instance_busy_with_other_models_pays_nu_even_with_no_round_load():
    r, snaps = _two_models()
    absent = {OTHER: ModelResidency(ModelState.ACTIVE, running_calls=1)}
    r.observe(snaps("a", 0.0, models=absent, allowed=BOTH, round_load_s=0.0), 0.0)
    r.observe(snaps("b", 0.0, models={}, allowed=BOTH, round_load_s=0.0), 0.0)
    d = r.place(call("c1", session="s1"), 0.1)  # the model's first replica: Eq. (2) does not gate
    a, b = cand(d, "a"), cand(d, "b")
    assert a.needs_replica and b.needs_replica
    assert a.replica_s == pytest.approx(b.replica_s + 2.0)  # ν_m: it would time-share a
    assert d.instance == "b"


def test_an_idle_resident_replica_absorbs_a_new_session_so_no_second_replica_opens():
    # the model is resident on a, but no forward kept it busy over the window: a is its rotation
    # (nothing is retired then), and its spare capacity absorbs a large new call
    r, snaps = router(), Snaps()
    r.observe(snaps("a", 0.0, state=ModelState.RESIDENT), 0.0)
    r.observe(snaps("b", 0.0, models={}), 0.0)
    d = r.place(call("c1", session="s1", prompt=120_000), 0.1)  # 12 s of prefill
    assert d.instance == "a" and cand(d, "b").reason == "eq2"


def test_a_call_waits_in_the_queue_of_an_instance_short_of_kv_room_for_it():
    # a serves the model but has no HBM free for this call's KV now; b would need a replica that
    # Eq. (2) refuses: the call joins a's queue, whose scheduler admits it when KV room frees
    # (as for a round-budget refusal)
    r, snaps = router(overload="queue"), Snaps()
    r.observe(snaps("a", 0.0, hbm_free_bytes=0), 0.0)
    r.observe(snaps("b", 0.0, models={}), 0.0)
    d = r.place(call("c1", session="s1"), 0.1)
    assert cand(d, "a").reason == "hbm" and cand(d, "b").reason == "eq2"
    assert d.instance == "a" and "queued where the model is served" in d.reason
