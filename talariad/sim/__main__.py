"""`python -m talariad.sim compare`: run one trace under a suite of configurations and print the
replay report (with per-session slowdowns over the strict bound and the Talaria / Round-only ratio line)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from talariad.checks import load_checked
from talariad.config import ConfigError
from talariad.perfmodel.profiles import ProfileSet, load_set
from talariad.replay.generate import PAPER_MODELS, characterization, fixed_replay
from talariad.replay.progress import progress_bar
from talariad.replay.report import print_report, to_json
from talariad.replay.swebv import load_swebv
from talariad.replay.trace import Trace, TraceError, read_jsonl
from talariad.router.box_policies import POLICY_ORDER
from talariad.sim.configs import SUITES, SimConfig, config_models, from_config, map_models, suite
from talariad.sim.pool import ROW_FIELDS, SESSIONS_PER_BOX, pool_trace, run_pool
from talariad.sim.shift_report import shift_compare
from talariad.sim.simulator import simulate

ROUTER_CALLS, ROUTER_SESSIONS = 120, 30  # §5.3: a 120-call, 30-model-session subset


def router_subset(
    trace: Trace, calls: int = ROUTER_CALLS, sessions: int = ROUTER_SESSIONS
) -> Trace:
    """The first `sessions` sessions, each cut to an equal share of `calls` (at least 1 call)."""
    chosen = trace.sessions[:sessions]
    per = max(calls // max(len(chosen), 1), 1)
    return Trace(s[:per] for s in chosen)


def load_trace(args) -> Trace:
    if args.swebv:
        return load_swebv(
            args.swebv,
            seed=args.seed,
            limit_sessions=args.limit_sessions,
            assign_models=list(PAPER_MODELS),
        )
    if args.trace == "fixed":
        return fixed_replay(args.seed)
    if args.trace == "characterization":
        return characterization(args.limit_sessions or 445, args.seed)
    path = Path(args.trace)
    if not path.is_file():
        raise ValueError(
            f"--trace: no such file {args.trace!r} (or use 'fixed' / 'characterization')"
        )
    trace = read_jsonl(path)
    if args.limit_sessions:
        trace = Trace(trace.sessions[: args.limit_sessions])
    return trace


ROUTER_BOX = "router-tp4"  # §5.1: the router experiments' two TP=4 workers
SUITE_BOX = {"ablations": "paper-tp8", "router": ROUTER_BOX, "tau": ROUTER_BOX}

Run = tuple[SimConfig, Trace, ProfileSet]


def on_models(trace: Trace, served: list[str], console: Console) -> Trace:
    """The trace with its models renamed onto `served` (`map_models`), saying so when it moves."""
    mapping = map_models(trace.models(), served)
    if all(a == b for a, b in mapping.items()):
        return trace
    console.print("trace models: " + ", ".join(f"{a} -> {b}" for a, b in mapping.items()))
    return Trace(
        [dataclasses.replace(c, model=mapping[c.model]) for c in s] for s in trace.sessions
    )


def plan(
    trace: Trace, suites: list[str], profiles: str | None, full: bool, console: Console
) -> list[Run]:
    """Each suite on its own box (`SUITE_BOX`) unless `profiles` names one box for all; the router
    and τ suites replay the §5.3 subset (`router_subset`) unless `full`."""
    out: list[Run] = []
    for name in suites:
        pset = load_set(profiles or SUITE_BOX[name])
        models = list(pset.models)
        mapped = on_models(trace, models, console)
        replay = mapped if name == "ablations" or full else router_subset(mapped)
        out += [(cfg, replay, pset) for cfg in suite(name, pset, tuple(mapped.models()))]
    return out


def config_plan(
    trace: Trace, suites: list[str], path: str, full: bool, console: Console
) -> list[Run]:
    """Runs over an operator's config: its instances, models, pools, knobs and named profiles."""
    cfg = load_checked(path, serving=False)
    trace = on_models(trace, config_models(cfg), console)
    small = trace if full else router_subset(trace)
    out: list[Run] = []
    for name in suites:
        configs, pset = from_config(cfg, name)
        out += [(c, trace if name == "ablations" else small, pset) for c in configs]
    return out


def compare(args) -> int:
    if args.suite == "pool":
        return pool_compare(args)
    if args.suite == "shift":
        return shift_compare(args)
    trace = load_trace(args)
    if not trace.sessions:
        raise ValueError("the trace has no sessions")
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    console = Console(width=args.width) if args.width else Console()
    if args.config:
        runs = config_plan(trace, suites, args.config, args.full_sessions, console)
    else:
        runs = plan(trace, suites, args.profiles, args.full_sessions, console)
    total = sum(len(t.sessions) for _, t, _ in runs)
    results = []
    with progress_bar(total, "simulating", enabled=not args.no_progress) as advance:
        for cfg, t, pset in runs:
            advance(0, description=cfg.name)
            results.append(simulate(t, cfg, pset, on_session_done=advance))
    source = args.swebv or args.trace
    for name in dict.fromkeys(_suite_of(cfg) for cfg, _, _ in runs):
        picked = [
            (r, t, p)
            for (cfg, t, p), r in zip(runs, results, strict=False)
            if _suite_of(cfg) == name
        ]
        t, pset = picked[0][1], picked[0][2]
        title = f"{name}: {source} ({t.n_calls} calls, {len(t)} sessions, seed {args.seed}, box {pset.name})"
        paper = name == "ablations" and not args.config  # the paper's numbers are for its box
        print_report(
            [r for r, _, _ in picked], console=console, title=title, paper=paper, suite=name
        )
    console.print(
        "wall-clock per config: " + ", ".join(f"{r.config} {r.wall_clock_s:.1f}s" for r in results)
    )
    if args.json:
        Path(args.json).write_text(to_json(results))
    if args.plots:
        from talariad.replay.plots import plots

        for path in plots(results, args.plots):
            console.print(f"wrote {path}")
    return 0


