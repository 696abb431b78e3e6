"""The rules that keep a session on its target at the pool level: a lease judged at the call's
arrival, a session's home (`RouterKnobs.session_home`), a new branch at its head's target, and
the prefix the targets hold for a branch the shell has seen none of."""

from __future__ import annotations

import dataclasses

from talariad.router import DecisionKind, ModelResidency, ModelState
from talariad.types import KVState
from tests.router.router_factories import Snaps, call, cluster, router


def _served(r, c, target: str, now: float, kv: int = 900) -> None:
    """`c` placed at `now`, sent to `target` and ended there 0.1 s later, its prefix on device."""
    r.place(c, now)
    r.forwarded(c.call_id, target, now)
    r.completed(c.call_id, target, KVState.DEVICE, kv, now + 0.1)


def test_a_lease_is_judged_at_the_calls_arrival_not_at_its_decision():
    snaps, r = Snaps(), router(tau_s=1.0)
    cluster(r, snaps, ("a", "b"))
    _served(r, call("c0"), "a", 0.0)  # its lease: [0.1, 1.1)
    late = dataclasses.replace(call("c1", prefix=900), arrived_at=1.0)
    d = r.place(late, 1.3)  # its body took 0.3 s: decided past the lease, arrived within it
    assert (d.kind, d.instance, d.session_id) == (DecisionKind.LEASE_HIT, "a", "s1")

    r2 = router(tau_s=1.0)
    cluster(r2, Snaps(), ("a", "b"))
    _served(r2, call("c0"), "a", 0.0)
    assert r2.place(call("c1", prefix=900), 1.3).kind is not DecisionKind.LEASE_HIT


def _loaded(home: bool, load_a: int, round_a: float = 0.0, kv: KVState = KVState.DEVICE):
    """A session's prefix on `a`, its lease long expired; `a` busier than `b` by `load_a`
    queued tokens, its next round `round_a` long."""
    snaps, r = Snaps(), router(tau_s=1.0, session_home=home)
    cluster(r, snaps, ("a", "b"))
    _served(r, call("c0"), "a", 0.0)
    held = {"s1": (kv, 900)}
    busy = {"m": ModelResidency(ModelState.ACTIVE, queued_tokens=load_a, queued_calls=3)}
    r.observe(snaps("a", 5.0, sessions=held, models=busy, round_load_s=round_a), 5.0)
    r.observe(snaps("b", 5.0), 5.0)
    return r


def test_a_return_stays_home_while_home_can_take_it():
    # a box's cost model moves it for a slightly shorter queue elsewhere; the pool's does not
    away = _loaded(home=False, load_a=3000).place(call("c1", prefix=900), 5.0)
    home = _loaded(home=True, load_a=3000).place(call("c1", prefix=900), 5.0)
    assert away.instance == "b" and away.kind is DecisionKind.COST
    assert home.instance == "a" and "home" in home.reason


def test_a_home_that_cannot_take_the_call_is_left_for_cost():
    on_host = _loaded(home=True, load_a=3000, round_a=100.0, kv=KVState.HOST)  # round over Eq. 5
    slow = _loaded(home=True, load_a=200_000)  # a queue 20 s long: more than a round bound
    for r in (on_host, slow):
        d = r.place(call("c1", prefix=900), 5.0)
        assert d.instance == "b" and "home" not in d.reason


def test_a_prefix_on_its_homes_device_is_admitted_past_the_round_budget():
    """As a lease's return is: the box admits the continuation mid-slot."""
    r = _loaded(home=True, load_a=3000, round_a=100.0)
    d = r.place(call("c1", prefix=900), 5.0)
    assert d.instance == "a" and "home" in d.reason


def test_a_new_branch_goes_to_its_heads_target():
    snaps, r = Snaps(), router(session_home=True)
    cluster(r, snaps, ("a", "b"))
    _served(r, call("c0", session="s1~main"), "b", 0.0)
    sub = dataclasses.replace(call("c1", session="s1~sub", prefix=300), prefix_of="s1~main")
    d = r.place(sub, 0.5)
    assert d.instance == "b" and "head" in d.reason and d.session_id == "s1~sub"


def test_held_prefix_is_the_longest_any_target_lists():
    snaps, r = Snaps(), router()
    r.observe(snaps("a", 0.0, sessions={"s1": (KVState.HOST, 700)}), 0.0)
    r.observe(snaps("b", 0.0, sessions={"s1": (KVState.DEVICE, 400)}), 0.0)
    assert r.held_prefix("s1", "m") == 700 and r.held_prefix("s2", "m") == 0
    assert r.held_sessions("a") == {"s1"}
