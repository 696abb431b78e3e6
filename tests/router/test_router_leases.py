"""One test per soft-reservation rule of Algorithm 1 and §4.1."""

from __future__ import annotations

import pytest

from talariad.calls.branches import PrefixBranches
from talariad.calls.placement import Placement
from talariad.router import DecisionKind
from talariad.router.router import PLACE_EXPIRY_STEP
from talariad.types import KVState
from tests.router.router_factories import MODEL, Snaps, call, cand, cluster, router, serve


@pytest.fixture
def setup():
    r, snaps = router(), Snaps()
    cluster(r, snaps, ("a", "b"))
    return r, snaps


def test_routing_creates_no_lease(setup):
    r, _ = setup
    d = r.place(call("c1"), 0.1)
    assert d.kind is DecisionKind.COST and r.leases() == ()


def test_completion_installs_lease_with_tau_expiry(setup):
    r, _ = setup
    d, lease = serve(r, call("c1"), 0.1, 0.5)
    assert lease is not None and r.leases() == (lease,)
    assert (lease.session_id, lease.model, lease.instance) == ("s1", MODEL, d.instance)
    assert lease.t_exp == pytest.approx(0.5 + 1.0)


def test_lease_is_consumed_once(setup):
    r, _ = setup
    d1, _ = serve(r, call("c1"), 0.1, 0.5)
    hit = r.place(call("c2", prompt=1200, prefix=1010), 0.9)
    assert hit.kind is DecisionKind.LEASE_HIT and hit.instance == d1.instance
    assert r.leases() == ()  # consumed; the hit itself installs nothing
    again = r.place(call("c3", prompt=1200, prefix=1010), 0.95)
    assert again.kind is DecisionKind.COST


def test_successor_lease_installed_by_next_completion(setup):
    r, _ = setup
    serve(r, call("c1"), 0.1, 0.5)
    r.place(call("c2", prompt=1200, prefix=1010), 0.9)
    lease = r.completed("c2", "a", KVState.DEVICE, 1210, 1.2)
    assert lease is not None and lease.t_exp == pytest.approx(2.2) and len(r.leases()) == 1


@pytest.mark.parametrize(
    ("at", "kind"), [(1.499, DecisionKind.LEASE_HIT), (1.5, DecisionKind.COST)]
)
def test_lease_discarded_when_expired(setup, at, kind):
    r, _ = setup
    serve(r, call("c1"), 0.1, 0.5)  # t_exp = 1.5: live on [0.5, 1.5)
    assert r.place(call("c2", prompt=1200, prefix=1010), at).kind is kind
    assert r.leases() == ()


def test_expire_reports_dropped_leases(setup):
    r, _ = setup
    _, lease = serve(r, call("c1"), 0.1, 0.5)
    assert r.expire(1.4).leases == ()
    assert r.expire(1.5).leases == (lease,) and r.leases() == ()


def test_lease_discarded_when_instance_unhealthy(setup):
    r, _ = setup
    d1, _ = serve(r, call("c1"), 0.1, 0.5)
    r.heartbeat(d1.instance, 0.6, healthy=False)
    d = r.place(call("c2", prompt=1200, prefix=1010), 0.9)
    assert d.kind is DecisionKind.COST and "unhealthy" in d.reason
    assert d.instance != d1.instance and r.leases() == ()


def test_lease_discarded_when_prefix_missing(setup):
    r, snaps = setup
    d1, _ = serve(r, call("c1"), 0.1, 0.5)
    r.observe(snaps(d1.instance, 0.7), 0.7)  # newer snapshot: the session's prefix is gone
    d = r.place(call("c2", prompt=1200, prefix=1010), 0.9)
    assert d.kind is DecisionKind.COST and "prefix missing" in d.reason and r.leases() == ()


def test_lease_honoured_when_prefix_host_restorable(setup):
    r, snaps = setup
    d1, _ = serve(r, call("c1"), 0.1, 0.5)
    r.observe(snaps(d1.instance, 0.7, sessions={"s1": (KVState.HOST, 1010)}), 0.7)
    d = r.place(call("c2", prompt=1200, prefix=1010), 0.9)
    assert d.kind is DecisionKind.LEASE_HIT and d.candidates[0].kv_state is KVState.HOST


