"""Eq. (1) terms, feasibility (Eq. 5, HBM), Eq. (2), the in-flight overlay and the profile EWMA."""

from __future__ import annotations

import dataclasses

import pytest

from talariad.router import (
    DecisionKind,
    InstanceSnapshot,
    ModelResidency,
    ModelState,
    RoundMeasurement,
)
from talariad.types import KVState, Pool, SwitchPath
from tests.router.router_factories import MODEL, PROFILE, Snaps, call, cand, cluster, router

A, R, X = ModelState.ACTIVE, ModelState.RESIDENT, ModelState.ABSENT


def _terms_sum(c) -> float:
    return c.queue_s + c.prefill_s + c.decode_s + c.kv_recovery_s + c.activation_s


def test_kv_recovery_term_device_host_missing():
    r, snaps = router(), Snaps()
    r.observe(snaps("a", 0.0, sessions={"s1": (KVState.DEVICE, 5000)}), 0.0)
    r.observe(snaps("b", 0.0, sessions={"s1": (KVState.HOST, 5000)}, restore_s_per_token=2e-5), 0.0)
    r.observe(snaps("c", 0.0), 0.0)
    d = r.place(call("c1", prompt=6000, prefix=5000), 0.1)
    a, b, c = cand(d, "a"), cand(d, "b"), cand(d, "c")
    assert a.kv_recovery_s == 0.0 and a.kv_state is KVState.DEVICE
    assert b.kv_recovery_s == pytest.approx(2e-5 * 5000)  # the instance's measured H2D rate
    assert c.kv_recovery_s == pytest.approx(1e-4 * 5000)  # profiled recompute
    for x in (a, b, c):
        assert x.prefill_s == pytest.approx(0.1) and x.decode_s == pytest.approx(0.1)
        assert x.total_s == pytest.approx(_terms_sum(x))  # every term charged once
    assert d.instance == "a" and d.kind is DecisionKind.COST


def test_partial_prefix_recomputes_only_the_missing_part():
    r, snaps = router(), Snaps()
    r.observe(snaps("a", 0.0, sessions={"s1": (KVState.DEVICE, 3000)}), 0.0)
    d = r.place(call("c1", prompt=6000, prefix=5000), 0.1)
    assert cand(d, "a").kv_recovery_s == pytest.approx(1e-4 * 2000)


@pytest.mark.parametrize(
    ("residency", "activation", "replica"),
    [
        (ModelResidency(A), 0.0, False),
        (ModelResidency(R, switch_cost_s=0.4), 0.4, False),  # advertised switch cost
        (ModelResidency(R, staged_fraction=1.0), 0.1, False),  # resident, fully staged: D2D
        (ModelResidency(R, staged_fraction=0.5), 0.1 + 0.5 * 1.9, False),  # partial staging
        (ModelResidency(R, staged_fraction=0.0), 2.0, False),
        (ModelResidency(X, open_cost_s=2.5), 2.5, True),  # measured full open
        (ModelResidency(X), 3.0, True),  # profiled full open
    ],
)
def test_activation_term(residency, activation, replica):
    r, snaps = router(), Snaps()
    r.observe(snaps("a", 0.0, models={MODEL: residency}), 0.0)
    c = cand(r.place(call("c1"), 0.1), "a")
    assert c.activation_s == pytest.approx(activation) and c.needs_replica is replica


def test_less_staging_costs_more():
    r, snaps = router(), Snaps()
    for name, frac in (("a", 0.9), ("b", 0.2)):
        r.observe(snaps(name, 0.0, models={MODEL: ModelResidency(R, staged_fraction=frac)}), 0.0)
    d = r.place(call("c1"), 0.1)
    assert cand(d, "a").activation_s < cand(d, "b").activation_s and d.instance == "a"


def test_residency_beats_idle_instance_without_model_or_kv():
    """§2.2: the loaded instance with the session's KV wins over an idle empty one."""
    r, snaps = router(), Snaps()
    r.observe(
        snaps(
            "a",
            0.0,
            models={MODEL: ModelResidency(A, queued_tokens=10_000)},
            sessions={"s1": (KVState.DEVICE, 40_000)},
            round_load_s=1.0,
        ),
        0.0,
    )
    r.observe(snaps("b", 0.0, state=X), 0.0)
    d = r.place(call("c1", prompt=41_000, prefix=40_000), 0.1)
    assert d.instance == "a"
    assert cand(d, "a").queue_s == pytest.approx(1.0) and cand(d, "b").queue_s == 0.0
    assert cand(d, "b").kv_recovery_s == pytest.approx(4.0) and cand(d, "b").activation_s == 3.0


def test_round_admission_rejects_overfull_round_and_idle_admits_any_call():
    r, snaps = router(overload="reject"), Snaps()
    r.observe(snaps("a", 0.0, round_load_s=7.95), 0.0)
    r.observe(snaps("b", 0.0), 0.0)
    d = r.place(call("c1", prompt=200_000), 0.1)  # 20 s of prefill, over γ·TTFT = 8 s
    assert cand(d, "a").reason == "round" and not cand(d, "a").feasible
    assert cand(d, "b").feasible and d.instance == "b"


