"""The lease book, session table, prefix index and telemetry book on their own."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from talariad.router import Lease
from talariad.router.policies.prefix_index import RoutedPrefixIndex
from talariad.router.search.logged import LoggedDict, thaw
from talariad.router.sessions import LeaseBook, SessionTable
from talariad.types import KVState
from tests.router.router_factories import Snaps, call, cluster, router


def _lease(session="s", model="m", instance="a", t_done=0.0, tau=1.0) -> Lease:
    return Lease(session, model, instance, "h", 10, t_done, t_done + tau, 1.0)


def test_lease_book_replacement_keeps_one_charge_and_skips_stale_heap_entries():
    book = LeaseBook()
    book.install(_lease(instance="a", t_done=0.0))
    book.install(_lease(instance="b", t_done=0.5))  # same (session, model): replaces
    assert len(book) == 1 and book.charge("a") == 0 and book.charge("b") == 1
    assert book.expire(1.0) == []  # the heap entry of the replaced lease is skipped
    assert [lease.instance for lease in book.expire(1.5)] == ["b"] and book.charge("b") == 0
    book.check_integrity()


def test_lease_book_charges_per_model_and_drop_instance():
    book = LeaseBook()
    book.install(_lease("s1", "m1", "a"))
    book.install(_lease("s2", "m2", "a"))
    book.install(_lease("s3", "m1", "b"))
    assert (book.charge("a"), book.charge("a", "m1"), book.charge("a", "m2")) == (2, 1, 1)
    assert {lease.session_id for lease in book.drop_instance("a")} == {"s1", "s2"}
    assert book.charge("a") == 0 and len(book) == 1
    book.check_integrity()


def test_lease_book_integrity_check_catches_a_bad_charge():
    book = LeaseBook()
    book.install(_lease())
    book.by_instance["a"]["m"] += 1
    with pytest.raises(AssertionError):
        book.check_integrity()


def test_lease_liveness_window():
    lease = _lease(t_done=2.0, tau=1.0)
    assert [lease.live(t) for t in (1.9, 2.0, 2.99, 3.0)] == [False, True, True, False]


def test_session_table_forgets_idle_rows_in_last_use_order():
    table = SessionTable()
    table.completed("s1", "m", "a", KVState.DEVICE, 10, 1.0)
    table.completed("s2", "m", "a", KVState.HOST, 10, 2.0)
    table.completed("s1", "m", "b", KVState.DEVICE, 20, 3.0)  # s1 used again, later
    assert table.forget_idle(2.5) == ["s2"]
    assert table.get("s1").instance == "b" and table.kv_record("s2", "m") is None
    assert table.kv_record("s1", "m").kv_len == 20


def test_session_table_forget_drops_the_sessions_kv_records():
    table = SessionTable()
    table.completed("s1", "m", "a", KVState.DEVICE, 10, 1.0)
    table.completed("s1", "n", "a", KVState.HOST, 12, 1.5)
    table.completed("s2", "m", "a", KVState.HOST, 10, 2.0)  # another session starting with "s"
    assert table.forget("s1") is True
    assert table.kv_record("s1", "m") is None and table.kv_record("s1", "n") is None
    assert table.kv_record("s2", "m").kv_len == 10
    assert table.forget("s1") is False


def test_router_expire_forgets_long_idle_sessions():
    r, snaps = router(session_idle_s=10.0), Snaps()
    cluster(r, snaps, ("a",))
    r.place(call("c1"), 0.0)
    r.completed("c1", "a", KVState.DEVICE, 10, 1.0)
    r.expire(5.0)
    assert len(r.sessions()) == 1
    r.expire(11.5)
    assert r.sessions() == ()


def test_prefix_index_matches_by_session_and_evicts_lru():
    index = RoutedPrefixIndex(capacity_tokens=1000)
    index.insert("m", "s1", "a", 600)
    index.insert("m", "s2", "a", 300)
    index.insert("m", "s1", "b", 800)
    assert index.matches("m", "s1", 700) == {"a": (600, 1), "b": (700, 3)}
    assert index.matches("m", None, 700) == {} and index.matches("x", "s1", 700) == {}
    index.insert("m", "s3", "a", 400)  # a now holds 1300 > 1000
    assert index.evict() == 1 and index.size("a") == 700  # s1 (least recent on a) went
    assert "a" not in index.matches("m", "s1", 700)
    index.check_integrity()


def test_instances_view_reports_health_freshness_and_load():
    r, snaps = router(staleness_s=1.0), Snaps()
    cluster(r, snaps, ("a", "b"))
    r.place(call("c1", prompt=5000), 0.1)
    r.completed("c1", "a", KVState.DEVICE, 5010, 0.3)
    r.place(call("c2", session="s2", prompt=5000), 0.4)
    r.heartbeat("b", 1.5, healthy=False)
    view = {s.instance: s for s in r.instances(1.5)}
    assert view["a"].leases == 1 and view["b"].in_flight == 1
    assert view["b"].overlay_work_s == pytest.approx(0.5)
    assert not view["a"].fresh and view["a"].healthy and not view["b"].healthy


def test_forwarded_retargets_the_overlay():
    r, snaps = router(), Snaps()
    cluster(r, snaps, ("a", "b"))
    d = r.place(call("c1", prompt=5000), 0.1)
    assert r.forwarded("c1", "b" if d.instance == "a" else "a", 0.2)
    assert r.in_flight() == {"c1": "b" if d.instance == "a" else "a"}
    assert not r.forwarded("c1", "zz", 0.2) and not r.forwarded("nope", "a", 0.2)
    r.check_integrity()


def test_remove_instance_drops_its_leases_and_calls():
    r, snaps = router(), Snaps()
    cluster(r, snaps, ("a", "b"))
    r.place(call("c1"), 0.1)
    r.completed("c1", "a", KVState.DEVICE, 1010, 0.2)
    r.place(call("c2", session="s2"), 0.3)
    assert [lease.instance for lease in r.remove_instance("a", 0.4)] == ["a"]
    assert r.leases() == () and "a" not in {s.instance for s in r.instances(0.4)}
    r.check_integrity()


def test_a_window_whose_events_all_left_it_sums_to_exactly_zero():
    from talariad.router.profiles import DemandTracker

    d = DemandTracker(10.0)
    for i, w in enumerate((0.1, 0.2, 0.7, 1e-3, 3.3)):
        d.record("m", float(i), w)
    assert d.work_s("m", 2.0) > 0.0
    assert d.work_s("m", 30.0) == 0.0  # not a rounding residue such as 1e-16


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 99), st.booleans()), max_size=120))
def test_a_logged_dict_state_thaws_to_the_dict_it_was_whatever_is_set_later(steps):
    """Every state handed out stays the dict it named, across later sets and new bases."""
    logged, kept = LoggedDict(), []
    for key, value, hand_out in steps:
        logged.set(key, value)
        if hand_out:
            kept.append((logged.frozen(), dict(logged.live)))
    kept.append((logged.frozen(), dict(logged.live)))
    assert [thaw(state) for state, _ in kept] == [want for _, want in kept]


def test_a_lease_book_state_survives_the_changes_after_it():
    book = LeaseBook()
    book.install(_lease("s0", "m1", "a"))
    charges, counts = book.held()
    for n in range(1, 60):  # enough changes to start new bases
        book.install(_lease(f"s{n}", "m1", "ab"[n % 2], t_done=float(n)))
    assert thaw(charges) == {"a": {"m1": 1.0, None: 1.0}}
    assert thaw(counts) == {"a": {"m1": 1, None: 1}}
    assert thaw(book.held()[0]) == book.by_instance


@given(
    st.lists(
        st.tuples(st.integers(0, 40), st.integers(0, 40), st.floats(0.001, 2.0)),
        max_size=80,
    ),
    st.lists(st.integers(0, 90), max_size=12),
)
def test_a_window_kept_by_bucket_sums_what_a_scan_of_its_events_does(events, reads):
    """Ends on and beside bucket edges (multiples of the bucket's width, many a bucket, out of
    order), read at cutoffs on edges too: the sum is the scan's, whole buckets or not."""
    from talariad.router.profiles import BUCKETS_PER_WINDOW, DemandTracker

    window = 1.0
    d, width = DemandTracker(window), window / BUCKETS_PER_WINDOW
    for at, ends_after, w in events:
        d.record("m", at * width, w, (at + ends_after / 2) * width)
    for at in sorted(reads):
        now = window + at * width
        want = sum(
            w
            for t, after, w in events
            if DemandTracker.end_of(t * width, (t + after / 2) * width) > now - window
        )
        assert d.work_s("m", now) == pytest.approx(want, abs=1e-9)


