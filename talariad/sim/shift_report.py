"""`compare --suite shift`: every policy of `talariad.sim.shift` on the shifting workload and the
stationary control; a table per workload with the acceptance ratios, or `--json FILE` rows."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from talariad.perfmodel.profiles import load_set
from talariad.replay.progress import progress_bar
from talariad.sim.shift import (
    POLICIES,
    ROW_FIELDS,
    rows,
    run_policy,
    shift_phases,
    stationary_phases,
    workload,
)

SHIFT_WIDTH = 130


def shift_compare(args) -> int:
    pset = load_set(args.profiles or "paper-tp8")
    models = list(pset.models)
    if len(models) < 3:
        raise ValueError(
            f"the shift suite needs three models; profile set {pset.name!r} has {models}"
        )
    loads = {
        "shift": workload("shift", shift_phases(models), args.seed),
        "stationary": workload("stationary", stationary_phases(models), args.seed),
    }
    out, notes = [], []
    quiet = args.no_progress or args.json == "-"
    total = len(loads) * len(POLICIES)
    with progress_bar(total, "simulating", enabled=not quiet) as advance:
        for wl in loads.values():
            for policy in POLICIES:
                advance(0, description=f"{wl.name}: {policy}")
                run = run_policy(policy, wl, pset, models)
                out += rows(wl, run, models)
                if run.note:
                    notes.append(f"{wl.name}: {policy} = {run.note}")
                advance(1)
    if args.json:
        text = json.dumps({"rows": out}, indent=1)
        if args.json == "-":
            print(text)
            return 0
        Path(args.json).write_text(text)
    console = Console(width=args.width or SHIFT_WIDTH)
    for name, wl in loads.items():
        title = (
            f"{name}: {len(wl.trace)} sessions, {wl.trace.n_calls} calls over "
            f"{wl.duration_s / 3600:.1f} h (seed {args.seed}), box hot0 + cold0 on {pset.name}"
        )
        console.print(table([r for r in out if r["workload"] == name], title))
    for line in notes + ratios(out):
        console.print(line)
    return 0


def table(rows_: list[dict], title: str) -> Table:
    t = Table(title=title)
    for f in ROW_FIELDS[1:]:
        t.add_column(f, justify="left" if f in ("phase", "policy") else "right")
    for r in rows_:
        t.add_row(*(_cell(r[f]) for f in ROW_FIELDS[1:]))
    return t


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def ratios(out: list[dict]) -> list[str]:
    """The acceptance figures over the whole run (`all`)."""

    def p95(workload: str, policy: str) -> float | None:
        return next(
            (
                r["sct_p95_s"]
                for r in out
                if (r["workload"], r["phase"], r["policy"]) == (workload, "all", policy)
            ),
            None,
        )

    lines = []
    auto, static, oracle = (
        p95("shift", "auto"),
        p95("shift", "static"),
        p95("shift", "oracle-static"),
    )
    if auto and static and oracle:
        lines.append(
            f"shift: static / auto SCT p95 = {static / auto:.2f}x; "
            f"auto vs oracle-static {100 * (auto / oracle - 1):+.1f}%"
        )
    auto, static = p95("stationary", "auto"), p95("stationary", "static")
    if auto and static:
        per_hour = next(
            r["moves_per_model_hour"]
            for r in out
            if (r["workload"], r["phase"], r["policy"]) == ("stationary", "all", "auto")
        )
        lines.append(
            f"stationary: auto vs static SCT p95 {100 * (auto / static - 1):+.1f}%; "
            f"{per_hour:.2f} moves per model-hour"
        )
    return lines
