"""Each baseline policy's defining behaviour (as each peer system defines it)."""

from __future__ import annotations

import pytest

from talariad.router import DecisionKind, ModelResidency, ModelState
from talariad.types import KVState, Pool
from tests.router.router_factories import MODEL, Snaps, call, cand, cluster, router, serve

NAMES = ("a", "b", "c")


def _cluster(policy: str, **knobs):
    r, snaps = router(policy, **knobs), Snaps()
    cluster(r, snaps, NAMES)
    return r, snaps


def _load(r, instance: str, n: int, tag: str = "load") -> None:
    """Put n calls in flight on `instance` (router-side load L_w)."""
    for i in range(n):
        r.forwarded(r.place(call(f"{tag}{i}", session=f"{tag}{i}"), 0.0).call_id, instance, 0.0)


def test_least_pressure_ignores_kv_and_picks_lowest_load():
    r, snaps = router("least-pressure"), Snaps()
    r.observe(snaps("a", 0.0, round_load_s=2.0, sessions={"s1": (KVState.DEVICE, 5000)}), 0.0)
    r.observe(snaps("b", 0.0, round_load_s=1.0), 0.0)
    d = r.place(call("c1", prompt=6000, prefix=5000), 0.1)
    assert d.instance == "b" and d.kind is DecisionKind.COST
    assert {c.instance: c.score for c in d.candidates} == {"a": 2.0, "b": 1.0}


def test_session_sticky_returns_to_last_instance_regardless_of_load():
    r, snaps = _cluster("session-sticky")
    d1, lease = serve(r, call("c1"), 0.1, 0.5)
    assert lease is None  # baselines install no soft reservation
    r.observe(snaps(d1.instance, 1.0, round_load_s=7.0), 1.0)
    assert r.place(call("c2"), 1.1).instance == d1.instance
    r.heartbeat(d1.instance, 1.2, healthy=False)
    assert r.place(call("c3"), 1.2).instance != d1.instance


def test_round_robin_cycles_over_eligible_instances():
    r, _ = _cluster("round-robin")
    picks = [r.place(call(f"c{i}", session=None), 0.1).instance for i in range(4)]
    assert picks == ["a", "b", "c", "a"]


def test_random_is_seeded_and_only_picks_eligible():
    def picks(seed: int) -> list[str]:
        r, snaps = _cluster("random", seed=seed)
        r.observe(snaps("c", 0.0, healthy=False), 0.0)
        return [r.place(call(f"c{i}", session=None), 0.1).instance for i in range(40)]

    assert picks(7) == picks(7) and picks(7) != picks(8)
    assert set(picks(7)) == {"a", "b"}


def test_power_of_two_takes_the_less_loaded_of_two():
    r, snaps = router("power-of-two"), Snaps()
    cluster(r, snaps, ("a", "b"))
    _load(r, "a", 10)
    assert all(r.place(call(f"c{i}", session=None), 0.1).instance == "b" for i in range(5))


def test_sglang_cache_aware_hit_miss_and_imbalance():
    r, _ = _cluster("sglang-cache-aware")
    first = r.place(call("c1", prompt=1000), 0.1)  # empty tree: min load, first minimum
    assert first.instance == "a"
    hit = r.place(call("c2", prompt=1100, prefix=1000), 0.2)  # 1000/1100 > 0.3
    assert hit.instance == "a" and "cache hit" in hit.reason
    miss = r.place(call("c3", prompt=10_000, prefix=1000), 0.3)  # 0.1 <= 0.3: min load
    assert miss.instance == "b" and "miss" in miss.reason
    _load(r, "a", 100)
    skewed = r.place(call("c4", prompt=10_100, prefix=10_000), 0.4)
    assert "imbalanced" in skewed.reason and skewed.instance == "c"


def test_dynamo_prefers_device_overlap_then_host_overlap():
    r, snaps = router("dynamo-kv"), Snaps()
    r.observe(snaps("a", 0.0, sessions={"s1": (KVState.HOST, 8000)}), 0.0)
    r.observe(snaps("b", 0.0, sessions={"s1": (KVState.DEVICE, 8000)}), 0.0)
    r.observe(snaps("c", 0.0), 0.0)
    d = r.place(call("c1", prompt=8160, prefix=8000), 0.1)
    scores = {c.instance: c.score for c in d.candidates}
    assert d.instance == "b" and scores["b"] < scores["a"] < scores["c"]
    assert scores["b"] == pytest.approx(160 / 16 + 10)  # prefill blocks + new blocks
    assert scores["a"] == pytest.approx((8160 - 0.75 * 500 * 16) / 16 + 510)


def test_dynamo_active_load_pushes_away():
    r, snaps = router("dynamo-kv"), Snaps()
    cluster(r, snaps, ("a", "b"))
    _load(r, "a", 2)
    assert r.place(call("c1", session=None), 0.1).instance == "b"


