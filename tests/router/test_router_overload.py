"""Overload policies (queue / reject / spill) and knob validation."""

from __future__ import annotations

import pytest

from talariad.router import POLICIES, DecisionKind, Router, RouterKnobs
from tests.router.router_factories import Snaps, call, cand, cluster, router


def _full(**knobs):
    """Two instances whose rounds are full (round_load 9 s > γ·TTFT 8 s), neither serving the
    model yet (a replica must open, and neither round admits the open)."""
    r, snaps = router(**knobs), Snaps()
    cluster(r, snaps, ("a", "b"), round_load_s=9.0, round_remaining_s=0.7, models={})
    return r, snaps


def test_reject_gives_retry_after():
    r, _ = _full(overload="reject")
    d = r.place(call("c1"), 0.1)
    assert d.kind is DecisionKind.OVERLOAD_REJECT and d.instance is None
    assert d.retry_after_s == pytest.approx(0.7) and len(d.candidates) == 2
    assert r.in_flight() == {}


def test_spill_goes_to_cheapest_ignoring_feasibility():
    r, snaps = router(overload="spill"), Snaps()
    r.observe(snaps("a", 0.0, round_load_s=9.0), 0.0)
    r.observe(snaps("b", 0.0, round_load_s=9.0, round_remaining_s=2.0), 0.0)
    d = r.place(call("c1"), 0.1)
    assert d.kind is DecisionKind.OVERLOAD_SPILL and d.instance == "a"
    assert not any(c.feasible for c in d.candidates) and r.in_flight() == {"c1": "a"}


def test_spill_with_nothing_eligible_rejects():
    r, snaps = router(overload="spill"), Snaps()
    r.observe(snaps("a", 0.0, healthy=False), 0.0)
    assert r.place(call("c1"), 0.1).kind is DecisionKind.OVERLOAD_REJECT


def test_queue_holds_then_places_when_capacity_returns():
    r, snaps = _full(overload="queue")
    held = r.place(call("c1"), 0.1)
    assert held.kind is DecisionKind.OVERLOAD_QUEUE and r.held() == ("c1",)
    assert held.retry_after_s == pytest.approx(0.7)
    r.observe(snaps("b", 0.5), 0.5)  # b's round drained
    d = r.place(call("c1"), 0.8)
    assert d.kind is DecisionKind.COST and d.instance == "b" and r.held() == ()


def test_queue_times_out_into_reject():
    r, _ = _full(overload="queue", queue_timeout_s=1.0)
    assert r.place(call("c1"), 0.1).kind is DecisionKind.OVERLOAD_QUEUE
    wait = r.place(call("c1"), 0.9)
    assert wait.kind is DecisionKind.OVERLOAD_QUEUE and wait.retry_after_s == pytest.approx(0.2)
    d = r.place(call("c1"), 1.1)
    assert d.kind is DecisionKind.OVERLOAD_REJECT and "timeout" in d.reason and r.held() == ()


def test_queue_is_bounded():
    r, _ = _full(overload="queue", queue_limit=2)
    kinds = [r.place(call(f"c{i}", session=f"s{i}"), 0.1).kind for i in range(3)]
    assert kinds == [DecisionKind.OVERLOAD_QUEUE] * 2 + [DecisionKind.OVERLOAD_REJECT]
    assert r.held() == ("c0", "c1")
    r.check_integrity()


def test_expire_drops_held_calls_past_timeout():
    r, _ = _full(overload="queue", queue_timeout_s=1.0)
    r.place(call("c1", session="s1"), 0.1)
    r.place(call("c2", session="s2"), 0.6)
    assert r.expire(1.2).timed_out_calls == ("c1",) and r.held() == ("c2",)


def test_failed_removes_held_call():
    r, _ = _full(overload="queue")
    r.place(call("c1"), 0.1)
    assert r.failed("c1", 0.2) and r.held() == ()


def test_knob_defaults_follow_the_paper():
    k = RouterKnobs()
    assert (k.tau_s, k.gamma, k.ttft_target_s) == (1.0, 0.8, 10.0)
    assert k.round_budget_s == pytest.approx(8.0) and k.leases_enabled


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tau_s", -1.0),
        ("gamma", 1.0),
        ("gamma", 0.0),
        ("ttft_target_s", 0.0),
        ("admission_unit_s", -0.1),
        ("replica_penalty_s", float("nan")),
        ("control_window_s", 0),
        ("staleness_s", -1),
        ("heartbeat_s", 0),
        ("overload", "drop"),
        ("queue_limit", -1),
        ("queue_timeout_s", 0),
        ("ewma_alpha", 0.0),
        ("ewma_alpha", 1.5),
        ("hbm_price_s_per_gib", -1),
        ("session_idle_s", 0),
    ],
)
def test_invalid_knob_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        RouterKnobs(**{field: value})


def test_invalid_per_model_penalty_names_the_model():
    with pytest.raises(ValueError, match="replica_penalty_by_model"):
        RouterKnobs(replica_penalty_by_model={"m": -1.0})


def test_unknown_policy_lists_valid_names():
    with pytest.raises(ValueError, match="valid names: .*talaria") as err:
        Router(RouterKnobs(), {}, "fastest")
    assert all(name in str(err.value) for name in POLICIES.names())


def test_talaria_queues_a_call_where_its_model_is_served_instead_of_holding_it():
    """Both replicas serving the model are over their round budget: under "queue" the call
    waits in the cheapest one's queue at once (no gateway hold); "reject" still answers 429."""
    r, snaps = router(overload="queue"), Snaps()
    cluster(r, snaps, ("a", "b"), round_load_s=9.0, round_remaining_s=0.7)  # the model active
    d = r.place(call("c1"), 0.1)
    assert cand(d, "a").reason == cand(d, "b").reason == "round"
    assert d.kind is DecisionKind.COST and d.instance == "a"
    assert "queued where the model is served" in d.reason
    assert r.held() == () and r.in_flight() == {"c1": "a"}
    r, snaps = router(overload="reject"), Snaps()
    cluster(r, snaps, ("a", "b"), round_load_s=9.0, round_remaining_s=0.7)
    assert r.place(call("c1"), 0.1).kind is DecisionKind.OVERLOAD_REJECT