def test_lease_honoured_on_stale_but_healthy_instance():
    r, snaps = router(staleness_s=0.5), Snaps()
    cluster(r, snaps, ("a",))
    serve(r, call("c1"), 0.1, 0.2)
    r.observe(snaps("b", 1.0), 1.0)
    r.heartbeat("a", 1.0)  # healthy, but a's snapshot (t=0) is now stale
    hit = r.place(call("c2", prompt=1200, prefix=1010), 1.1)
    assert hit.kind is DecisionKind.LEASE_HIT and hit.instance == "a"
    other = r.place(call("c3", session="s2"), 1.1)
    assert other.instance == "b" and [c.instance for c in other.candidates] == ["b"]


def test_admission_unit_charged_while_live_and_released(setup):
    r, _ = setup
    d1, _ = serve(r, call("c1"), 0.1, 0.5)
    charged = cand(r.place(call("x1", session="s2"), 0.6), d1.instance)
    r.failed("x1", 0.6)
    # the lease holds its session's predicted return: the prefill of a 1000-token suffix (0.1 s)
    assert charged.round_load_s == pytest.approx(0.1 + 0.1)  # the lease + its own prefill
    assert charged.queue_s == pytest.approx(0.1)  # same-model lease ahead in the slot
    r.expire(1.6)
    released = cand(r.place(call("x2", session="s3"), 1.6), d1.instance)
    assert released.round_load_s == pytest.approx(0.1) and released.queue_s == 0.0


def test_a_lease_charges_its_predicted_return_up_to_the_admission_unit(setup):
    r, _ = setup
    d1, _ = serve(r, call("c1", prompt=20_000), 0.1, 0.5)  # a 2 s suffix: capped at 0.5 s
    assert r.leases()[0].charge_s == pytest.approx(0.5)
    d2, _ = serve(r, call("c2", session="s2", prompt=1200, prefix=1000), 0.6, 0.7)
    host, _ = serve(r, call("c3", session="s3"), 0.8, 0.9, kv=KVState.HOST, kv_len=2000)
    charges = {le.session_id: le.charge_s for le in r.leases()}
    assert charges["s2"] == pytest.approx(200 * 1e-4)  # its 200-token suffix
    assert charges["s3"] == pytest.approx(0.1 + 2000 * 1e-5)  # suffix + host restore


def test_consuming_a_lease_releases_its_charge(setup):
    r, _ = setup
    d1, _ = serve(r, call("c1"), 0.1, 0.5)
    r.place(call("c2", prompt=1200, prefix=1010), 0.9)
    r.failed("c2", 0.9)
    assert cand(r.place(call("x", session="s2"), 0.9), d1.instance).queue_s == 0.0


def test_stale_instance_excluded_from_cost_placement():
    r, snaps = router(staleness_s=1.0), Snaps()
    r.observe(snaps("a", 0.0), 0.0)
    r.observe(snaps("b", 2.0), 2.0)
    r.heartbeat("a", 2.0)
    d = r.place(call("c1"), 2.5)
    assert d.instance == "b" and [c.instance for c in d.candidates] == ["b"]


def test_missed_heartbeat_excludes_instance():
    r, snaps = router(heartbeat_s=1.0, staleness_s=10.0), Snaps()
    cluster(r, snaps, ("a", "b"))
    r.heartbeat("b", 1.5)
    d = r.place(call("c1"), 1.6)
    assert d.instance == "b" and len(d.candidates) == 1


@pytest.mark.parametrize("knobs", [{"reservations": False}, {"tau_s": 0.0}])
def test_reservations_off_installs_no_lease(knobs):
    r, snaps = router(**knobs), Snaps()
    cluster(r, snaps, ("a",))
    _, lease = serve(r, call("c1"), 0.1, 0.5)
    assert lease is None and r.leases() == ()
    assert r.place(call("c2", prompt=1200, prefix=1010), 0.6).kind is DecisionKind.COST