def test_round_admission_boundary_uses_gamma_ttft():
    r, snaps = router(gamma=0.5, ttft_target_s=10.0, overload="reject"), Snaps()
    r.observe(snaps("a", 0.0, round_load_s=4.85), 0.0)
    assert r.place(call("c1", prompt=1000), 0.1).instance == "a"  # 4.85 + 0.1 <= 5
    r.failed("c1", 0.1)
    d = r.place(call("c2", prompt=2000), 0.1)  # 4.85 + 0.2 > 5
    assert d.kind is DecisionKind.OVERLOAD_REJECT and d.candidates[0].reason == "round"


def test_hbm_check():
    r, snaps = router(overload="reject"), Snaps()
    r.observe(snaps("a", 0.0, hbm_free_bytes=1_000_000), 0.0)  # call needs 1000 B x 1010 tokens
    r.observe(snaps("b", 0.0, hbm_free_bytes=1_010_000), 0.0)
    d = r.place(call("c1"), 0.1)
    assert cand(d, "a").reason == "hbm" and d.instance == "b"


def test_device_resident_prefix_needs_no_new_hbm():
    r, snaps = router(overload="reject"), Snaps()
    r.observe(snaps("a", 0.0, hbm_free_bytes=20_000, sessions={"s1": (KVState.DEVICE, 1000)}), 0.0)
    assert r.place(call("c1", prompt=1005, prefix=1000, max_tokens=10), 0.1).instance == "a"


def _eq2_cluster(queued_tokens: int):
    r, snaps = router(overload="reject"), Snaps()
    r.observe(
        snaps(
            "a",
            0.0,
            models={MODEL: ModelResidency(A, queued_tokens=queued_tokens)},
            round_load_s=9.0,
        ),
        0.0,
    )  # has the model, but its round is full
    r.observe(snaps("b", 0.0, state=X), 0.0)  # idle, would need a fresh replica
    return r


def test_eq2_blocks_replica_whose_gain_is_below_its_cost():
    d = _eq2_cluster(queued_tokens=0).place(call("c1"), 0.1)
    assert cand(d, "b").reason == "eq2" and not cand(d, "b").feasible
    assert d.kind is DecisionKind.OVERLOAD_REJECT


def test_eq2_opens_replica_when_backlog_justifies_it():
    d = _eq2_cluster(queued_tokens=2_000_000).place(call("c1"), 0.1)  # 200 s of queued prefill
    assert d.kind is DecisionKind.REPLICA_OPEN and d.instance == "b"


def test_replica_penalty_is_per_model_configurable():
    r, snaps = router(overload="reject", replica_penalty_by_model={MODEL: 1000.0}), Snaps()
    r.observe(
        snaps(
            "a", 0.0, models={MODEL: ModelResidency(A, queued_tokens=2_000_000)}, round_load_s=9.0
        ),
        0.0,
    )
    r.observe(snaps("b", 0.0, state=X), 0.0)
    assert cand(r.place(call("c1"), 0.1), "b").reason == "eq2"


def test_first_replica_opens_without_eq2():
    r, snaps = router(), Snaps()
    cluster(r, snaps, ("a", "b"), state=X)
    d = r.place(call("c1"), 0.1)
    assert d.kind is DecisionKind.REPLICA_OPEN and d.instance == "a"


def test_residency_terms_off_drops_recovery_and_activation():
    r, snaps = router(residency_terms=False), Snaps()
    r.observe(snaps("a", 0.0, state=X), 0.0)
    c = cand(r.place(call("c1", prompt=6000, prefix=5000), 0.1), "a")
    assert c.kv_recovery_s == 0.0 and c.activation_s == 0.0 and not c.needs_replica


def test_overlay_makes_back_to_back_decisions_see_each_other():
    r, snaps = router(), Snaps()
    cluster(r, snaps, ("a", "b"))
    first = r.place(call("c1", session="s1", prompt=20_000), 0.1)
    second = r.place(call("c2", session="s2", prompt=20_000), 0.1)
    assert (first.instance, second.instance) == ("a", "b")
    assert cand(second, "a").round_load_s == pytest.approx(4.0)  # c1's 2 s + c2's own 2 s
    r.observe(snaps("a", 0.2), 0.2)  # a newer snapshot reflects c1: it leaves the overlay
    third = r.place(call("c3", session="s3", prompt=20_000), 0.2)
    assert cand(third, "a").round_load_s == pytest.approx(2.0)
    r.check_integrity()


def test_in_flight_open_is_not_charged_twice():
    r, snaps = router(), Snaps()
    r.observe(snaps("a", 0.0, state=X), 0.0)
    assert cand(r.place(call("c1", session="s1"), 0.1), "a").activation_s == 3.0
    assert cand(r.place(call("c2", session="s2"), 0.1), "a").activation_s == 0.0


