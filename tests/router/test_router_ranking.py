"""The pruned cost ranking (`talariad.router.search.ranking.rank`) decides exactly as the
reference, `talariad.router.cost.rank_all`, which scores every instance: two routers driven in
lockstep by random event sequences give equal decisions, explanations included."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talariad.router import (
    CallRequest,
    InstanceSnapshot,
    KVLocation,
    ModelResidency,
    ModelState,
    RoundMeasurement,
    Router,
    RouterKnobs,
)
from talariad.router.cost import rank_all  # the reference
from talariad.router.search import ranking
from talariad.router.search.lazy import LazyCandidates, weighed
from talariad.types import KVState, LatencyProfile, Pool, SwitchPath
from tests.router.router_factories import MODEL
from tests.support.props import examples

NAMES = tuple(f"i{n}" for n in range(8))
MODELS = ("m1", "m2")
SESSIONS = tuple(f"s{n}" for n in range(6))
PROFILES = {
    "m1": LatencyProfile(
        prefill_base_s=0.01,
        prefill_s_per_token=1e-4,
        decode_step_s=0.02,
        decode_s_per_seq=1e-3,
        restore_s_per_token=1e-5,
        open_s=3.0,
        switch_s={SwitchPath.D2D: 0.1, SwitchPath.H2D: 2.0},
        weight_bytes=8 << 30,
        kv_bytes_per_token=1 << 12,
    ),
    "m2": LatencyProfile(
        prefill_s_per_token=3e-4,
        decode_step_s=0.05,
        open_s=6.0,
        weight_bytes=20 << 30,
        kv_bytes_per_token=1 << 14,
    ),
}

residency = st.builds(
    ModelResidency,
    st.sampled_from(list(ModelState)),
    st.floats(0.0, 1.0),
    st.integers(0, 40_000),
    st.just(0) | st.integers(0, 8),  # often no call of the model there: its slots contend
    st.just(0) | st.integers(0, 16),
    st.one_of(st.none(), st.floats(0.0, 3.0)),
    st.one_of(st.none(), st.floats(0.5, 8.0)),
)
session_kv = st.dictionaries(
    st.tuples(st.sampled_from(SESSIONS), st.sampled_from(MODELS)),
    st.tuples(st.sampled_from(list(KVState)), st.integers(0, 30_000)),
    max_size=6,
).map(lambda d: {k: KVLocation(*k, state, n) for k, (state, n) in d.items()})
snap_ev = st.tuples(
    st.just("snap"),
    st.sampled_from(NAMES),
    st.booleans() | st.just(True),
    st.sampled_from([Pool.COLD, Pool.HOT]),
    st.fixed_dictionaries({m: residency for m in MODELS}),
    session_kv,
    st.floats(0.0, 12.0),
    st.floats(0.0, 0.5),
    st.floats(0.0, 0.9),
    st.sampled_from([1 << 30, 8 << 30, 64 << 30, 1 << 40]),
    st.floats(0.0, 0.4),
)
place_ev = st.tuples(
    st.just("place"),
    st.sampled_from(SESSIONS + (None,)),
    st.sampled_from(MODELS),
    st.integers(1, 40_000),
    st.floats(0.0, 1.0),
    st.integers(1, 2_000),
)
done_ev = st.tuples(
    st.just("done"), st.integers(0, 50), st.sampled_from(list(KVState)), st.integers(0, 40_000)
)
other_ev = st.one_of(
    st.tuples(st.just("tick"), st.floats(0.0, 0.7)),
    st.tuples(st.just("beat"), st.sampled_from(NAMES), st.booleans()),
    st.tuples(st.just("fail"), st.integers(0, 50)),
    st.tuples(st.just("expire")),
    st.tuples(st.just("remove"), st.sampled_from(NAMES)),
    # the bound order is rebuilt after these (`search.bounds.BoundIndex`)
    st.tuples(st.just("close"), st.sampled_from(NAMES), st.booleans()),
    st.tuples(st.just("reopen"), st.sampled_from(NAMES)),
    st.tuples(
        st.just("profile"), st.sampled_from(MODELS), st.integers(1, 4_000), st.floats(0.01, 2.0)
    ),
)
events = st.lists(
    st.one_of(snap_ev, snap_ev, place_ev, place_ev, place_ev, done_ev, other_ev),
    min_size=20,
    max_size=80,
)
knobs = st.fixed_dictionaries(
    {
        "residency_terms": st.booleans(),
        "overload": st.sampled_from(["spill", "queue"]),
        "ttft_target_s": st.sampled_from([2.0, 10.0]),
        "staleness_s": st.just(1.5),
        # short windows: work leaves them mid-sequence, so the trims the pruned ranking makes
        # for the instances it skips must match the reference's reads
        "retire_window_s": st.sampled_from([1.0, 4.0, 30.0]),
        "control_window_s": st.sampled_from([2.0, 30.0]),
        # a candidate set no smaller than the pool holds the optimum: the same decisions
        "cost_candidates": st.sampled_from([None, len(NAMES), len(NAMES) + 2]),
        "replica_gain_decode": st.booleans(),
    }
)


def _pair(kn: dict) -> tuple[Router, Router]:
    fast, ref = Router(RouterKnobs(**kn), PROFILES), Router(RouterKnobs(**kn), PROFILES)
    ref._policy.ranker = rank_all  # the reference ranking in an otherwise identical router
    return fast, ref


def _apply(r: Router, ev: tuple, now: float, version: int, flying: list, n: int):
    kind = ev[0]
    if kind == "snap":
        _, name, healthy, pool, models, sessions, load, risk, occupancy, hbm, lag = ev
        snap = InstanceSnapshot(
            name,
            version,
            now - lag,
            pool,
            healthy,
            frozenset(MODELS),
            models,
            sessions,
            round_remaining_s=load / 3,
            round_load_s=load,
            deadline_risk=risk,
            kv_occupancy=occupancy,
            hbm_free_bytes=hbm,
            staging_slack_bytes=hbm // 2,
        )
        return r.observe(snap, now)
    if kind == "place":
        _, session, model, prompt, reuse, max_tokens = ev
        return r.place(
            CallRequest(f"c{n}", session, model, prompt, int(prompt * reuse), max_tokens), now
        )
    if kind == "done" and flying:
        call_id, inst = flying[ev[1] % len(flying)]
        return r.completed(call_id, inst, ev[2], ev[3], now)
    if kind == "fail" and flying:
        return r.failed(flying[ev[1] % len(flying)][0], now)
    if kind == "beat":
        return r.heartbeat(ev[1], now, ev[2])
    if kind == "expire":
        return r.expire(now)
    if kind == "remove":
        return r.remove_instance(ev[1], now)
    if kind == "close":
        return r.close_instance(ev[1], ev[2])
    if kind == "reopen":
        return r.reopen_instance(ev[1])
    if kind == "profile":
        measured = RoundMeasurement(prefill_tokens=ev[2], prefill_s=ev[3])
        return r.round_summary(NAMES[0], ev[1], measured, now)
    return None


@settings(max_examples=examples(150), deadline=None)
@given(knobs, events)
def test_pruned_ranking_decides_as_scoring_every_instance(kn, evs):
    fast, ref = _pair(kn)
    now, version, n, flying = 0.0, 0, 0, []
    prelude = [
        (
            "snap",
            name,
            True,
            Pool.COLD,
            {m: ModelResidency(ModelState.ACTIVE) for m in MODELS},
            {},
            0.0,
            0.0,
            0.0,
            1 << 40,
            0.0,
        )
        for name in NAMES
    ]
    later = []  # explanations read only after the events that follow their placement
    for ev in prelude + evs:
        if ev[0] == "tick":
            now += ev[1]
            continue
        version += 1
        n += 1
        got, want = (
            _apply(fast, ev, now, version, flying, n),
            _apply(ref, ev, now, version, flying, n),
        )
        assert got == want
        if ev[0] == "place":
            if n % 2:
                assert tuple(got.candidates) == tuple(want.candidates)  # rendered lazily
            else:
                later.append((got, want))
            if got.kind.places:
                flying.append((got.call_id, got.instance))
        elif ev[0] in ("done", "fail") and flying:
            flying.pop(ev[1] % len(flying))
        fast.check_integrity()
        ref.check_integrity()
        for model in MODELS:  # the kept eligible list is the filter over every instance
            every = [i for i in fast._instances.all() if i.placeable(model, now, fast.knobs)]
            assert fast._view.eligible(model, now) == every
    for got, want in later:  # leases, overlays and windows have moved on since
        assert tuple(got.candidates) == tuple(want.candidates)


def test_the_pruned_ranking_skips_instances_that_cannot_win_and_explains_them_on_demand():
    fast, ref = _pair({})
    idle = {m: ModelResidency(ModelState.ACTIVE) for m in MODELS}
    busy = {m: ModelResidency(ModelState.ACTIVE, queued_tokens=30_000) for m in MODELS}
    for v, name in enumerate(NAMES, 1):
        snap = InstanceSnapshot(
            name,
            v,
            0.0,
            Pool.COLD,
            True,
            frozenset(MODELS),
            idle if name == "i3" else busy,
            {},
            hbm_free_bytes=1 << 40,
        )
        fast.observe(snap, 0.0)
        ref.observe(snap, 0.0)
    call = CallRequest("c1", "s1", "m1", 2_000, 0, 16)
    got, want = fast.place(call, 0.0), ref.place(call, 0.0)
    assert got.instance == want.instance == "i3"
    assert (
        isinstance(got.candidates, LazyCandidates) and got.candidates._rendered is None
    )  # not scored yet
    assert list(got.candidates) == list(want.candidates)  # rendered on reading: the same breakdown
    assert [c.instance for c in got.candidates] == list(NAMES)


class _Lockstep:
    """The pruned router and the reference (`rank_all`) fed the same events; `place` compares
    their decisions, and `render=False` leaves the explanation unread (lazy)."""

    def __init__(self, **router_args) -> None:
        from tests.router.router_factories import Snaps, router

        self.fast, self.ref = router(**router_args), router(**router_args)
        self.ref._policy.ranker = rank_all
        self._snaps = (Snaps(), Snaps())

    def snap(self, name: str, now: float, **fields) -> None:
        pairs = zip((self.fast, self.ref), self._snaps, strict=False)
        assert len({r.observe(make(name, now, **fields), now) for r, make in pairs}) == 1

    def done(self, *args):
        got, want = (r.completed(*args) for r in (self.fast, self.ref))
        assert got == want
        return got

    def place(self, *args, render: bool = True):
        got, want = (r.place(*args) for r in (self.fast, self.ref))
        if render:
            assert got == want
        else:
            assert (got.kind, got.instance, got.reason) == (want.kind, want.instance, want.reason)
        return got, want


def test_the_retired_fallback_reopens_as_the_reference_does_without_rendering():
    """Every replica in rotation infeasible: the cheapest retired replica reopens. The pruned
    ranking finds it among the instances it scored (a skipped one was infeasible anyway), the
    reference among all."""
    from tests.router.router_factories import call

    both = _Lockstep(retire_window_s=10.0)
    for name in ("a", "b", "d"):
        both.snap(name, 0.0, state=ModelState.RESIDENT)
    both.place(call("c1", session="s1"), 0.0)  # a keeps the model in rotation
    both.snap("a", 0.5, hbm_free_bytes=0)
    both.snap("c", 0.5)  # the model active there: in rotation once it serves
    both.snap("d", 0.5, state=ModelState.RESIDENT, hbm_free_bytes=0)  # retired, no room
    assert both.place(call("c2", session="s2", prompt=20), 0.6)[0].instance == "c"
    both.snap("c", 0.7, hbm_free_bytes=0)  # every replica in rotation over its budget
    d = both.place(call("c3", session="s3", prompt=20), 0.8)[0]
    assert d.instance == "b" and "in-rotation replicas infeasible" in d.reason


def test_an_explanation_read_later_shows_the_leases_of_its_placement():
    """Leases installed after the placement, on an instance the pruned ranking skipped, are not
    in that placement's explanation (the lazily captured charges are the placement's own)."""
    from tests.router.router_factories import Snaps, call, router

    fast, ref = router(), router()
    ref._policy.ranker = rank_all
    for r in (fast, ref):
        snaps = Snaps()
        for name in ("a", "b", "c", "d"):
            queued = 0 if name == "d" else 20_000
            models = {"m": ModelResidency(ModelState.ACTIVE, queued_tokens=queued)}
            r.observe(snaps(name, 0.0, models=models), 0.0)
        r.place(call("c0", session="s0"), 0.1)
        r.place(call("c1", session="s1"), 0.1)
        assert r.completed("c0", "b", KVState.DEVICE, 1_000, 0.2) is not None  # a lease on b
    got, want = (r.place(call("c2", session="s2"), 0.3) for r in (fast, ref))
    assert (got.instance, got.kind, got.reason) == (want.instance, want.kind, want.reason)
    assert isinstance(got.candidates, LazyCandidates) and got.candidates._rendered is None
    assert got.instance != "b"
    for r in (fast, ref):
        assert r.completed("c1", "b", KVState.DEVICE, 1_000, 0.4) is not None  # another one
    assert tuple(got.candidates) == tuple(want.candidates)


class _Book:
    def __init__(self, names) -> None:
        self._names = dict.fromkeys(names)

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def names(self):
        return self._names.keys()


window_ev = st.lists(
    st.tuples(
        st.sampled_from(["record", "read", "busy", "tick", "advance", "back"]),
        st.sampled_from(NAMES[:4]),
        st.sampled_from(MODELS + (None,)),
        st.sampled_from([0.1, 0.2, 0.3, 0.7, 1.1, 2.5]),
        st.sampled_from([0.0, 0.0, 0.4, 1.5, 4.0]),  # how long the work runs past its forward
    ),
    max_size=120,
)


class _Scan:
    """The reference windows: each key's events in a list, those ending a window before a read
    (or a trim) of that key dropped for good, the rest summed from scratch."""

    def __init__(self, window_s: float) -> None:
        self.window, self.events = window_s, {}  # key -> [(until, work)]

    def record(self, key, now: float, work: float, until: float) -> None:
        self.events.setdefault(key, []).append((max(until, now), work))
        self.trim(key, now)

    def trim(self, key, now: float) -> None:
        events = self.events.get(key, [])
        events[:] = [(t, w) for t, w in events if t > now - self.window]

    def work_s(self, key, now: float) -> float:
        self.trim(key, now)
        return sum(w for _, w in self.events.get(key, []))


@settings(max_examples=200, deadline=None)
@given(window_ev)
def test_busy_names_trim_and_match_reading_every_window(evs):
    """The window sums equal summing every event still in the window (each counted until a
    window after it ends, in whatever order the events end), the in-rotation instances equal
    reading every instance's window, and a sum whose events all left the window reads exactly
    0.0 (not a residue such as 1e-16 of the subtractions, which would read as busy)."""
    from talariad.router.search.placed import PlacedWork

    fast, scan = PlacedWork(3.0), _Scan(3.0)
    book, now = _Book(NAMES[:3]), 0.0  # NAMES[3] is not in the book: never scanned
    for kind, inst, model, x, runs in evs:
        key = (inst, model) if model is not None and kind != "advance" else "m1"
        if x == 0.2:
            key = (inst, None)  # what spare capacity reads
        if kind == "tick":
            now += x
        elif kind == "back":  # a clock that went back
            now -= x / 2
        elif kind == "advance":
            fast.advance(now)
            for name in NAMES[:4]:
                scan.trim((name, None), now)
                want = scan.work_s((name, None), now)  # what spare capacity reads
                assert fast.busy.get(name, 0.0) == pytest.approx(want, abs=1e-9)
        elif kind == "record":
            fast.record(key, now, x, now + runs)
            scan.record(key, now, x, now + runs)
        elif kind == "read":
            assert fast.work_s(key, now) == pytest.approx(scan.work_s(key, now), abs=1e-9)
        elif model is not None:
            want = {name for name in NAMES[:3] if scan.work_s((name, model), now) > 0.0}
            assert set(fast.busy_names(model, book, now)) == want
        for k, window in fast._events.items():
            if not window:
                assert fast._sums[k] == 0.0 and str(fast._sums[k]) == "0.0"  # +0.0, no residue
        for k, total in fast._sums.items():  # the values explanations hold by reference
            if type(k) is tuple:
                assert (fast.busy if k[1] is None else fast.kept[k[1]])[k[0]] == total


def test_advance_trims_each_busy_window_that_has_work_past_its_window():
    """`advance` finds the (instance, None) windows due by their oldest ends (one entry a
    window, whatever the events: a burst's many leave in one step each window), and leaves the
    others as they are."""
    from talariad.router.search.placed import PlacedWork

    placed = PlacedWork(3.0)
    for i in range(100):
        placed.record(("a", None), i * 0.01, 1.0, i * 0.01 + 0.5)
    placed.record(("b", None), 0.0, 2.0, 10.0)
    assert len(placed._expiry) == 2
    placed.advance(3.5 + 0.495)  # half of a's events ended more than a window ago
    assert placed.busy == {"a": pytest.approx(50.0), "b": 2.0}
    placed.advance(4.5)
    assert placed.busy == {"a": 0.0, "b": 2.0} and str(placed.busy["a"]) == "0.0"
    placed.advance(13.0)
    assert placed.busy == {"a": 0.0, "b": 0.0} and not placed._expiry


def test_an_explanation_read_later_shows_the_rotation_of_its_placement():
    """A skipped instance kept in the model's rotation at placement time (the work placed there
    covers what keeping the model costs) is explained so, even once that work left the window."""
    from tests.router.router_factories import call

    both = _Lockstep(retire_window_s=10.0, hbm_price_s_per_gib=0.0, replica_penalty_s=0.0)
    both.snap("a", 0.0, state=ModelState.RESIDENT)
    first = both.place(call("c1", session=None, prompt=30_000), 0.0, render=False)  # 3 s on a
    assert [d.instance for d in first] == ["a", "a"]
    both.done("c1", "a", KVState.DEVICE, 30_000, 0.5)
    both.snap("a", 1.0, state=ModelState.RESIDENT)
    both.snap("b", 1.0)
    got, want = both.place(call("c2", session=None, prompt=20), 1.0, render=False)
    assert (got.instance, got.reason) == (want.instance, want.reason) and got.instance == "b"
    assert isinstance(got.candidates, LazyCandidates) and got.candidates._rendered is None
    both.snap("a", 10.5, state=ModelState.RESIDENT)
    both.snap("b", 10.5)
    both.place(call("c3", session=None, prompt=20), 10.5, render=False)  # c1 left a's window
    assert tuple(got.candidates) == tuple(want.candidates)
    assert not next(c for c in got.candidates if c.instance == "a").needs_replica  # kept


def test_a_plan_without_a_placement_time_ranks_as_the_reference():
    """With no placement time nothing is judged retired and spare capacity is unbounded; a
    skipped instance that needs a replica is explained as the reference scores it."""
    from talariad.router.search.ranking import rank
    from tests.router.router_factories import Snaps, call, router

    r, snaps = router(), Snaps()
    for name, state in (
        ("a", ModelState.ACTIVE),
        ("b", ModelState.ABSENT),
        ("c", ModelState.ACTIVE),
    ):
        r.observe(snaps(name, 0.0, state=state), 0.0)
    r.place(call("c0", session="s0"), 0.0)  # the model is open somewhere: Eq. (2) has a gain
    view, plan = r._view, r._cost.plan(call("c1", session="s1"))
    insts = view.eligible(plan.call.model, 0.0)
    got = rank(view.cost, plan, insts, view.instances, view.demand, 0.0)
    want = rank_all(view.cost, plan, insts, view.instances, view.demand, 0.0)
    assert isinstance(got.candidates, LazyCandidates) and got.candidates._rendered is None
    assert (got.best, tuple(got.candidates), got.cheapest) == (
        want.best,
        want.candidates,
        want.cheapest,
    )


def test_an_explanation_read_later_shows_the_contention_of_its_placement():
    """Skipped instances where the call's slots would delay other models' calls (their running
    calls, their recent work, their leases) are explained with the contention of the placement,
    even once those calls, leases and windows have moved on."""
    from tests.router.router_factories import MODEL, PROFILE, call

    other, both_models = "x", (MODEL, "x")
    both = _Lockstep(profiles={MODEL: PROFILE, other: PROFILE}, retire_window_s=10.0)
    fast, ref = both.fast, both.ref
    queued = ModelResidency(ModelState.ACTIVE, queued_tokens=30_000)  # bounded above a

    def residency(running: int = 0):
        return {MODEL: queued, other: ModelResidency(ModelState.ACTIVE, running_calls=running)}

    for name in ("c", "d"):
        both.snap(name, 0.0, models=residency(), allowed=(other,))
    one = both.place(call("o1", session=None, prompt=40_000, model=other), 0.0, render=False)[0]
    two = both.place(call("o2", session="so", prompt=40_000, model=other), 0.0, render=False)[0]
    assert {one.instance, two.instance} == {"c", "d"}
    both.done("o1", one.instance, KVState.DEVICE, 40_000, 0.5)
    both.done("o2", two.instance, KVState.DEVICE, 40_000, 0.5)  # a lease of x there
    both.snap("a", 1.0, allowed=both_models)  # idle: where the model's calls go
    both.snap("b", 1.0, models=residency(running=2), allowed=both_models)
    for name in ("c", "d"):
        both.snap(name, 1.0, models=residency(), allowed=both_models)
    got, want = both.place(call("m1", session="s1"), 1.0, render=False)
    assert got.instance == "a"
    assert isinstance(got.candidates, LazyCandidates) and got.candidates._rendered is None
    # later: more work of x placed and completed, leases taken, windows emptied
    both.snap("a", 2.0, models=residency(), allowed=both_models)
    three = both.place(call("o3", session="so", prompt=1_000, model=other), 2.0, render=False)[0]
    both.done("o3", three.instance, KVState.DEVICE, 1_000, 2.5)
    both.place(call("m2", session="s2"), 30.0, render=False)
    for r in (fast, ref):  # what a later placement reads: x's work left every window
        assert [r._cost.spare_s(name, 30.0) for name in "bcd"] == [30.0] * 3
        assert r._cost.placed.work_s(("c", None), 30.0) == 0.0  # exactly: not a residue
    assert tuple(got.candidates) == tuple(want.candidates)
    contention = {c.instance: c.contention_s for c in want.candidates}
    assert contention["a"] == 0.0 and all(contention[n] > 0.0 for n in "bcd")


def test_an_instance_whose_new_snapshot_lowers_its_bound_is_scored_again():
    """The bound order moves a re-observed instance in place: once its queue drains, the
    instance that was bounded out of the ranking wins again, as the reference finds."""
    from tests.router.router_factories import call

    both = _Lockstep()
    busy = {MODEL: ModelResidency(ModelState.ACTIVE, queued_tokens=30_000)}
    idle = {MODEL: ModelResidency(ModelState.ACTIVE)}
    both.snap("a", 0.0, models={MODEL: ModelResidency(ModelState.ACTIVE, queued_tokens=5_000)})
    both.snap("b", 0.0, models=busy)
    assert both.place(call("c1", session=None), 0.0)[0].instance == "a"
    both.snap("b", 0.1, models=idle)
    assert both.place(call("c2", session=None), 0.1)[0].instance == "b"


def test_an_explanation_read_later_shows_its_placement_after_many_changes():
    """The lease and placed-work books a lazy explanation keeps are states of logged dicts
    (`logged.LoggedDict`): many placements, completions and leases later, which start new bases
    under them, the explanation still reads the placement's own values."""
    from tests.router.router_factories import call

    both = _Lockstep(retire_window_s=10.0)
    for name in ("a", "b", "c", "d"):
        queued = 0 if name == "d" else 20_000
        both.snap(
            name, 0.0, models={MODEL: ModelResidency(ModelState.ACTIVE, queued_tokens=queued)}
        )
    both.place(call("c0", session="s0"), 0.05)
    both.done("c0", "b", KVState.DEVICE, 1_000, 0.08)  # a lease on a skipped instance
    got, want = both.place(call("c1", session="s1"), 0.1, render=False)
    assert isinstance(got.candidates, LazyCandidates) and got.candidates._rendered is None
    now, base = 0.1, both.fast._leases._charges._base
    for n in range(2, 60):
        now += 0.05
        d = both.place(call(f"c{n}", session=f"s{n}"), now, render=False)[0]
        both.done(f"c{n}", d.instance, KVState.DEVICE, 1_000, now + 0.01)
    assert both.fast._leases._charges._base is not base  # a new base since
    assert tuple(both.fast.explain("c1").candidates) == tuple(want.candidates)