def test_llm_d_weighted_scores():
    r, snaps = router("llm-d"), Snaps()
    r.observe(snaps("a", 0.0, kv_occupancy=0.5), 0.0)
    r.observe(snaps("b", 0.0, kv_occupancy=0.1), 0.0)
    d = r.place(call("c1", prompt=1600), 0.1)
    scores = {c.instance: c.score for c in d.candidates}
    assert scores == pytest.approx({"a": 2 * 1.0 + 2 * 0.5, "b": 2 * 1.0 + 2 * 0.9})
    assert d.instance == "b"
    # the return matches 100 of its 110 blocks on b: prefix score 3 * 100/110 wins it back
    r.observe(snaps("b", 0.2, kv_occupancy=0.6), 0.2)
    back = r.place(call("c2", prompt=1760, prefix=1600), 0.3)
    assert back.instance == "b"


def test_consistent_hash_is_stable_and_bounded():
    r, snaps = _cluster("consistent-hash")
    homes = {s: r.place(call(f"{s}-1", session=s), 0.1).instance for s in ("s1", "s2", "s3", "s4")}
    for s in homes:
        r.failed(f"{s}-1", 0.1)
    assert {s: r.place(call(f"{s}-2", session=s), 0.2).instance for s in homes} == homes
    for s in homes:
        r.failed(f"{s}-2", 0.2)
    r.observe(snaps("c", 0.3, healthy=False), 0.3)  # only c's sessions move
    moved = {s: r.place(call(f"{s}-3", session=s), 0.3).instance for s in homes}
    assert all(moved[s] == homes[s] for s in homes if homes[s] != "c")
    assert "c" not in moved.values()


def test_consistent_hash_moves_off_an_overloaded_home():
    r, _ = _cluster("consistent-hash")
    home = r.place(call("probe", session="s1"), 0.1).instance
    r.failed("probe", 0.1)
    _load(r, home, 6)  # 6 > 1.5 * max(1, 6/3)
    assert r.place(call("c1", session="s1"), 0.2).instance != home


def test_continuum_pins_for_two_seconds():
    r, snaps = _cluster("continuum-ttl")
    d1, _ = serve(r, call("c1"), 0.1, 0.5)
    r.observe(snaps(d1.instance, 0.6, round_load_s=5.0), 0.6)  # pinned home is now busiest
    assert r.place(call("c2"), 1.0).instance == d1.instance  # within 2 s: pinned
    r.completed("c2", d1.instance, KVState.DEVICE, 1010, 1.2)
    assert r.place(call("c3"), 3.3).instance != d1.instance  # 2.1 s later: pin expired


def test_continuum_does_not_pin_after_long_gaps():
    r, snaps = _cluster("continuum-ttl")
    serve(r, call("c1"), 0.0, 0.1)
    serve(r, call("c2"), 10.1, 10.2)  # a 10 s gap: mean gap > 2 s, no more pins
    home = r.sessions()[0].instance
    for name in NAMES:
        r.observe(snaps(name, 10.3, round_load_s=5.0 if name == home else 0.0), 10.3)
    assert r.place(call("c3"), 10.4).instance != home


def test_llama_swap_serves_where_loaded_then_idle_then_waits():
    r, snaps = router("llama-swap", overload="queue"), Snaps()
    r.observe(snaps("a", 0.0, round_load_s=5.0), 0.0)  # loaded, busy
    r.observe(snaps("b", 0.0, state=ModelState.ABSENT), 0.0)  # idle, model absent
    assert r.place(call("c1", session="s1"), 0.1).instance == "a"
    other = "other"
    r2, snaps2 = router("llama-swap", overload="queue", profiles={}), Snaps()
    busy = {other: ModelResidency(ModelState.ACTIVE, running_calls=2)}
    r2.observe(snaps2("a", 0.0, models=busy, allowed=(MODEL, other)), 0.0)
    r2.observe(
        snaps2("b", 0.0, models={other: ModelResidency(ModelState.ACTIVE)}, allowed=(MODEL, other)),
        0.0,
    )
    assert r2.place(call("c1"), 0.1).instance == "b"  # nothing loaded: swap on the idle one
    assert r2.place(call("c2", session="s2"), 0.1).instance == "b"  # joins that swap
    r3, snaps3 = router("llama-swap", overload="queue", profiles={}), Snaps()
    for name in ("a", "b"):  # both busy with another model: wait for a drain
        r3.observe(snaps3(name, 0.0, models=busy, allowed=(MODEL, other)), 0.0)
    assert r3.place(call("c1"), 0.1).kind is DecisionKind.OVERLOAD_QUEUE


