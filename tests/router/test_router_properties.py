"""Property tests over random event sequences, for every registered policy."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from talariad.router import (
    POLICIES,
    CallRequest,
    DecisionKind,
    InstanceSnapshot,
    KVLocation,
    ModelResidency,
    ModelState,
    Router,
    RouterKnobs,
)
from talariad.types import KVState, LatencyProfile, Pool

NAMES = ("a", "b", "c", "d")
MODELS = ("m1", "m2")
SESSIONS = ("s0", "s1", "s2", "s3", "s4")
KNOBS = dict(staleness_s=1.0, heartbeat_s=1.5, overload="spill")

snap_ev = st.tuples(
    st.just("snap"),
    st.sampled_from(NAMES),
    st.booleans(),
    st.floats(0.0, 1.5),
    st.sampled_from(list(ModelState)),
    st.floats(0.0, 9.0),
    st.frozensets(st.sampled_from(MODELS), min_size=1),
    st.sampled_from(list(KVState)),
)
beat_ev = st.tuples(st.just("beat"), st.sampled_from(NAMES), st.booleans())


def place_events(sessions: tuple, models: tuple) -> st.SearchStrategy:
    return st.tuples(
        st.just("place"),
        st.sampled_from(sessions),
        st.sampled_from(models),
        st.integers(0, 50_000),
        st.floats(0.0, 1.0),
    )


place_ev = place_events(SESSIONS + (None,), MODELS)
returns_ev = place_events(SESSIONS[:2], MODELS[:1])  # few (session, model) pairs: many returns
done_ev = st.tuples(st.just("done"), st.integers(0, 50), st.sampled_from(list(KVState)))
fail_ev = st.tuples(st.just("fail"), st.integers(0, 50))
tick_ev = st.tuples(st.just("tick"), st.floats(0.0, 0.6))
misc_ev = st.tuples(st.sampled_from(["expire", "remove"]), st.sampled_from(NAMES))
events = st.lists(
    st.one_of(
        snap_ev, beat_ev, place_ev, place_ev, place_ev, done_ev, done_ev, fail_ev, tick_ev, misc_ev
    ),
    min_size=15,
    max_size=50,
)
lease_events = st.lists(
    st.one_of(
        snap_ev, beat_ev, returns_ev, returns_ev, done_ev, done_ev, fail_ev, tick_ev, misc_ev
    ),
    min_size=15,
    max_size=50,
)
PRELUDE = [
    ("snap", name, True, 0.0, ModelState.ACTIVE, 0.0, frozenset(MODELS), KVState.DEVICE)
    for name in NAMES
]


@dataclass
class Oracle:
    """An independent model of health and freshness (§4.1 rules) to check decisions against."""

    health: dict[str, bool] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)
    taken: dict[str, float] = field(default_factory=dict)
    allowed: dict[str, frozenset] = field(default_factory=dict)

    def healthy(self, name: str) -> bool:
        return self.health.get(name, False)

    def fresh(self, name: str, now: float) -> bool:
        return (
            name in self.taken
            and now - self.taken[name] <= KNOBS["staleness_s"]
            and now - self.seen[name] <= KNOBS["heartbeat_s"]
        )


def replay(policy: str, evs: list) -> tuple[list, Router]:
    """Drive a fresh router with `evs`, checking invariants; returns the decisions."""
    profiles = {m: LatencyProfile(weight_bytes=1 << 30, kv_bytes_per_token=10) for m in MODELS}
    r = Router(RouterKnobs(**KNOBS), profiles, policy)
    oracle, now, version, n, out, flying = Oracle(), 0.0, 0, 0, [], []
    for ev in PRELUDE + evs:
        kind = ev[0]
        if kind == "tick":
            now += ev[1]
        elif kind == "snap":
            _, name, healthy, lag, state, load, allowed, kv = ev
            version += 1
            sessions = {(s, m): KVLocation(s, m, kv, 4000) for s in SESSIONS[:3] for m in MODELS}
            snap = InstanceSnapshot(
                name,
                version,
                now - lag,
                Pool.COLD,
                healthy,
                allowed,
                {m: ModelResidency(state) for m in MODELS},
                sessions,
                round_load_s=load,
                hbm_free_bytes=1 << 34,
            )
            r.observe(snap, now)
            oracle.health[name], oracle.seen[name] = healthy, now
            oracle.taken[name], oracle.allowed[name] = now - lag, allowed
        elif kind == "beat":
            r.heartbeat(ev[1], now, ev[2])
            if ev[1] in oracle.taken:
                oracle.health[ev[1]], oracle.seen[ev[1]] = ev[2], now
        elif kind == "place":
            _, session, model, prompt, reuse = ev
            n += 1
            c = CallRequest(f"c{n}", session, model, prompt, int(prompt * reuse), 64)
            d = r.place(c, now)
            out.append(d)
            if d.kind.places:
                check_target(policy, d, c, oracle, now)
                flying.append((c.call_id, d.instance))
        elif kind in ("done", "fail") and flying:
            call_id, inst = flying.pop(ev[1] % len(flying))
            if kind == "done":
                out.append(r.completed(call_id, inst, ev[2], 5000, now))
            else:
                r.failed(call_id, now)
        elif kind == "expire":
            r.expire(now)
            assert all(lease.live(now) for lease in r.leases())
        elif kind == "remove":
            r.remove_instance(ev[1], now)
            for d in (oracle.health, oracle.seen, oracle.taken, oracle.allowed):
                d.pop(ev[1], None)
        keys = [(lease.session_id, lease.model) for lease in r.leases()]
        assert len(keys) == len(set(keys))  # at most one lease per (session, model)
        r.check_integrity()
    return out, r


def check_target(policy: str, d, c: CallRequest, oracle: Oracle, now: float) -> None:
    assert d.instance in oracle.taken, "placed on an unknown instance"
    assert oracle.healthy(d.instance), "placed on an unhealthy instance"
    assert c.model in oracle.allowed[d.instance], "placed where the model is not allowed"
    if policy == "talaria" and d.kind is not DecisionKind.LEASE_HIT:
        assert oracle.fresh(d.instance, now), "non-reserved placement on a stale instance"


@settings(max_examples=60, deadline=None)
@given(policy=st.sampled_from(POLICIES.names()), evs=events)
def test_never_places_on_unhealthy_or_unknown_instance(policy, evs):
    replay(policy, evs)


@settings(max_examples=40, deadline=None)
@given(evs=lease_events)
def test_talaria_lease_invariants(evs):
    replay("talaria", evs)


@settings(max_examples=40, deadline=None)
@given(policy=st.sampled_from(POLICIES.names()), evs=events)
def test_decisions_are_a_function_of_the_events(policy, evs):
    first, r1 = replay(policy, evs)
    second, r2 = replay(policy, evs)
    assert first == second
    assert r1.leases() == r2.leases() and r1.sessions() == r2.sessions()
