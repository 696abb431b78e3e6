"""`python -m talariad.replay`: trace statistics, synthetic traces and real-trace conversion."""

from __future__ import annotations

import argparse
import json
import sys

from talariad.replay.client import add_run_parser, run_command
from talariad.replay.generate import PAPER_MODELS, characterization, fixed_replay
from talariad.replay.metrics import nearest_rank
from talariad.replay.swebv import load_swebv
from talariad.replay.trace import Trace, TraceError, read_jsonl, write_jsonl


def trace_stats(trace: Trace) -> dict:
    """Counts and nearest-rank p50/p95 of depth, prompt, output and gap (the §2.1 quantities)."""
    calls = list(trace.calls())
    conts = [c for c in calls if c.call_idx > 0]
    prev = {(c.session_id, c.call_idx): c for c in calls}
    over_half = [
        c.prefix_tokens > 0.5 * _context(prev[(c.session_id, c.call_idx - 1)]) for c in conts
    ]

    def pp(xs):
        return {"p50": nearest_rank(xs, 50), "p95": nearest_rank(xs, 95)}

    return {
        "sessions": len(trace),
        "calls": len(calls),
        "models": trace.models(),
        "depth": pp([len(s) for s in trace]),
        "prompt_tokens": pp([c.prompt_tokens for c in calls]),
        "output_tokens": pp([c.output_tokens for c in calls]),
        "gap_s": pp([c.gap_s for c in conts]),
        "reuse_over_half": sum(over_half) / len(over_half) if over_half else None,
    }


def _context(c) -> int:
    return c.prompt_tokens + c.output_tokens


def _model_map(pairs: list[str] | None) -> dict[str, str]:
    bad = [kv for kv in pairs or [] if "=" not in kv or not all(kv.split("=", 1))]
    if bad:
        raise ValueError(f"--model-map expects FROM=TO pairs, got {bad[0]!r}")
    return dict(kv.split("=", 1) for kv in pairs or [])


def _load(args) -> Trace:
    if args.limit_sessions is not None and args.limit_sessions < 1:
        raise ValueError("--limit-sessions must be >= 1")
    if args.format == "swebv":
        return load_swebv(
            args.trace,
            seed=args.seed,
            limit_sessions=args.limit_sessions,
            model_map=_model_map(args.model_map),
            assign_models=args.assign_models,
        )
    if args.model_map or args.assign_models:
        raise ValueError("--model-map and --assign-models apply to --format swebv only")
    trace = read_jsonl(args.trace)
    return Trace(trace.sessions[: args.limit_sessions]) if args.limit_sessions else trace


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m talariad.replay", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("stats", "convert"):
        s = sub.add_parser(
            name, help="print trace statistics" if name == "stats" else "write a trace as JSONL"
        )
        s.add_argument("trace", help="trace file (.jsonl or .jsonl.gz)")
        if name == "convert":
            s.add_argument("out", help="output JSONL path")
        s.add_argument("--format", choices=("jsonl", "swebv"), default="jsonl")
        s.add_argument("--seed", type=int, default=0, help="seed of the modelled gaps (swebv)")
        s.add_argument("--limit-sessions", type=int)
        s.add_argument("--model-map", nargs="*", metavar="FROM=TO")
        s.add_argument("--assign-models", nargs="*", metavar="MODEL")
    g = sub.add_parser("generate", help="write a synthetic trace")
    g.add_argument("kind", choices=("characterization", "fixed"))
    g.add_argument("out")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--sessions", type=int, default=445, help="characterization only")
    add_run_parser(sub)
    args = p.parse_args(argv)
    try:
        return _run(args)
    except (TraceError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(args) -> int:
    if args.cmd == "run":
        return run_command(args)
    if args.cmd == "generate":
        trace = (
            fixed_replay(args.seed)
            if args.kind == "fixed"
            else characterization(args.sessions, args.seed, PAPER_MODELS)
        )
        write_jsonl(trace, args.out)
    else:
        trace = _load(args)
        if args.cmd == "convert":
            write_jsonl(trace, args.out)
    print(json.dumps(trace_stats(trace), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
