import pytest

from talariad.replay.metrics import nearest_rank, row_metrics

from .conftest import make_run


def test_nearest_rank_by_hand():
    xs = [15, 20, 35, 40, 50]
    assert nearest_rank(xs, 50) == 35  # rank ceil(2.5) = 3
    assert nearest_rank(xs, 95) == 50  # rank ceil(4.75) = 5
    assert nearest_rank(xs, 40) == 20  # rank ceil(2.0) = 2: exact ranks are not rounded up
    assert nearest_rank(xs, 1) == 15
    assert nearest_rank(list(range(1, 101)), 95) == 95
    assert nearest_rank(list(range(1, 101))[::-1], 50) == 50
    assert nearest_rank([], 50) is None
    with pytest.raises(ValueError):
        nearest_rank(xs, 0)


def test_row_metrics_of_hand_made_run(run):
    r = row_metrics(run)
    assert (r.sessions, r.calls, r.rounds) == (4, 8, 3)
    assert (r.sct_p50_s, r.sct_p95_s) == (20.0, 40.0)  # SCTs 10, 20, 30, 40
    # TTFTs: 0.5 1.0 1.5 2.0 (call 0) and 0.1 .. 0.4 (returning)
    assert r.ttft_p50_s == pytest.approx(0.4) and r.ttft_p95_s == pytest.approx(2.0)
    assert r.returning_ttft_p50_s == pytest.approx(0.2) and r.returning_ttft_p95_s == pytest.approx(
        0.4
    )
    d2d = r.switch_by_path["d2d"]
    assert (d2d.count, d2d.p50_s, d2d.p95_s, d2d.share) == (2, 0.1, 0.3, 0.5)
    assert r.switch_by_path["h2d"].p50_s == 2.0 and r.switch_by_path["partial"].count == 1
    assert r.switch_share == pytest.approx(5.0 / 40.0)
    assert r.hbm_peak_gib == pytest.approx(177.0)
    assert (r.avoidable_opens, r.model_opens) == (1, 1)
    assert r.same_instance_rate == pytest.approx(0.75)
    assert r.residency_hit_rate == pytest.approx(7 / 8)
    assert (r.sp_admitted, r.sp_parked) == (7, 9)
    # per-session slowdowns: 10/5, 20/6, 30/7, 40/8 (no rank bounds: single-tenant only)
    assert r.slowdown_p50 == pytest.approx(20 / 6) and r.slowdown_p95 == pytest.approx(40 / 8)
    assert r.switches == 4


def test_slowdown_uses_the_strict_bound_of_each_sessions_finishing_rank():
    run = make_run("x")
    run.rank_bounds = [4.0, 15.0, 16.0, 35.0]
    r = row_metrics(run)
    # sessions finish in order s0..s3: bounds max(5,4)=5, max(6,15)=15, max(7,16)=16, max(8,35)=35;
    # slowdowns 2.0, 1.33, 1.875, 1.14
    assert r.slowdown_p50 == pytest.approx(20 / 15) and r.slowdown_p95 == pytest.approx(2.0)