def test_deadline_risk_inflates_queue():
    r, snaps = router(), Snaps()
    r.observe(
        snaps("a", 0.0, models={MODEL: ModelResidency(A, queued_tokens=10_000)}, deadline_risk=0.5),
        0.0,
    )
    assert cand(r.place(call("c1"), 0.1), "a").queue_s == pytest.approx(1.5)


def test_hot_instance_has_no_slot_wait():
    r, snaps = router(), Snaps()
    r.observe(snaps("hot", 0.0, pool=Pool.HOT, round_remaining_s=3.0), 0.0)
    r.observe(snaps("cold", 0.0, round_remaining_s=3.0), 0.0)
    d = r.place(call("c1"), 0.1)
    assert cand(d, "hot").queue_s == 0.0 and cand(d, "cold").queue_s == 3.0 and d.instance == "hot"


def test_profile_ewma_refresh_changes_costs():
    r, snaps = router(ewma_alpha=0.2), Snaps()
    r.observe(snaps("a", 0.0), 0.0)
    measured = RoundMeasurement(
        prefill_tokens=1000, prefill_s=0.3, switch_path=SwitchPath.H2D, switch_s=4.0
    )
    prof = r.round_summary("a", MODEL, measured, 1.0)
    assert prof.prefill_s_per_token == pytest.approx(0.8 * 1e-4 + 0.2 * 3e-4)
    assert prof.open_s == pytest.approx(0.8 * 2.0 + 0.2 * 4.0)
    assert r.profiles()[MODEL] == prof
    assert cand(r.place(call("c1"), 1.0), "a").prefill_s == pytest.approx(1000 * 1.4e-4)


def test_empty_round_summary_changes_nothing():
    r = router()
    before = r.profiles()[MODEL]
    assert r.round_summary("a", MODEL, RoundMeasurement(), 0.0) == before


def test_older_snapshot_version_is_ignored():
    r = router(profiles={})
    new = InstanceSnapshot("a", 5, 1.0, Pool.COLD, True, frozenset({MODEL}))
    old = InstanceSnapshot("a", 4, 2.0, Pool.COLD, False, frozenset({MODEL}))
    assert r.observe(new, 1.0) and not r.observe(old, 2.0)
    assert r.place(call("c1"), 1.5).instance == "a"


def test_unknown_model_has_no_candidate():
    r, snaps = router(overload="reject"), Snaps()
    cluster(r, snaps, ("a",))
    d = r.place(call("c1", model="other"), 0.1)
    assert d.kind is DecisionKind.OVERLOAD_REJECT and d.candidates == ()


def test_cost_rows_hold_only_values_the_collector_stops_walking():
    """Lazy explanations keep the cost rows of many snapshots: a row of untracked values (the
    model's state as its value, not the enum member) is one the collector walks only once."""
    import gc

    r, snaps = router(), Snaps()
    cluster(r, snaps, ("a", "b"), models={MODEL: ModelResidency(ModelState.RESIDENT)})
    r.place(call("c1"), 0.1)
    rows = [row for inst in r._instances.all() for row in inst.rows.values()]
    gc.collect()
    assert rows and not any(gc.is_tracked(row) for row in rows)


def test_the_reference_imports_none_of_the_search_machinery():
    """`talariad.router.cost` (Eq. (1), the filters, Eq. (2), `rank_all`) is read on its own: at
    run time it imports neither the search machinery nor the books, only names them for types."""
    import ast
    from pathlib import Path

    import talariad.router.cost as reference

    tree = ast.parse(Path(reference.__file__).read_text())
    imported = set()
    for node in tree.body:  # module level, outside `if TYPE_CHECKING:`
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert imported
    assert not {m for m in imported if m.startswith("talariad.router.search")}
    assert not imported & {"talariad.router.sessions", "talariad.router.telemetry"}


def _busy_decoder(**knobs):
    """`a` runs 40 calls of the model (nothing queued); `b` is idle, the model closed there."""
    contended = dataclasses.replace(PROFILE, decode_s_per_seq=1e-3)
    r, snaps = router(profiles={MODEL: contended}, overload="reject", **knobs), Snaps()
    r.observe(snaps("a", 0.0, models={MODEL: ModelResidency(A, running_calls=40)}), 0.0)
    r.observe(snaps("b", 0.0, state=X), 0.0)
    return r


def test_eq2_counts_decode_contention_only_where_the_knob_says():
    """40 running calls slow each other's 200 decode steps: D = 1e-3 x 40^2 x 200 = 320 s, a gain
    of 160 s for a second replica, far above its price; the paper's gain (queued prefill only)
    sees nothing queued and keeps the idle target closed."""
    paper = _busy_decoder().place(call("c1", max_tokens=200), 0.1)
    assert cand(paper, "b").reason == "eq2" and paper.instance == "a"
    pool = _busy_decoder(replica_gain_decode=True).place(call("c1", max_tokens=200), 0.1)
    assert pool.kind is DecisionKind.REPLICA_OPEN and pool.instance == "b"