def test_llama_swap_concurrency_limit_spills_to_other_loaded():
    r, snaps = router("llama-swap"), Snaps()
    cluster(r, snaps, ("a", "b"))
    picks = [r.place(call(f"c{i}", session=f"s{i}"), 0.1).instance for i in range(20)]
    assert picks.count("a") == 10 and picks.count("b") == 10


@pytest.mark.parametrize(
    "policy",
    [
        "least-pressure",
        "round-robin",
        "random",
        "power-of-two",
        "sglang-cache-aware",
        "dynamo-kv",
        "llm-d",
        "consistent-hash",
        "continuum-ttl",
        "llama-swap",
        "session-sticky",
    ],
)
def test_baselines_install_no_lease_and_skip_unhealthy(policy):
    r, snaps = _cluster(policy)
    r.observe(snaps("a", 0.0, healthy=False), 0.0)
    d, lease = serve(r, call("c1"), 0.1, 0.2)
    assert d.instance in ("b", "c") and lease is None and r.leases() == ()
    assert all(c.instance != "a" for c in d.candidates)
    assert r.explain("c1") == d and d.policy == policy
    assert MODEL in r.profiles()


def test_hot_instance_pinning_the_model_wins_a_tie_over_cold():
    # equal Eq. (1) totals: the name order alone would send it to "a-cold"
    r, snaps = router(), Snaps()
    r.observe(snaps("a-cold", 0.0), 0.0)
    r.observe(snaps("b-hot", 0.0, pool=Pool.HOT), 0.0)
    d = r.place(call("c1"), 0.1)
    assert cand(d, "a-cold").total_s == cand(d, "b-hot").total_s
    assert d.instance == "b-hot" and "hot pool" in d.reason


def test_cold_takes_a_hot_model_only_when_the_hot_instance_is_infeasible():
    r, snaps = router(), Snaps()
    r.observe(snaps("a-cold", 0.0), 0.0)
    r.observe(snaps("b-hot", 0.0, pool=Pool.HOT, hbm_free_bytes=0), 0.0)  # no room for the call
    d = r.place(call("c1"), 0.1)
    assert not cand(d, "b-hot").feasible and d.instance == "a-cold"


def _resident_everywhere(r, snaps, names, now):
    for name in names:
        r.observe(snaps(name, now, state=ModelState.RESIDENT), now)


def test_a_burst_does_not_open_the_model_on_every_cold_instance():
    # the model is resident (opened once, long ago) on three cold instances; a burst of new
    # sessions concentrates on as few of them as the load allows instead of rotating it everywhere
    r, snaps = router(), Snaps()
    _resident_everywhere(r, snaps, ("a", "b", "c"), 0.0)
    used = [
        r.place(call(f"c{i}", session=f"s{i}", prompt=2000, max_tokens=5), 0.1 + 0.01 * i)
        for i in range(40)
    ]
    assert {d.instance for d in used} == {"a", "b"}  # cost alone spreads it over all three
    assert cand(used[-1], "c").reason == "retired" and "keep" in used[-1].reason
    assert any("reopen retired replica" in d.reason for d in used)  # b, once a's backlog pays


def test_an_idle_replica_retires_and_reopening_it_passes_eq2():
    r, snaps = router(retire_window_s=10.0), Snaps()
    _resident_everywhere(r, snaps, ("a", "b"), 0.0)
    r.place(call("c1", session="s1"), 0.0)  # a keeps the model in rotation
    r.observe(snaps("a", 0.5, hbm_free_bytes=0), 0.5)  # a cannot take the next call
    r.observe(snaps("b", 0.5, state=ModelState.RESIDENT), 0.5)
    r.observe(snaps("c", 0.5, state=ModelState.ACTIVE), 0.5)  # idle, where the model is active
    d = r.place(call("c2", session="s2", prompt=20), 0.6)
    assert d.instance == "c" and cand(d, "b").reason == "retired"  # b retired: gain too small
    assert r.retired("b", 0.6) == (MODEL,) and r.retired("c", 0.6) == ()  # the admin API's list
    # a burst large enough that one more replica pays for its switch, HBM and ν reopens b
    r.observe(
        snaps(
            "a",
            0.7,
            hbm_free_bytes=0,
            models={MODEL: ModelResidency(ModelState.ACTIVE, queued_tokens=400_000)},
        ),
        0.7,
    )
    r.observe(snaps("c", 0.7, hbm_free_bytes=0), 0.7)
    d = r.place(call("c3", session="s3", prompt=20), 0.8)
    assert d.instance == "b" and d.kind is DecisionKind.REPLICA_OPEN
    assert "min cost; reopen retired replica" in d.reason  # it passed Eq. (2), no fallback
    # once its demand there has left the window, b retires again
    r.observe(snaps("a", 30.0, hbm_free_bytes=0), 30.0)
    r.observe(snaps("b", 30.0, state=ModelState.RESIDENT), 30.0)
    r.observe(snaps("c", 30.0, state=ModelState.ACTIVE), 30.0)
    assert r.place(call("c4", session="s4", prompt=20), 30.0).instance == "c"  # c in rotation
    assert cand(r.place(call("c6", session="s6", prompt=20), 30.0), "b").reason == "retired"
    # with every replica in rotation over its budget, the retired one reopens (load allows)
    r.observe(snaps("c", 30.1, hbm_free_bytes=0), 30.1)
    d = r.place(call("c5", session="s5", prompt=20), 30.2)
    assert d.instance == "b" and "in-rotation replicas infeasible" in d.reason


