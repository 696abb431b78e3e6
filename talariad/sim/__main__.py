"""`python -m talariad.sim compare`: run one trace under a suite of configurations and print the
replay report (with per-session slowdowns over the strict bound and the Talaria / Round-only ratio line)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from rich.console import Console

from talariad.replay.generate import PAPER_MODELS, characterization, fixed_replay
from talariad.replay.progress import progress_bar
from talariad.replay.report import print_report, to_json
from talariad.replay.swebv import load_swebv
from talariad.replay.trace import Trace, TraceError, read_jsonl
from talariad.config import ConfigError, load_config
from talariad.sim.configs import SUITES, SimConfig, from_config, map_models, suite
from talariad.sim.profiles import ProfileSet, load_set
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


def plan(trace: Trace, suites: list[str], pset: ProfileSet) -> list[tuple[SimConfig, Trace]]:
    models = tuple(trace.models())
    small = router_subset(trace)
    out = []
    for name in suites:
        out += [(cfg, trace if name == "ablations" else small) for cfg in suite(name, pset, models)]
    return out


def config_plan(trace: Trace, suites: list[str], path: str, console: Console):
    """Runs over an operator's config: its instances, models, pools, knobs and named profiles."""
    cfg = load_config(path)
    mapping = map_models(trace.models(), cfg)
    if any(a != b for a, b in mapping.items()):
        pairs = ", ".join(f"{a} -> {b}" for a, b in mapping.items())
        console.print(f"trace models on config models: {pairs}")
        trace = Trace(
            [dataclasses.replace(c, model=mapping[c.model]) for c in s] for s in trace.sessions
        )
    small = router_subset(trace)
    out, pset = [], None
    for name in suites:
        configs, pset = from_config(cfg, name)
        out += [(c, trace if name == "ablations" else small) for c in configs]
    return out, pset, trace


def compare(args) -> int:
    trace = load_trace(args)
    if not trace.sessions:
        raise ValueError("the trace has no sessions")
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    console = Console(width=args.width) if args.width else Console()
    if args.config:
        runs, pset, trace = config_plan(trace, suites, args.config, console)
    else:
        pset = load_set(args.profiles)
        runs = plan(trace, suites, pset)
    total = sum(len(t.sessions) for _, t in runs)
    results = []
    with progress_bar(total, "simulating", enabled=not args.no_progress) as advance:
        for cfg, t in runs:
            advance(0, description=cfg.name)
            results.append(simulate(t, cfg, pset, on_session_done=advance))
    title = f"{args.swebv or args.trace} ({trace.n_calls} calls, {len(trace)} sessions, seed {args.seed})"
    for name in dict.fromkeys(_suite_of(cfg) for cfg, _ in runs):
        picked = [r for (cfg, _), r in zip(runs, results) if _suite_of(cfg) == name]
        paper = name == "ablations" and not args.config  # the paper's numbers are for its box
        print_report(picked, console=console, title=f"{name}: {title}", paper=paper)
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
    c.add_argument("--suite", choices=(*SUITES, "all"), default="ablations")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument(
        "--profiles", default="paper-tp8", help="bundled profile set name or a YAML path"
    )
    c.add_argument(
        "--config",
        metavar="TALARIA_YAML",
        help="simulate this config's instances, models, pools and knobs (instead of --profiles)",
    )
    c.add_argument("--json", metavar="FILE")
    c.add_argument("--plots", metavar="DIR")
    c.add_argument("--no-progress", action="store_true")
    c.add_argument("--width", type=int, help="console width for the table")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.limit_sessions is not None and args.limit_sessions < 1:
        print("error: --limit-sessions must be >= 1", file=sys.stderr)
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
