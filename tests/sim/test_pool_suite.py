"""The pool suite (issue 29, item 7): box pickers over small pools, and the CLI's rows."""

from __future__ import annotations

import json
import random

import pytest

from talariad.perfmodel.profiles import load_set
from talariad.router import (
    CallRequest,
    InstanceSnapshot,
    ModelResidency,
    ModelState,
    Router,
    RouterKnobs,
)
from talariad.router.box_policies import (
    BOX_POLICIES,
    POLICY_ORDER,
    LlmDSessionBoxPolicy,
    box_stats,
)
from talariad.router.boxes import box_snapshot
from talariad.router.policies.peers import llmd_scores
from talariad.sim.__main__ import main
from talariad.sim.pool import ROW_FIELDS, pool_trace, run_pool
from talariad.types import Pool

TYPES = {
    "boxes": int,
    "policy": str,
    "sct_p50_s": float,
    "sct_p95_s": float,
    "ttft_p95_s": float,
    "box_moves": int,
    "recomputed_tokens": int,
}


@pytest.fixture(scope="module")
def testbed():
    return load_set("router-tp4")


@pytest.fixture(scope="module")
def rows(testbed):
    """Every picker over two boxes of three sessions each (light load: nothing forces a move)."""
    trace = pool_trace(2, 3, 0, list(testbed.models))
    return {p: run_pool(2, p, trace, testbed) for p in POLICY_ORDER}


def test_every_picker_is_registered():
    assert set(POLICY_ORDER) == set(BOX_POLICIES.names())


def test_rows_carry_exactly_the_fields_typed(rows):
    for picker, row in rows.items():
        assert tuple(row) == ROW_FIELDS
        assert row["policy"] == picker and row["boxes"] == 2
        for field, kind in TYPES.items():
            assert isinstance(row[field], kind), (picker, field, row[field])


def test_round_robin_moves_sessions_and_recomputes(rows):
    assert rows["round-robin"]["box_moves"] > 0
    assert rows["round-robin"]["recomputed_tokens"] > 0


def test_talaria_keeps_each_session_on_one_box(rows):
    assert rows["talaria"]["box_moves"] == 0
    assert rows["talaria"]["recomputed_tokens"] == 0


def test_same_workload_for_every_picker(testbed):
    """A pool's trace is fixed by its size and seed; a larger pool's starts with a smaller one's."""
    models = list(testbed.models)
    small, large = pool_trace(2, 3, 0, models), pool_trace(4, 3, 0, models)
    assert len(small.sessions) == 6 and len(large.sessions) == 12
    assert list(large.sessions[:6]) == list(small.sessions)


def _snap(box: str, queued: int, kv: float, healthy: bool = True) -> InstanceSnapshot:
    res = ModelResidency(ModelState.ACTIVE, queued_calls=queued)
    return InstanceSnapshot(
        f"{box}/w0", 1, 0.0, Pool.COLD, healthy, frozenset({"m"}), {"m": res}, kv_occupancy=kv
    )


def _call(k: int, session: str = "s") -> CallRequest:
    return CallRequest(f"{session}#{k}", session, "m", 1000 + 100 * k, 1000 + 100 * k - 100, 8)


def _session_picker() -> LlmDSessionBoxPolicy:
    return LlmDSessionBoxPolicy(Router(RouterKnobs(), {}), random.Random(0))


def _feed(picker, box: str, version: int, queued: int, kv: float, now: float, healthy=True):
    """One poll of `box`, as the shipped picker gives it: the router's target and the stats."""
    snap = _snap(box, queued, kv, healthy)
    picker.router.observe(box_snapshot(box, version, now, [snap]), now)
    picker.observe(box_stats(box, [snap]), now)


def _pick(picker, call: CallRequest, now: float) -> str | None:
    return picker.place(call, now).instance


def test_session_affinity_keeps_the_box_while_the_ttl_lasts():
    picker = _session_picker()
    _feed(picker, "a", 1, 0, 0.0, 0.0)
    _feed(picker, "b", 1, 0, 0.0, 0.0)
    first = _pick(picker, _call(0), 0.0)
    other = "b" if first == "a" else "a"
    # the bound box is now the busier one: queue and KV both favour the other
    for k, at in enumerate((1.0, 100.0, 390.0), start=1):
        _feed(picker, first, 1 + k, 8, 0.9, at)
        _feed(picker, other, 1 + k, 0, 0.0, at)
        assert _pick(picker, _call(k), at) == first
    # idle past the TTL: the next sweep drops the binding; the session keeps only its prefix
    _feed(picker, first, 9, 8, 0.9, 700.0)
    _feed(picker, other, 9, 0, 0.0, 700.0)
    _pick(picker, _call(9, "t"), 700.0)
    assert "s" not in picker.bound


def test_session_affinity_rebinds_when_the_bound_box_is_gone():
    picker = _session_picker()
    _feed(picker, "a", 1, 0, 0.0, 0.0)
    _feed(picker, "b", 1, 0, 0.0, 0.0)
    first = _pick(picker, _call(0), 0.0)
    other = "b" if first == "a" else "a"
    _feed(picker, first, 2, 0, 0.0, 1.0, healthy=False)
    assert _pick(picker, _call(1), 1.0) == other
    assert picker.bound["s"][0] == other


def test_a_peer_with_no_healthy_box_places_nothing():
    picker = _session_picker()
    _feed(picker, "a", 1, 0, 0.0, 0.0, healthy=False)
    decision = picker.place(_call(0), 0.0)
    assert decision.instance is None and decision.retry_after_s


def test_unbound_session_expresses_no_preference():
    picker = _session_picker()
    for box in ("a", "b"):
        _feed(picker, box, 1, 0, 0.0, 0.0)
    scores = picker.scores(_call(0), list(picker.boxes.values()), 0.0)
    assert scores["a"] == scores["b"]


def test_llmd_scores_are_gies_default_mix():
    # 160 prompt tokens = 10 blocks; a matched 5 blocks, b none; queues 0 and 4; KV use 0.5, 0
    got = llmd_scores(160, {"a": 80}, {"a": 0.0, "b": 4.0}, {"a": 0.5, "b": 0.0})
    assert got == {"a": 3 * 0.5 + 2 * 1.0 + 2 * 0.5, "b": 3 * 0.0 + 2 * 0.0 + 2 * 1.0}
    # equal queues all score 1; a match never counts past the prompt's blocks (or 256)
    got = llmd_scores(16, {"a": 10_000}, {"a": 2.0, "b": 2.0}, {"a": 0.0, "b": 0.0})
    assert got == {"a": 3.0 + 2.0 + 2.0, "b": 2.0 + 2.0}


def test_cli_json_rows(capsys):
    argv = ["compare", "--suite", "pool", "--boxes", "2", "--sessions-per-box", "2"]
    assert main([*argv, "--json", "-"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["policy"] for r in rows] == list(POLICY_ORDER)
    assert all(tuple(r) == ROW_FIELDS for r in rows)


def test_cli_rejects_bad_pool_sizes(capsys):
    assert main(["compare", "--suite", "pool", "--boxes", "0,x"]) == 2
    assert "--boxes" in capsys.readouterr().err


def test_a_peers_pick_is_explained_as_the_routers_are():
    picker = _session_picker()
    _feed(picker, "a", 1, 0, 0.0, 0.0)
    d = picker.place(_call(0), 0.0)
    assert picker.router.explain(d.call_id) == d and d.policy == "llm-d-session"
