import io
import json

from rich.console import Console

from talariad.replay.plots import plots
from talariad.replay.progress import progress_bar
from talariad.replay.report import print_report, speedup_line, to_json_obj

from .conftest import make_run

PNG = b"\x89PNG\r\n\x1a\n"


def _render(results, **kw) -> str:
    buf = io.StringIO()
    print_report(results, Console(file=buf, width=400, color_system=None), **kw)
    return buf.getvalue()


def test_table_and_json_carry_the_numbers():
    runs = [make_run("Talaria"), make_run("Round-only", scale=4.0)]
    text = _render(runs, paper=True)
    for cell in (
        "20.0 / 40.0",
        "80.0 / 160.0",
        "100 / 300 (n=2)",
        "12.5%",
        "177.0",
        "7/9",
        "3.33 / 5.00",
        "75.0%",
        "189 / 867",
        "1000 / 2296",
    ):
        assert cell in text, cell
    assert "Round-only / Talaria SCT: p50 4.00x, p95 4.00x (paper 5.3x, 2.6x)" in text
    obj = json.loads(json.dumps(to_json_obj(runs)))
    row = obj["rows"][0]
    assert row["config"] == "Talaria" and row["sct_p50_s"] == 20.0 and row["sct_p95_s"] == 40.0
    assert row["switch_by_path"]["h2d"]["p50_s"] == 2.0 and row["sp_parked"] == 9
    assert row["switches"] == 4 and row["slowdown_p50"] > 0 and row["rounds"] == 3
    assert obj["rows"][1]["sct_p50_s"] == 80.0
    assert obj["speedup"].startswith("Round-only / Talaria SCT: p50 4.00x")


def test_speedup_needs_both_configs():
    assert speedup_line([make_run("Talaria")]) is None


def _all_figures_runs():
    runs = [make_run(c) for c in ("Talaria", "no-SP", "H2D-only")]
    runs += [
        make_run(f"{p}@{ld}", policy=p, load=ld)
        for p in ("full", "least-pressure")
        for ld in ("low", "high")
    ]
    runs += [make_run(f"tau={t}", tau_s=t) for t in (0.0, 1.0, 5.0)]
    return runs


def test_plots_write_valid_pngs(tmp_path):
    files = plots(_all_figures_runs(), tmp_path / "figs")
    names = sorted(p.name for p in files)
    assert names == [
        "fig11_ttft_sp.png",
        "fig12_switch.png",
        "fig6_sct_cdf.png",
        "fig8_router.png",
        "fig9_tau_sweep.png",
    ]
    for p in files:
        assert p.read_bytes()[:8] == PNG and p.stat().st_size > 1000


def test_plots_skip_figures_without_inputs(tmp_path):
    files = plots([make_run("Round-only")], tmp_path)
    assert sorted(p.name for p in files) == ["fig12_switch.png", "fig6_sct_cdf.png"]


def test_progress_bar_counts():
    buf = io.StringIO()
    with progress_bar(
        3, "configs", console=Console(file=buf, width=100, force_terminal=True)
    ) as advance:
        for _ in range(3):
            advance()
    assert "3/3" in buf.getvalue() and "configs" in buf.getvalue()
    with progress_bar(3, "quiet", enabled=False) as advance:
        advance(2)


def test_a_suite_prints_only_the_columns_that_can_vary_in_it():
    from talariad.replay.report import columns

    def names(suite):
        return {c[0] for c in columns(suite)}

    assert "avoidable opens" not in names("ablations")  # one instance: nowhere else to route
    assert "D2D p50/p95 ms" not in names("router") and "avoidable opens" in names("router")
    assert {"same-inst return", "residency hit", "opens", "unused lease"} <= names("tau")
    assert "return TTFT p50/p95 s" in names("tau")
    assert names(None) >= names("router") | names("ablations") | names("tau")  # real mode: all


def test_the_strict_bound_is_printed_beside_the_table():
    run = make_run("Talaria")
    assert "strict bound SCT p50 / p95: - " in _render([run])
    run.rank_bounds = [5.0, 6.0, 7.0, 8.0]
    text = _render([run])
    assert "strict bound SCT p50 / p95: 6.0 / 8.0 s (paper Talaria 189 / 867 s)" in text
    row = to_json_obj([run])["rows"][0]
    assert row["bound_p50_s"] == 6.0 and row["bound_p95_s"] == 8.0