def _busy_resident_and_idle_absent(r, snaps):
    """a: the model active, 5 calls queued, session s1's prefix on device; b: the model absent, idle."""
    busy = {MODEL: ModelResidency(ModelState.ACTIVE, queued_calls=5, queued_tokens=5000)}
    r.observe(snaps("a", 0.0, models=busy, sessions={"s1": (KVState.DEVICE, 1000)}), 0.0)
    r.observe(snaps("b", 0.0, state=ModelState.ABSENT), 0.0)


def test_a_peer_chooses_a_non_resident_instance_when_its_rule_says_so():
    # llm-d scores queue and KV utilisation, not residency: the idle instance wins
    r, snaps = router("llm-d"), Snaps()
    _busy_resident_and_idle_absent(r, snaps)
    assert r.place(call("c1", prompt=1200, prefix=1000), 0.1).instance == "b"


def test_two_peers_diverge_where_their_rules_differ():
    picks = {}
    for policy in ("dynamo-kv", "llm-d"):
        r, snaps = router(policy), Snaps()
        _busy_resident_and_idle_absent(r, snaps)
        picks[policy] = r.place(call("c1", prompt=1200, prefix=1000), 0.1).instance
    # Dynamo follows the KV overlap (a), llm-d's default profile the shorter queue (b)
    assert picks == {"dynamo-kv": "a", "llm-d": "b"}


def test_a_first_replica_opens_where_its_weights_fit_beside_the_models_in_use():
    # both instances lack the model, so Eq. (1) ties; one has room for its weights, the other
    # would have to displace weights or KV it is using: the replica's memory price decides
    r, snaps = router(), Snaps()
    r.observe(snaps("a", 0.0, state=ModelState.ABSENT, staging_slack_bytes=0), 0.0)
    r.observe(snaps("b", 0.0, state=ModelState.ABSENT), 0.0)
    d = r.place(call("c1"), 0.1)
    assert cand(d, "a").total_s == cand(d, "b").total_s
    assert cand(d, "a").replica_s > cand(d, "b").replica_s > 0.0
    assert d.instance == "b" and d.kind is DecisionKind.REPLICA_OPEN


def test_a_first_replica_fills_an_idle_instance_rather_than_time_share_a_busy_one():
    # Eq. (1) ties (the model is absent on both; "a" serves other models' work, which Eq. (1)
    # does not see for this model): the open on busy "a" pays ν, the one on idle "b" does not
    r, snaps = router(replica_penalty_s=2.0), Snaps()
    r.observe(snaps("a", 0.0, state=ModelState.ABSENT, round_load_s=0.5), 0.0)
    r.observe(snaps("b", 0.0, state=ModelState.ABSENT), 0.0)
    d = r.place(call("c1", prompt=2000), 0.1)
    assert cand(d, "a").total_s == cand(d, "b").total_s
    assert cand(d, "a").replica_s == pytest.approx(cand(d, "b").replica_s + 2.0)
    assert d.instance == "b"


def test_the_decision_log_keeps_the_latest_and_frees_the_dropped_off_the_placement_path(
    monkeypatch,
):
    from talariad.router import router as router_module

    monkeypatch.setattr(router_module, "DECISION_LOG", 3)
    r, snaps = router(), Snaps()
    cluster(r, snaps, ("a", "b"))
    for n in range(5):
        r.place(call(f"c{n}", session=f"s{n}"), 0.1)
    assert [r.explain(f"c{n}") is None for n in range(5)] == [True, True, False, False, False]
    assert [d.call_id for d in r.recent(5)] == ["c4", "c3", "c2"]
    assert len(r._dropped) == 2  # freed by the next snapshot, not by a placement
    r.observe(snaps("a", 0.2), 0.2)
    assert r._dropped == []
    for n in range(5, 12):  # no snapshot for longer than the log: freed when it is full
        r.place(call(f"c{n}", session=f"s{n}"), 0.3)
    assert len(r._dropped) <= 3
    monkeypatch.setattr(router_module, "FREE_DECISIONS", 1)  # a burst's many: freed in steps
    waiting = len(r._dropped)
    r.observe(snaps("b", 0.4), 0.4)
    assert len(r._dropped) == waiting - 1