def _loaded_pair(
    kn: dict, hbm_free: list[int], queued: int = 0, running: int = 0
) -> tuple[Router, Router]:
    """`_pair` over NAMES, instance i's round `0.1 * (i + 1)` s long, its free HBM `hbm_free[i]`,
    `queued * (i + 1)` tokens queued and `running` calls running for each model."""
    fast, ref = _pair(kn)
    for i, name in enumerate(NAMES):
        res = ModelResidency(
            ModelState.ACTIVE, queued_tokens=queued * (i + 1), running_calls=running
        )
        snap = InstanceSnapshot(
            name,
            1,
            0.0,
            Pool.HOT,
            True,
            frozenset(MODELS),
            dict.fromkeys(MODELS, res),
            {},
            round_load_s=0.1 * (i + 1),
            hbm_free_bytes=hbm_free[i],
        )
        for r in (fast, ref):
            r.observe(snap, 0.0)
    return fast, ref


def test_a_candidate_set_smaller_than_the_pool_scores_the_least_loaded_only():
    """Past `cost_candidates` plain instances (no session KV, no overlay) the ranking stops,
    lowest bound first, and still places on the cheapest it scored. (Every instance decodes
    alike: a cost the bound leaves out, so the bound alone cannot stop it.)"""
    kn = {"cost_candidates": 2, "staleness_s": 1.5}
    fast, ref = _loaded_pair(kn, [1 << 40] * len(NAMES), queued=10, running=5)
    call = CallRequest("c1", "s1", MODELS[0], 1000, 0, 10)
    got, want = fast.place(call, 0.1), ref.place(call, 0.1)
    assert got.instance == want.instance == NAMES[0]  # the least loaded is the optimum here
    assert len(weighed(got.candidates)) == 2 < len(NAMES)


