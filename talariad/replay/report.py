"""Side-by-side report of several runs: a rich table, the same numbers as JSON, and the ratio
lines against the paper's headline numbers (§5.2)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from talariad.replay.metrics import RowMetrics, RunResult, row_metrics
from talariad.types import SwitchPath

# §5.2, Figures 6-7: p50 / p95 SCT (s) of the TP=8 fixed replay; None where the paper gives no p95.
PAPER_SCT_S: dict[str, tuple[float, float | None]] = {
    "Talaria": (189.0, 867.0),
    "no-SP": (623.0, None),
    "no-HKVR": (486.0, None),
    "H2D-only": (194.0, 933.0),
    "Round-only": (1000.0, 2296.0),
}
PAPER_SPEEDUP = (5.3, 2.6)  # Talaria vs Round-only, p50 and p95 SCT (§5.2)


def rows(results: Sequence[RunResult]) -> list[RowMetrics]:
    return [row_metrics(r) for r in results]


def _pair(a: float | None, b: float | None, scale: float = 1.0, fmt: str = "{:.2f}") -> str:
    def one(x):
        return "-" if x is None else fmt.format(x * scale)

    return f"{one(a)} / {one(b)}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _n(x: int | None) -> str:
    return "-" if x is None else str(x)


def _path_cell(row: RowMetrics, path: SwitchPath) -> str:
    st = row.switch_by_path.get(path.value)
    if st is None:
        return "-"
    return f"{_pair(st.p50_s, st.p95_s, 1000, '{:.0f}')} (n={st.count})"


BOTH, INSTANCE, PLACEMENT, TAU = "both", "instance", "placement", "tau"
COLUMNS = (  # (header, cell, the views that print it)
    ("config", lambda r: r.config, (BOTH,)),
    ("SCT p50/p95 s", lambda r: _pair(r.sct_p50_s, r.sct_p95_s, fmt="{:.1f}"), (BOTH,)),
    ("TTFT p50/p95 s", lambda r: _pair(r.ttft_p50_s, r.ttft_p95_s), (BOTH,)),
    (
        "return TTFT p50/p95 s",
        lambda r: _pair(r.returning_ttft_p50_s, r.returning_ttft_p95_s),
        (PLACEMENT, TAU),
    ),
    ("D2D p50/p95 ms", lambda r: _path_cell(r, SwitchPath.D2D), (INSTANCE,)),
    ("partial p50/p95 ms", lambda r: _path_cell(r, SwitchPath.PARTIAL), (INSTANCE,)),
    ("H2D p50/p95 ms", lambda r: _path_cell(r, SwitchPath.H2D), (INSTANCE,)),
    ("switch share", lambda r: _pct(r.switch_share), (BOTH,)),
    ("rounds", lambda r: _n(r.rounds), (INSTANCE,)),
    ("switches", lambda r: _n(r.switches), (BOTH,)),
    (
        "HBM peak GiB",
        lambda r: "-" if r.hbm_peak_gib is None else f"{r.hbm_peak_gib:.1f}",
        (INSTANCE,),
    ),
    ("opens", lambda r: _n(r.model_opens), (PLACEMENT, TAU)),
    ("avoidable opens", lambda r: _n(r.avoidable_opens), (PLACEMENT,)),
    ("same-inst return", lambda r: _pct(r.same_instance_rate), (PLACEMENT, TAU)),
    ("residency hit", lambda r: _pct(r.residency_hit_rate), (PLACEMENT, TAU)),
    ("unused lease", lambda r: _pct(r.unused_lease_rate), (TAU,)),
    ("SP adm/parked", lambda r: f"{_n(r.sp_admitted)}/{_n(r.sp_parked)}", (INSTANCE,)),
    (
        "parked calls/times",
        lambda r: f"{_n(r.parked_calls)}/{_n(r.parks)}",
        (INSTANCE,),
    ),
    (
        "park cost s",
        lambda r: "-" if r.park_cost_s is None else f"{r.park_cost_s:.0f}",
        (INSTANCE,),
    ),
    ("slowdown p50/p95", lambda r: _pair(r.slowdown_p50, r.slowdown_p95), (BOTH,)),
)
VIEWS = {  # suite -> the views whose columns can vary in it
    "ablations": (BOTH, INSTANCE),  # one instance: nowhere to route, placement cannot vary
    "router": (BOTH, PLACEMENT),  # fixed per-path switch costs: the instance columns do not
    "tau": (BOTH, TAU),  # Fig. 9's five measures, with SCT and TTFT
}


def columns(suite: str | None) -> list[tuple]:
    """The columns of a suite's table (`VIEWS`); None: every column (a real-mode replay)."""
    views = VIEWS.get(suite) if suite is not None else None
    return [c for c in COLUMNS if views is None or any(v in views for v in c[2])]


