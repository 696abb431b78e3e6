"""PNG figures shaped like the paper's Figures 6, 8, 9, 11 and 12 (matplotlib, Agg backend).

Each figure is drawn only when the runs it needs are present: Fig. 6 any runs; Fig. 8 runs
labelled with `policy` and `load`; Fig. 9 runs labelled with `tau_s`; Fig. 11 the configs
"no-SP" and "Talaria"; Fig. 12 any runs with switch records.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from talariad.replay.metrics import RunResult, nearest_rank
from talariad.types import SwitchPath

LOADS = ("low", "medium", "high")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _cdf(ax, values: list[float], label: str) -> None:
    xs = sorted(values)
    if xs:
        ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=label)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def fig6_sct(results: Sequence[RunResult], out: Path) -> Path | None:
    plain = [r for r in results if r.load is None and r.tau_s is None and r.sessions]
    if not plain:
        return None
    fig, ax = _plt().subplots(figsize=(6, 4))
    for r in plain:
        _cdf(ax, [s.sct_s for s in r.sessions], r.config)
    ax.set(
        xscale="log",
        xlabel="Session completion time (s)",
        ylabel="CDF",
        title="SCT per configuration",
    )
    ax.legend(fontsize=8)
    return _save(fig, out / "fig6_sct_cdf.png")


def fig8_router(results: Sequence[RunResult], out: Path) -> Path | None:
    runs = [r for r in results if r.policy and r.load in LOADS]
    if not runs:
        return None
    policies = list(dict.fromkeys(r.policy for r in runs))
    fig, (a, b) = _plt().subplots(1, 2, figsize=(10, 4))
    for r in runs:
        if r.load == "high":
            _cdf(a, r.ttfts(), r.policy)
    a.set(xlabel="TTFT (s)", ylabel="CDF", title="(a) High-load TTFT")
    a.legend(fontsize=8)
    width = 0.8 / len(policies)
    for i, pol in enumerate(policies):
        opens = {r.load: r.avoidable_opens for r in runs if r.policy == pol}
        b.bar(
            [j + i * width for j in range(len(LOADS))],
            [opens.get(ld, 0) for ld in LOADS],
            width,
            label=pol,
        )
    b.set_xticks([j + 0.4 - width / 2 for j in range(len(LOADS))], LOADS)
    b.set(ylabel="Avoidable model opens", title="(b) Avoidable opens by load")
    b.legend(fontsize=8)
    return _save(fig, out / "fig8_router.png")


def fig9_tau(results: Sequence[RunResult], out: Path) -> Path | None:
    from talariad.replay.metrics import row_metrics

    runs = sorted((r for r in results if r.tau_s is not None), key=lambda r: r.tau_s)
    if not runs:
        return None
    rows = [row_metrics(r) for r in runs]
    taus = [str(r.tau_s) for r in runs]
    fig, (a, b) = _plt().subplots(1, 2, figsize=(10, 4))
    a.plot(
        taus, [100 * (x.same_instance_rate or 0) for x in rows], marker="o", label="same instance"
    )
    a.plot(
        taus,
        [100 * (x.residency_hit_rate or 0) for x in rows],
        marker="s",
        label="model-residency hit",
    )
    a.set(xlabel="Reservation timeout τ (s)", ylabel="Rate (%)", title="(a) Locality tradeoff")
    a.legend(fontsize=8)
    b.plot(taus, [x.returning_ttft_p50_s or 0 for x in rows], marker="o", label="p50")
    b.plot(taus, [x.returning_ttft_p95_s or 0 for x in rows], marker="s", label="p95")
    b.set(
        xlabel="Reservation timeout τ (s)", ylabel="Returning TTFT (s)", title="(b) Returning TTFT"
    )
    b.legend(fontsize=8)
    return _save(fig, out / "fig9_tau_sweep.png")


def fig11_sp(results: Sequence[RunResult], out: Path) -> Path | None:
    by = {r.config: r for r in results if r.load is None and r.tau_s is None}
    if "no-SP" not in by or "Talaria" not in by:
        return None
    fig, ax = _plt().subplots(figsize=(6, 4))
    for name in ("no-SP", "Talaria"):
        tt = by[name].ttfts()
        _cdf(ax, tt, f"{name} (p95={nearest_rank(tt, 95) or 0:.1f}s)")
    ax.set(xscale="log", xlabel="TTFT (s)", ylabel="CDF", title="Per-call TTFT")
    ax.legend(fontsize=8)
    return _save(fig, out / "fig11_ttft_sp.png")


def fig12_switch(results: Sequence[RunResult], out: Path) -> Path | None:
    runs = [r for r in results if r.switches and r.load is None and r.tau_s is None]
    if not runs:
        return None
    fig, (a, b) = _plt().subplots(1, 2, figsize=(10, 4))
    for r in runs:
        _cdf(a, [1000 * s.latency_s for s in r.switches], r.config)
    a.set(xscale="log", xlabel="Switch latency (ms)", ylabel="CDF", title="(a) Latency")
    a.legend(fontsize=8)
    bottom = [0.0] * len(runs)
    for path in SwitchPath:
        share = [sum(s.path is path for s in r.switches) / len(r.switches) for r in runs]
        b.bar([r.config for r in runs], share, bottom=bottom, label=path.value)
        bottom = [x + y for x, y in zip(bottom, share, strict=False)]
    b.set(ylabel="Fraction of switches", title="(b) Paths")
    b.legend(fontsize=8)
    return _save(fig, out / "fig12_switch.png")


FIGURES = (fig6_sct, fig8_router, fig9_tau, fig11_sp, fig12_switch)


def plots(results: Sequence[RunResult], out_dir: str | Path) -> list[Path]:
    """Write every figure the runs support into out_dir (created); returns the files written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [p for fig in FIGURES if (p := fig(results, out)) is not None]