def test_one_lease_per_session_and_model(setup):
    r, _ = setup
    serve(r, call("c1"), 0.1, 0.5)
    serve(r, call("c2", session="s1", prompt=1300), 0.1, 0.7)  # parallel call, same session
    leases = r.leases()
    assert len(leases) == 1 and leases[0].t_done == 0.7
    r.check_integrity()


def test_missing_kv_at_completion_installs_no_lease(setup):
    r, _ = setup
    _, lease = serve(r, call("c1"), 0.1, 0.5, kv=KVState.MISSING)
    assert lease is None


def test_failed_call_releases_overlay_without_lease(setup):
    r, _ = setup
    d = r.place(call("c1", prompt=20000), 0.1)
    assert r.in_flight() == {"c1": d.instance}
    assert r.failed("c1", 0.2) and r.in_flight() == {} and r.leases() == ()
    assert r.completed("c1", d.instance, KVState.DEVICE, 10, 0.3) is None


def test_session_table_records_last_instance(setup):
    r, _ = setup
    d, _ = serve(r, call("c1"), 0.1, 0.5, kv_len=1234)
    (entry,) = r.sessions()
    assert (entry.session_id, entry.instance, entry.model) == ("s1", d.instance, MODEL)
    assert entry.kv_len == 1234
    assert entry.last_used == 0.5 and entry.lease is not None


def test_leases_that_expire_together_go_in_bounded_steps(setup):
    """A burst of sessions opened together expires together: no one call drops them all, and
    none of them is hit once expired."""
    r, _ = setup
    n = 3 * PLACE_EXPIRY_STEP
    for i in range(n):
        serve(r, call(f"c{i}", session=f"s{i}"), 0.1, 0.5)
    assert len(r.leases()) == n
    late = r.place(call("late", session="s0", prompt=1200, prefix=1010), 1.6)
    assert late.kind is DecisionKind.COST  # expired, whatever the book still holds
    assert len(r.leases()) == n - PLACE_EXPIRY_STEP
    report = r.expire(1.6, limit=PLACE_EXPIRY_STEP)
    assert len(report.leases) == PLACE_EXPIRY_STEP and report.pending
    report = r.expire(1.6, limit=10 * n)
    assert not report.pending and r.leases() == ()


def test_a_placement_shell_expires_in_steps_until_none_is_due(setup):
    r, _ = setup
    placement = Placement(r, PrefixBranches(4), grace_s=0.0)
    n = 2 * Placement.EXPIRE_STEP + 1
    for i in range(n):
        serve(r, call(f"c{i}", session=f"s{i}"), 0.1, 0.5)
    placement.expire(2.0)  # due: the first step
    assert len(r.leases()) == n - Placement.EXPIRE_STEP
    placement.expire(2.01)  # not a second later: the steps go on while some are due
    placement.expire(2.02)
    assert r.leases() == ()


def test_idle_session_rows_go_in_bounded_steps(setup):
    r, _ = setup
    for i in range(30):
        serve(r, call(f"c{i}", session=f"s{i}"), 0.1, 0.5)
    idle = 0.5 + r.knobs.session_idle_s + 1.0
    report = r.expire(idle, limit=20)
    assert len(r.sessions()) == 10 and report.pending
    assert not r.expire(idle, limit=20).pending and r.sessions() == ()


def test_the_demand_window_lets_a_burst_go_in_bounded_steps(setup):
    """Calls placed together leave the arrivals' window together: expiry steps drop them
    ahead of the placement that reads the window, and the window's sum is what reading it
    whole gives. (Calls ending within one bucket of the window leave in one step: these end
    10 ms apart, each in its own; a window all of whose calls left goes in one step.)"""
    r, _ = setup
    for i in range(50):
        r.place(call(f"c{i}", session=f"s{i}"), 0.1 + i * 0.01)
    half = 0.1 + 25 * 0.01 + r.knobs.control_window_s  # the first 25 or 26 left by then
    assert r.expire(half, limit=20).pending
    while r.expire(half, limit=20).pending:
        pass
    assert 0.0 < r._demand.work_s(MODEL, half)
    later = 0.6 + r.knobs.control_window_s + 1.0
    assert not r.expire(later, limit=20).pending  # the rest left whole: one step
    assert r._demand.work_s(MODEL, later) == 0.0