def table(
    results: Sequence[RunResult],
    title: str = "Replay",
    paper: bool = False,
    suite: str | None = None,
) -> Table:
    """One row per run; with `paper`, a column of the paper's SCT p50/p95 where it has one."""
    cols = columns(suite)
    t = Table(title=title, show_lines=False)
    for name, _, _ in cols:
        t.add_column(name, justify="left" if name == "config" else "right", overflow="fold")
    if paper:
        t.add_column("paper SCT p50/p95 s", justify="right")
    for row in rows(results):
        cells = [fn(row) for _, fn, _ in cols]
        if paper:
            ref = PAPER_SCT_S.get(row.config)
            cells.append(_pair(*ref, fmt="{:.0f}") if ref else "-")
        t.add_row(*cells)
    return t


def speedup_line(
    results: Sequence[RunResult], target: str = "Talaria", base: str = "Round-only"
) -> str | None:
    """'Round-only / Talaria SCT: p50 4.1x, p95 2.2x (paper 5.3x, 2.6x)', or None if either is absent."""
    by = {r.config: row_metrics(r) for r in results}
    if target not in by or base not in by:
        return None
    t, b = by[target], by[base]
    p50 = b.sct_p50_s / t.sct_p50_s if t.sct_p50_s and b.sct_p50_s is not None else None
    p95 = b.sct_p95_s / t.sct_p95_s if t.sct_p95_s and b.sct_p95_s is not None else None
    return (
        f"{base} / {target} SCT: p50 {_x(p50)}, p95 {_x(p95)} "
        f"(paper {PAPER_SPEEDUP[0]}x, {PAPER_SPEEDUP[1]}x)"
    )


def bound_line(results: Sequence[RunResult]) -> str:
    """The strict multiplexing bound of the replayed trace (`talariad.replay.bounds`): no
    configuration's SCT p50 / p95 can be below it; '-' where sessions did not start together."""
    measured = [r for r in results if r.rank_bounds]
    if not measured:
        return "strict bound SCT p50 / p95: - (sessions do not all start at t = 0)"
    row = row_metrics(measured[0])
    return (
        f"strict bound SCT p50 / p95: {row.bound_p50_s:.1f} / {row.bound_p95_s:.1f} s "
        f"(paper Talaria {PAPER_SCT_S['Talaria'][0]:.0f} / {PAPER_SCT_S['Talaria'][1]:.0f} s)"
    )


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def print_report(
    results: Sequence[RunResult],
    console: Console | None = None,
    title: str = "Replay",
    paper: bool = False,
    suite: str | None = None,
) -> None:
    console = console or Console()
    console.print(table(results, title=title, paper=paper, suite=suite))
    console.print(bound_line(results))
    line = speedup_line(results)
    if line:
        console.print(line)


def to_json_obj(results: Sequence[RunResult]) -> dict:
    """The table's numbers (and a few more) as plain JSON types."""
    return {
        "rows": [dataclasses.asdict(r) for r in rows(results)],
        "speedup": speedup_line(results),
    }


def to_json(results: Sequence[RunResult], indent: int | None = 2) -> str:
    return json.dumps(to_json_obj(results), indent=indent)