def test_a_prompt_no_round_takes_scores_the_candidate_set_not_every_instance():
    """Nothing feasible anywhere (the prompt's prefill alone is past every round's budget): the
    ranking scores the candidate set and rules the rest out by the round check, and answers
    as the reference does."""
    fast, ref = _loaded_pair({"cost_candidates": 2, "staleness_s": 1.5}, [1 << 40] * len(NAMES))
    call = CallRequest("c1", "s1", MODELS[0], 5_000_000, 0, 10)
    got, want = fast.place(call, 0.1), ref.place(call, 0.1)
    assert got.kind == want.kind and got.instance == want.instance
    assert not any(c.feasible for c in want.candidates)
    assert len(weighed(got.candidates)) == 2 < len(NAMES)


def test_a_prompt_no_round_takes_tests_only_the_instances_whose_round_may_be_empty(monkeypatch):
    """Past the candidate set a prompt longer than any round's budget cannot go where a round
    has work: the walk tests only the instances with an empty round (not every instance, each
    ruled out by its round), and the idle one takes the call, as in the reference."""
    fast, ref = _loaded_pair({"cost_candidates": 2, "staleness_s": 1.5}, [1 << 40] * len(NAMES))
    idle = InstanceSnapshot(
        NAMES[-2],
        2,
        0.0,
        Pool.HOT,
        True,
        frozenset(MODELS),
        dict.fromkeys(MODELS, ModelResidency(ModelState.ACTIVE, queued_tokens=90_000)),
        {},
        round_load_s=0.0,
        hbm_free_bytes=1 << 40,
    )
    for r in (fast, ref):
        r.observe(idle, 0.0)
    tested: list[str] = []
    test = ranking._Search.infeasible_test

    def counted(search):
        infeasible = test(search)
        return lambda inst: tested.append(inst.name) or infeasible(inst)

    monkeypatch.setattr(ranking._Search, "infeasible_test", counted)
    call = CallRequest("c1", "s1", MODELS[0], 5_000_000, 0, 10)
    got, want = fast.place(call, 0.1), ref.place(call, 0.1)
    assert got.kind == want.kind and got.instance == want.instance == NAMES[-2]
    assert tested == [NAMES[-2]]  # last by its bound; the busy ones are not tested
    assert tuple(got.candidates) == tuple(want.candidates)


