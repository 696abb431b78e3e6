"""The shift suite on small workloads: the planner's moves carried out in virtual time, the peers,
and the rows `compare --suite shift --json` writes."""

from __future__ import annotations

import pytest

from talariad.config import PlannerConfig
from talariad.perfmodel.profiles import load_set
from talariad.sim.__main__ import main
from talariad.sim.shift import (
    ROW_FIELDS,
    Phase,
    rows,
    run_policy,
    shift_phases,
    workload,
)

PSET = load_set("paper-tp8")
MODELS = list(PSET.models)
Q, G, H = MODELS
QUICK = PlannerConfig(window_s=30, warmup_windows=1, persistence=1.0, dwell_s=300)


@pytest.fixture(scope="module")
def shifting():
    phases = [Phase("q", 600, {Q: 1.0}, 3.0), Phase("g", 900, {Q: 0.1, G: 0.6, H: 0.3}, 3.0)]
    return workload("shift", phases, seed=3)


@pytest.fixture(scope="module")
def auto(shifting):
    return run_policy("auto", shifting, PSET, MODELS, QUICK)


def test_auto_moves_the_hot_instance_to_the_model_that_heats(shifting, auto):
    assert len(auto.result.sessions) == len(shifting.trace)  # every session finished
    assert auto.moves, "no move on a workload whose hot model goes cold"
    starts = [t for t, _ in auto.moves]
    assert all(b - a >= QUICK.dwell_s for a, b in zip(starts, starts[1:], strict=False))
    first, cost = auto.moves[0]
    assert first >= 600  # not before the demand shifted
    assert cost >= PSET.profiles()[G].open_s  # out of service at least while its weights load


def test_moved_instance_serves_its_new_model(auto):
    served = {c.instance for c in auto.result.calls if c.model == G and c.first_token_s > 1000}
    assert "hot0" in served


def test_rows_per_phase_and_for_the_whole_run(shifting, auto):
    out = rows(shifting, auto, MODELS)
    assert [r["phase"] for r in out] == ["q", "g", "all"]
    for r in out:
        assert tuple(r) == ROW_FIELDS and r["policy"] == "auto"
    assert out[-1]["moves"] == len(auto.moves) == out[0]["moves"] + out[1]["moves"]
    hours = shifting.duration_s / 3600
    assert out[-1]["moves_per_model_hour"] == pytest.approx(len(auto.moves) / (3 * hours))
    assert out[-1]["sct_p95_s"] >= out[-1]["sct_p50_s"] > 0


def test_oracle_is_no_worse_than_the_shipped_static(shifting):
    static = run_policy("static", shifting, PSET, MODELS)
    oracle = run_policy("oracle-static", shifting, PSET, MODELS)
    p95 = {r.policy: rows(shifting, r, MODELS)[-1]["sct_p95_s"] for r in (static, oracle)}
    assert p95["oracle-static"] <= p95["static"]  # the shipped assignment is one it searched
    assert "hot0=" in oracle.note and not oracle.moves


def test_swap_counts_its_model_loads_as_moves(shifting):
    swap = run_policy("swap", shifting, PSET, MODELS)
    assert len(swap.moves) == len(swap.result.switches) > 0
    assert sum(c for _, c in swap.moves) == pytest.approx(
        sum(w.latency_s for w in swap.result.switches)
    )


def test_shift_phases_hold_the_issue_s_three_changes():
    phases = shift_phases(MODELS)
    seen = [set(p.mix) for p in phases]
    assert H not in seen[0] and H in seen[1]  # a model appears
    cools = [
        (a.mix.get(Q, 0) > b.mix.get(Q, 0), a.mix.get(G, 0) < b.mix.get(G, 0))
        for a, b in zip(phases, phases[1:], strict=False)
    ]
    assert (True, True) in cools  # the hot model cools while a cold one heats
    assert phases[-1].mix == {Q: 1 / 3, G: 1 / 3, H: 1 / 3}  # all busy


def test_cli_refuses_a_profile_set_with_too_few_models(tmp_path, capsys):
    out = tmp_path / "rows.json"
    code = main(["compare", "--suite", "shift", "--profiles", "tiny", "--json", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