@given(
    st.lists(
        st.tuples(
            st.sampled_from([0, 1, 7, 300, 9000, 20000]),  # gaps, in buckets (a window: 8192)
            st.integers(0, 40),
            st.floats(0.001, 2.0),
        ),
        max_size=60,
    )
)
def test_a_window_recorded_over_time_sums_what_a_scan_of_its_events_does(steps):
    """Records as time goes on, with gaps past the window (every earlier event left by the next
    record): each read is the scan's."""
    from talariad.router.profiles import BUCKETS_PER_WINDOW, DemandTracker

    window = 1.0
    d, width, at, events = DemandTracker(window), window / BUCKETS_PER_WINDOW, 0, []
    for gap, ends_after, w in steps:
        at += gap
        until = (at + ends_after / 2) * width
        d.record("m", at * width, w, until)
        events.append((DemandTracker.end_of(at * width, until), w))
        now = at * width
        want = sum(w for end, w in events if end > now - window)
        assert d.work_s("m", now) == pytest.approx(want, abs=1e-9)
        if gap > BUCKETS_PER_WINDOW + 40:  # all earlier ones left: one bucket, the new one's
            assert len(d._events["m"].buckets) == 1


def test_a_window_whose_every_event_left_goes_in_one_step():
    """Events each in a bucket of its own (their ends spread), all past the window: one step
    of a bounded trim drops them all, not one bucket."""
    from talariad.router.profiles import DemandTracker

    d = DemandTracker(1.0)
    for i in range(50):
        d.record("m", 0.0, 1.0, i * 0.01)
    assert not d.trim_due(5.0, limit=1)  # none left due after one step
    assert d.work_s("m", 5.0) == 0.0
