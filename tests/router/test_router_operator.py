"""The operator's levers on the router: cordon, drain, reopen, lease revoke, session forget, knobs."""

from __future__ import annotations

import dataclasses

from talariad.router import DecisionKind
from talariad.types import KVState
from tests.router.router_factories import Snaps, call, cluster, router, serve


def setup():
    r, snaps = router(), Snaps()
    cluster(r, snaps, ("a", "b"))
    return r, snaps


def test_cordon_places_nothing_new_but_serves_leases():
    r, snaps = setup()
    d, lease = serve(r, call("c1", session="s1"), 0.1, 0.2)
    r.close_instance(d.instance, drain=False)
    # a new snapshot (the session's KV still on device) keeps the instance closed
    cluster(r, snaps, ("a", "b"), now=0.3, sessions={"s1": (KVState.DEVICE, lease.kv_len)})
    other = "b" if d.instance == "a" else "a"
    assert r.place(call("c2", session="s2"), 0.4).instance == other
    hit = r.place(call("c3", session="s1"), 0.5)
    assert hit.kind is DecisionKind.LEASE_HIT and hit.instance == d.instance
    r.reopen_instance(d.instance)
    assert d.instance in {c.instance for c in r.place(call("c4", session="s4"), 0.6).candidates}


def test_drain_drops_leases_and_installs_none():
    r, _ = setup()
    d, _ = serve(r, call("c1", session="s1"), 0.1, 0.2)
    dropped = r.close_instance(d.instance, drain=True)
    assert [le.session_id for le in dropped] == ["s1"] and r.leases() == ()
    assert (
        r.completed("c1", d.instance, d.candidates[0].kv_state, 10, 0.3) is None
    )  # unknown call now
    placed = r.place(call("c2", session="s1"), 0.4)
    assert placed.instance != d.instance and placed.kind is not DecisionKind.LEASE_HIT


def test_closed_survives_a_restart():
    r, snaps = setup()
    r.close_instance("a", drain=True)
    r.remove_instance("a", 0.1)
    cluster(r, snaps, ("a",), now=0.2)
    assert {c.instance for c in r.place(call("c1"), 0.3).candidates} == {"b"}


def test_revoke_and_forget():
    r, _ = setup()
    serve(r, call("c1", session="s1"), 0.1, 0.2)
    assert [le.session_id for le in r.revoke("s1")] == ["s1"] and r.leases() == ()
    assert r.revoke("s1") == []  # idempotent
    serve(r, call("c2", session="s1"), 0.3, 0.4)
    known, dropped = r.forget_session("s1")
    assert known and len(dropped) == 1 and r.sessions() == () and r.leases() == ()
    assert r.forget_session("s1") == (False, [])


def test_set_knobs_changes_tau_for_new_leases():
    r, _ = setup()
    r.retune(dataclasses.replace(r.knobs, tau_s=7.0))
    _, lease = serve(r, call("c1"), 0.1, 1.0)
    assert lease.t_exp == 8.0