def pool_compare(args) -> int:
    """`--suite pool`: every box picker over each pool size in `--boxes`; a table, or the rows
    as JSON (`--json FILE`, `-` for stdout instead of the table)."""
    pset = load_set(args.profiles or ROUTER_BOX)
    models, per = list(pset.models), args.sessions_per_box
    sizes = parse_boxes(args.boxes)
    total = sum(n * per for n in sizes) * len(POLICY_ORDER)
    rows = []
    quiet = args.no_progress or args.json == "-"
    with progress_bar(total, "simulating", enabled=not quiet) as advance:
        for n in sizes:
            trace = pool_trace(n, per, args.seed, models)
            for picker in POLICY_ORDER:
                advance(0, description=f"{picker}@{n}")
                rows.append(run_pool(n, picker, trace, pset, on_session_done=advance))
    if args.json:
        text = json.dumps({"rows": rows}, indent=1)  # the shape of every suite's JSON
        if args.json == "-":
            print(text)
            return 0
        Path(args.json).write_text(text)
    console = Console(width=args.width or POOL_WIDTH)
    title = (
        f"pool: {per} sessions per box (characterization, seed {args.seed}); "
        f"a box = the router testbed (two {pset.name} workers)"
    )
    console.print(pool_table(rows, title))
    return 0


POOL_WIDTH = 110  # the pool table's default width: every column header whole


def parse_boxes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--boxes: expected comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--boxes: pool sizes must be >= 1, got {text!r}")
    return sizes


def pool_table(rows: list[dict], title: str) -> Table:
    table = Table(title=title)
    for field in ROW_FIELDS:
        table.add_column(field, justify="left" if field == "policy" else "right")
    for row in rows:
        table.add_row(*(_cell(row[f]) for f in ROW_FIELDS))
    return table


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _suite_of(cfg: SimConfig) -> str:
    return "router" if cfg.load else "tau" if cfg.tau_s is not None else "ablations"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m talariad.sim", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare", help="run a trace under a suite of configurations")
    c.add_argument("--trace", default="fixed", help="fixed | characterization | PATH.jsonl[.gz]")
    c.add_argument(
        "--swebv",
        metavar="PATH",
        help="a real *_calls.jsonl.gz trace (spread over the paper's models)",
    )
    c.add_argument("--limit-sessions", type=int, help="keep the first N sessions")
    c.add_argument("--suite", choices=(*SUITES, "pool", "shift", "all"), default="ablations")
    c.add_argument(
        "--boxes", default="2,4,8,16", help="pool suite: pool sizes, comma-separated boxes"
    )
    c.add_argument(
        "--sessions-per-box",
        type=int,
        default=SESSIONS_PER_BOX,
        help="pool suite: sessions per box (the workload grows with the pool)",
    )
    c.add_argument("--seed", type=int, default=0)
    c.add_argument(
        "--profiles",
        help="bundled profile set name or a YAML path for every suite (default: the paper's "
        "boxes, paper-tp8 for the ablations and router-tp4 for the router and tau suites)",
    )
    c.add_argument(
        "--full-sessions",
        action="store_true",
        help="router and tau suites: replay whole sessions, not the 120-call subset (§5.3)",
    )
    c.add_argument(
        "--config",
        metavar="TALARIA_YAML",
        help="simulate this config's instances, models, pools and knobs (instead of --profiles)",
    )
    c.add_argument(
        "--json", metavar="FILE", help="write the results as JSON (pool, shift: - = stdout)"
    )
    c.add_argument("--plots", metavar="DIR")
    c.add_argument("--no-progress", action="store_true")
    c.add_argument("--width", type=int, help="console width for the table")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.limit_sessions is not None and args.limit_sessions < 1:
        print("error: --limit-sessions must be >= 1", file=sys.stderr)
        return 2
    if args.sessions_per_box < 1:
        print("error: --sessions-per-box must be >= 1", file=sys.stderr)
        return 2
    if args.width is not None and args.width < 40:
        print("error: --width must be at least 40 columns", file=sys.stderr)
        return 2
    try:
        return compare(args)
    except ConfigError as e:
        for line in e.lines:
            print(f"error: {line}", file=sys.stderr)
        return 2
    except (TraceError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
