"""Does the simulator predict a real run? The same scaled trace and config, replayed on a real
`talariad` (the built-in torch engine, wall clock) and in the simulator (the `tiny-torch` profile,
which `bench/calibrate_tiny.py` measured on the torch engine), for Talaria and Round-only, side by side.

The real side is `bench/e2e_replay.py` (the default config's cold pool, Round-only with SP, HKVR and
D2D off). The simulated side replays the calls the real Talaria run sent: each call's prompt and
completion tokens as the server counted them, its reusable prefix (the trace's reused share of
the previous prompt + answer), its capped gap, on the same config (`talariad.sim.configs.
from_config`: the config's instances, models, knobs and profiles). Nothing is fitted to either
side's SCT or TTFT; a column not measured prints `-`.

Run: .venv/bin/python bench/sim_vs_real.py [--sessions 9] [--max-calls 12] [--scale 50]
     [--output-scale 4] [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import e2e_replay  # noqa: E402

from talariad.config import load_config  # noqa: E402
from talariad.perfmodel.profiles import load_set  # noqa: E402
from talariad.replay.metrics import row_metrics  # noqa: E402
from talariad.replay.scale import load_trace, map_models, scale_trace  # noqa: E402
from talariad.replay.trace import Trace, TraceCall  # noqa: E402
from talariad.sim.configs import from_config  # noqa: E402
from talariad.sim.simulator import simulate  # noqa: E402

FIELDS = (("SCT p50", "sct_p50_s"), ("SCT p95", "sct_p95_s"), ("TTFT p50", "ttft_p50_s"))
FIELDS += (("TTFT p95", "ttft_p95_s"), ("rounds", "rounds"))


def sim_trace(scaled, usage) -> Trace:
    """The calls the real run sent, in the server's token counts (`usage`)."""
    by = {(u.session_id, u.call_idx): u for u in usage}
    sessions = []
    for s in scaled:
        calls, prev = [], None
        for c in s:
            u = by.get((c.session_id, c.call_idx))
            if u is None:  # the real run did not finish this call: the session ends here
                break
            prefix = 0
            if prev is not None:
                context = prev.prompt_tokens + prev.completion_tokens
                prefix = min(int(c.reuse * context), u.prompt_tokens)
            calls.append(
                TraceCall(
                    c.session_id,
                    c.call_idx,
                    c.model,
                    u.prompt_tokens,
                    prefix,
                    max(u.completion_tokens, 1),
                    c.gap_s if c.call_idx else 0.0,
                )
            )
            prev = u
        if calls:
            sessions.append(calls)
    return Trace(sessions)


def cell(v, fmt="{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=9)
    p.add_argument("--max-calls", type=int, default=12)
    p.add_argument("--scale", type=float, default=50.0)
    p.add_argument("--output-scale", type=float, default=4.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=240.0)
    p.add_argument("--ready-timeout", type=float, default=180.0)
    p.add_argument(
        "--profiles", default="tiny-torch", help="the measured profile set (its model `tiny`)"
    )
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args()
    args.with_hot, args.device_ids = False, None
    real = {
        name: e2e_replay.run_config(name, abl, args) for name, abl in e2e_replay.CONFIGS.items()
    }
    with tempfile.TemporaryDirectory(prefix="talaria-simreal-") as tmp:
        cfg = load_config(e2e_replay.write_config(Path(tmp), {}, False))
    configs, pset = from_config(cfg, "ablations")
    measured = load_set(args.profiles).models["tiny"]  # bench/calibrate_tiny.py's numbers
    pset = dataclasses.replace(pset, name=args.profiles, models={m: measured for m in pset.models})
    served = sorted({m for i in cfg.instances for m in i.models})
    trace = load_trace("fixed", args.seed, args.sessions)
    models = map_models(trace.models(), served)
    scaled = scale_trace(trace, models, args.scale, args.output_scale, 10.0, args.max_calls)
    replay = sim_trace(scaled, real["Talaria"].usage)
    rows = {}
    for name in e2e_replay.CONFIGS:
        sim_cfg = next(c for c in configs if c.name == name)
        rows[name] = (
            row_metrics(simulate(replay, sim_cfg, pset)),
            row_metrics(real[name].run),
        )
    print(
        f"\nfixed-replay shape seed {args.seed}: {args.sessions} model-sessions x first "
        f"{args.max_calls} calls, prompts / {args.scale:g}, outputs / {args.output_scale:g}; "
        f"simulated on profile {pset.name} ({replay.n_calls} calls the real Talaria run sent)"
    )
    print(f"{'config':<11}{'measure':<10}{'simulated':>11}{'real':>11}{'sim / real':>12}")
    out = {}
    for name, (sim, rl) in rows.items():
        out[name] = {}
        for label, f in FIELDS:
            a, b = getattr(sim, f), getattr(rl, f)
            ratio = a / b if a is not None and b else None
            out[name][f] = {"sim": a, "real": b, "ratio": ratio}
            print(f"{name:<11}{label:<10}{cell(a):>11}{cell(b):>11}{cell(ratio, '{:.2f}x'):>12}")
    for which, idx in (("simulated", 0), ("real", 1)):
        t, r = rows["Talaria"][idx], rows["Round-only"][idx]
        if t.sct_p50_s and r.sct_p50_s is not None:
            print(
                f"Round-only / Talaria SCT ({which}): p50 {r.sct_p50_s / t.sct_p50_s:.2f}x, "
                f"p95 {cell(r.sct_p95_s / t.sct_p95_s if t.sct_p95_s else None)}x"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
