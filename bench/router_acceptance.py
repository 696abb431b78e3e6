"""Issue 15's acceptance grid for the router suite: on each trace (the fixed replay and the bundled
real trace, the §5.3 120-call subset and whole sessions) and each seed, at each load, the full
Talaria router against the best peer: SCT p95 and avoidable opens.

A peer is every registered policy but `talaria`; "best" is the lowest SCT p95 (for the SCT check)
and the fewest avoidable opens (for the opens check), each taken over all peers separately.

"Best" is chosen per cell after the fact, and each measure's best may be a different peer, so the
grid also prints two summaries that compare Talaria with one peer at a time: the head-to-head
table (per peer, the cells where Talaria's SCT p95 is lower, equal or higher, the geometric mean of
the ratio, and the cells where Talaria's avoidable opens are no more) and `dominated_by`, the
peers at least as good as Talaria on both SCT p95 and avoidable opens and better on one.

Beside them, each row's longest schedule-aware TTFT (`ttft_max_s`): a peer can win SCT p95 by
holding one model's new sessions until a worker drains (llama-swap's swap rule), and this column
shows what that cost the calls held. The daemon would have answered such a call with a 429 once
it waited the gateway's `queue_timeout_s` (30 s by default); the simulator re-places it instead.
`sct_ok_prompt` repeats the SCT check against only the peers whose every call started within that
timeout (and asks the same of Talaria); the issue's verdict is `sct_ok`.

Run: .venv/bin/python bench/router_acceptance.py [--seeds 0-4] [--traces fixed,swebv]
     [--full | --both] [--swebv PATH] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from talariad.perfmodel.profiles import load_set  # noqa: E402
from talariad.replay.generate import PAPER_MODELS, fixed_replay  # noqa: E402
from talariad.replay.metrics import row_metrics  # noqa: E402
from talariad.replay.swebv import load_swebv  # noqa: E402
from talariad.router import RouterKnobs  # noqa: E402
from talariad.sim import simulator  # noqa: E402
from talariad.sim.__main__ import ROUTER_BOX, on_models, router_subset  # noqa: E402
from talariad.sim.configs import LOADS, router_configs  # noqa: E402
from talariad.sim.simulator import simulate  # noqa: E402

SWEBV = "../shared/traces/swebv_gemini3pro_minisweagent_calls.jsonl.gz"  # from the repo root
QUIET = Console(quiet=True)
QUEUE_TIMEOUT_S = RouterKnobs().queue_timeout_s


def trace_for(name: str, seed: int, full: bool, swebv: str):
    pset = load_set(ROUTER_BOX)
    if name == "fixed":
        trace = fixed_replay(seed)
    else:
        trace = load_swebv(swebv, seed=seed, limit_sessions=30, assign_models=list(PAPER_MODELS))
    trace = on_models(trace, list(pset.models), QUIET)
    return (trace if full else router_subset(trace)), pset


def one(job: tuple[str, int, bool, str, float]) -> list[dict]:
    name, seed, full, swebv, limit = job
    simulator.MAX_VIRTUAL_S = limit  # a configuration that stops making progress is reported
    trace, pset = trace_for(name, seed, full, swebv)
    out = []
    for cfg in router_configs(pset, tuple(trace.models())):
        try:
            run = simulate(trace, cfg, pset)
            r = row_metrics(run)
        except RuntimeError as err:  # no progress: the cell is reported as stuck
            print(f"{name} seed {seed}: {err}", file=sys.stderr)
            out.append(
                {
                    "trace": name,
                    "seed": seed,
                    "full": full,
                    "load": cfg.load,
                    "policy": cfg.policy,
                    "sct_p95_s": math.inf,
                    "sct_p50_s": math.inf,
                    "avoidable_opens": 10**9,
                    "ttft_max_s": math.inf,
                    "stuck": True,
                }
            )
            continue
        out.append(
            {
                "trace": name,
                "seed": seed,
                "full": full,
                "load": r.load,
                "policy": r.policy,
                "sct_p95_s": r.sct_p95_s,
                "sct_p50_s": r.sct_p50_s,
                "avoidable_opens": r.avoidable_opens,
                "ttft_max_s": max(run.ttfts()),
            }
        )
    return out


def cells(rows: list[dict]) -> dict[tuple, dict[str, dict]]:
    """(trace, full, seed, load) -> policy -> its row, in sorted cell order."""
    out: dict[tuple, dict[str, dict]] = {}
    for r in sorted(rows, key=lambda r: (r["trace"], r["full"], r["seed"], r["load"])):
        out.setdefault((r["trace"], r["full"], r["seed"], r["load"]), {})[r["policy"]] = r
    return out


def sct_order(a: dict, b: dict) -> int:
    """-1, 0 or 1 as `a`'s SCT p95 is below, within 1e-9 s of, or above `b`'s."""
    x, y = a["sct_p95_s"], b["sct_p95_s"]
    return -1 if x < y - 1e-9 else (1 if x > y + 1e-9 else 0)


def verdicts(rows: list[dict]) -> list[dict]:
    out = []
    for (trace, full, seed, load), group in cells(rows).items():
        ours = group["talaria"]
        peers = [r for p, r in group.items() if p != "talaria"]
        best_sct = min(peers, key=lambda r: r["sct_p95_s"])
        best_open = min(peers, key=lambda r: r["avoidable_opens"])
        dominated_by = sorted(r["policy"] for r in peers if dominates(r, ours))
        prompt = [r for r in peers if r["ttft_max_s"] <= QUEUE_TIMEOUT_S]
        best_prompt = min(prompt, key=lambda r: r["sct_p95_s"], default=None)
        out.append(
            {
                "trace": trace + (" full" if full else ""),
                "seed": seed,
                "load": load,
                "talaria_sct_p95_s": ours["sct_p95_s"],
                "best_peer_sct_p95_s": best_sct["sct_p95_s"],
                "best_peer_sct": best_sct["policy"],
                "talaria_avoidable_opens": ours["avoidable_opens"],
                "best_peer_avoidable_opens": best_open["avoidable_opens"],
                "talaria_ttft_max_s": ours["ttft_max_s"],
                "best_peer_ttft_max_s": best_sct["ttft_max_s"],
                "sct_ok": sct_order(ours, best_sct) <= 0,
                "opens_ok": ours["avoidable_opens"] <= best_open["avoidable_opens"],
                "dominated_by": dominated_by,
                "best_prompt_peer_sct": best_prompt["policy"] if best_prompt else None,
                "best_prompt_peer_sct_p95_s": best_prompt["sct_p95_s"] if best_prompt else None,
                "sct_ok_prompt": ours["ttft_max_s"] <= QUEUE_TIMEOUT_S
                and (best_prompt is None or sct_order(ours, best_prompt) <= 0),
            }
        )
    return out


def dominates(a: dict, b: dict) -> bool:
    """`a` is no worse than `b` on SCT p95 and avoidable opens, and better on one of them."""
    sct, opens = sct_order(a, b), (a["avoidable_opens"], b["avoidable_opens"])
    return sct <= 0 and opens[0] <= opens[1] and (sct < 0 or opens[0] < opens[1])


def head_to_head(rows: list[dict]) -> list[dict]:
    """Talaria against each peer over every cell: SCT p95 wins, ties and losses, the geometric
    mean of Talaria's SCT p95 over the peer's, and the cells where its avoidable opens are no more."""
    groups = cells(rows).values()
    peers = sorted({r["policy"] for r in rows} - {"talaria"})
    out = []
    for peer in peers:
        pairs = [(c["talaria"], c[peer]) for c in groups if "talaria" in c and peer in c]
        order = [sct_order(t, p) for t, p in pairs]
        ratios = [t["sct_p95_s"] / p["sct_p95_s"] for t, p in pairs]
        finite = [x for x in ratios if 0 < x < math.inf]
        out.append(
            {
                "policy": peer,
                "cells": len(pairs),
                "sct_wins": order.count(-1),
                "sct_ties": order.count(0),
                "sct_losses": order.count(1),
                "sct_p95_ratio_geomean": (
                    math.exp(math.fsum(map(math.log, finite)) / len(finite)) if finite else None
                ),
                "opens_no_more": sum(
                    t["avoidable_opens"] <= p["avoidable_opens"] for t, p in pairs
                ),
            }
        )
    return out


def head_to_head_table(h2h: list[dict]) -> Table:
    table = Table(title="talaria against each peer, over every cell")
    for col in ("peer", "SCT p95 wins/ties/losses", "geomean talaria/peer", "opens no more"):
        table.add_column(col)
    for h in h2h:
        ratio = h["sct_p95_ratio_geomean"]
        table.add_row(
            h["policy"],
            f"{h['sct_wins']}/{h['sct_ties']}/{h['sct_losses']}",
            "-" if ratio is None else f"{ratio:.3f}",
            f"{h['opens_no_more']}/{h['cells']}",
        )
    return table


def seeds(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(x) for x in text.split(",")]


def _print_verdicts(result: list[dict]) -> None:
    """The verdict per cell, then the counts that qualify them."""
    table = Table(title=f"router suite: talaria vs best peer (loads {', '.join(LOADS)})")
    for col in (
        "trace",
        "seed",
        "load",
        "SCT p95 talaria",
        "best peer",
        "opens talaria/best",
        "TTFT max talaria/best",
        "ok",
    ):
        table.add_column(col)
    for v in result:
        table.add_row(
            v["trace"],
            str(v["seed"]),
            v["load"],
            f"{v['talaria_sct_p95_s']:.1f}",
            f"{v['best_peer_sct_p95_s']:.1f} ({v['best_peer_sct']})",
            f"{v['talaria_avoidable_opens']}/{v['best_peer_avoidable_opens']}",
            f"{v['talaria_ttft_max_s']:.1f}/{v['best_peer_ttft_max_s']:.1f}",
            ("sct " if v["sct_ok"] else "SCT-LOSS ") + ("opens" if v["opens_ok"] else "OPENS-LOSS"),
        )
    Console(width=160).print(table)
    met = sum(v["sct_ok"] and v["opens_ok"] for v in result)
    print(f"met {met}/{len(result)}; load average {os.getloadavg()[0]:.2f}")
    held = [v for v in result if not v["sct_ok"] and v["best_peer_ttft_max_s"] > QUEUE_TIMEOUT_S]
    print(
        f"SCT lost to a peer that held a call past the gateway's {QUEUE_TIMEOUT_S:g} s queue"
        f" timeout: {len(held)} of {sum(not v['sct_ok'] for v in result)}"
    )
    prompt_met = sum(v["sct_ok_prompt"] and v["opens_ok"] for v in result)
    print(
        f"met against the peers that started every call within that timeout: {prompt_met}"
        f"/{len(result)}"
    )
    dominated = [v for v in result if v["dominated_by"]]
    print(
        "talaria dominated (a peer as good on SCT p95 and avoidable opens, better on one):"
        f" {len(dominated)} of {len(result)}"
        + "".join(
            f"; {v['trace']} {v['seed']} {v['load']} by {', '.join(v['dominated_by'])}"
            for v in dominated
        )
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seeds", default="0-4")
    p.add_argument("--traces", default="fixed,swebv")
    p.add_argument("--full", action="store_true", help="whole sessions instead of the subset")
    p.add_argument("--both", action="store_true", help="the subset and whole sessions")
    p.add_argument("--swebv", default=SWEBV, help="the real trace (*_calls.jsonl.gz)")
    p.add_argument("--json", metavar="FILE")
    p.add_argument(
        "--max-virtual-s",
        type=float,
        default=1e5,
        help="a configuration still running at this virtual time is reported as stuck",
    )
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = p.parse_args()
    fulls = [False, True] if args.both else [args.full]
    jobs = [
        (t, s, f, args.swebv, args.max_virtual_s)
        for f in fulls
        for t in args.traces.split(",")
        for s in seeds(args.seeds)
    ]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = [r for part in pool.map(one, jobs) for r in part]
    result = verdicts(rows)
    _print_verdicts(result)
    h2h = head_to_head(rows)
    Console(width=160).print(head_to_head_table(h2h))
    if args.json:
        doc = {"rows": rows, "verdicts": result, "head_to_head": h2h}
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