def test_past_the_candidate_set_an_instance_that_may_take_the_call_is_still_scored():
    """The least loaded instances have no memory for the call: past the candidate set the one
    that has is scored all the same, and takes it."""
    full = [0] * (len(NAMES) - 1) + [1 << 40]
    fast, ref = _loaded_pair({"cost_candidates": 2, "staleness_s": 1.5}, full)
    call = CallRequest("c1", "s1", MODELS[0], 1000, 0, 10)
    got, want = fast.place(call, 0.1), ref.place(call, 0.1)
    assert got.instance == want.instance == NAMES[-1]
    assert len(weighed(got.candidates)) == 3  # the two of the set, and the one not ruled out


def test_a_candidate_set_counts_the_leases_its_placements_left():
    """Idle instances bound alike; each new session's lease loads its instance, so with a
    candidate set of two the next ones go where the reference (every instance scored) sends
    them, over every instance, not to the same two by name."""
    fast, ref = _loaded_pair({"cost_candidates": 2, "staleness_s": 1.5}, [1 << 40] * len(NAMES))
    placed = []
    now = 0.1
    for n in range(len(NAMES)):
        call = CallRequest(f"c{n}", f"s{n}", MODELS[0], 1000, 0, 10)
        got, want = fast.place(call, now), ref.place(call, now)
        assert got.instance == want.instance
        for r in (fast, ref):
            assert r.completed(f"c{n}", got.instance, KVState.DEVICE, 1000, now + 0.01)
        placed.append(got.instance)
        now += 0.02
        fast.check_integrity()
    assert sorted(placed) == sorted(NAMES)
    # an idle instance's bound is its cost: the first weighed is the best, and one that can at
    # best tie it is not weighed (the reference would break the tie by name: the same one)
    assert len(weighed(fast.explain("c0").candidates)) == 1  # every instance tied then


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["record", "tick", "step", "read"]),
            st.sampled_from(NAMES[:3]),
            st.sampled_from([0.1, 0.5, 1.0, 2.5]),
            st.sampled_from([0.0, 0.5, 4.0]),
        ),
        max_size=60,
    )
)
def test_trimming_in_steps_changes_no_sum_a_later_read_gives(evs):
    """`PlacedWork.advance` in steps (a telemetry event's, `Router._between`) leaves every sum a
    later read or full advance gives as it would be without them (the clock moving forward)."""
    from talariad.router.search.placed import PlacedWork

    stepped, plain, now = PlacedWork(3.0), PlacedWork(3.0), 0.0
    for kind, inst, x, runs in evs:
        key = (inst, None)
        if kind == "tick":
            now += x
        elif kind == "step":
            stepped.advance(now, 1)
        elif kind == "record":
            for p in (stepped, plain):
                p.record(key, now, x, now + runs)
        else:
            assert stepped.work_s(key, now) == pytest.approx(plain.work_s(key, now), abs=1e-9)
    for p in (stepped, plain):
        p.advance(now)
    assert stepped.busy == pytest.approx(plain.busy, abs=1e-9)
