"""How the pool's picker uses a machine's cores: picker processes side by side on one machine,
each fed the same box snapshots (each polls every box, as replicas do), each placing its own
share of the sessions (as a front that sends a session's calls to one replica would), flat out
for some seconds of real time. Per process count: the calls placed per second in all and per
process, the cores they used, the share of their time in picks (the rest: polls, mostly) and a
pick's time with the polls at their real rate.

    python bench/epp_cores.py [--boxes 256] [--sessions 20000] [--seconds 10] [--json]

`bench/epp_bench.py --part cores` runs the same and puts it under `cores`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import sys
import time
from collections import deque

from epp_bench import PickerPool, _opening, pct

NEW_SHARE = 0.1
"""Calls that open a new session (an agent's first call, a sub-agent's)."""
COST_SHARE = 0.2
"""Calls that return to a session past its lease (the rest return within τ: an agent's tool gap)."""
RECENT = 256
"""Sessions a process keeps as recently called, whose returns come within τ."""


def _worker(index: int, processes: int, boxes: int, sessions: int, seconds: float, start, out):
    """One picker process: its share of `sessions` placed in a burst (as `PickerPool.warm`),
    then calls as fast as it places them for `seconds` of real time, its clock the real one
    (so its polls sweep the boxes every 100 ms of it, `PickerPool.turn`)."""
    rng = random.Random(index)
    pool = PickerPool(boxes, random.Random(0))  # the same boxes and loads in every process
    now, _ = pool.warm(sessions // processes, 1.0)
    sids = list(pool.history)
    recent: deque[str] = deque(sids[-RECENT:], maxlen=RECENT)
    start.wait()  # every process warm: they run side by side
    began, cpu = time.perf_counter(), time.process_time()
    picks: list[tuple[str, float]] = []  # (the router's decision kind, seconds)
    calls = 0
    while (elapsed := time.perf_counter() - began) < seconds:
        at, draw = now + elapsed, rng.random()
        if draw < NEW_SHARE:
            sid = f"p{index}-{calls}"
            pool.history[sid] = _opening(sid)
            sids.append(sid)
        elif draw < NEW_SHARE + COST_SHARE:
            sid = sids[rng.randrange(len(sids))]
        else:
            sid = recent[rng.randrange(len(recent))]
        messages = pool.history[sid] + [{"role": "user", "content": f"turn {calls}"}]
        took = pool.turn(f"{index}-{calls}", sid, messages, at)
        picks.append((pool.picker.explain(f"{index}-{calls}").kind.value, took))
        pool.history[sid] = messages + [{"role": "assistant", "content": "done"}]
        recent.append(sid)
        calls += 1
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    out.put(
        {
            "calls": calls,
            "wall_s": wall,
            "cpu_s": cpu,
            "picks": picks,
            "refused": pool.refused,
        }
    )


def run(processes: int, boxes: int, sessions: int, seconds: float) -> dict:
    """`processes` pickers side by side; their calls/s in all and each, and their CPU's split."""
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(processes), ctx.Queue()
    args = (processes, boxes, sessions, seconds, start, out)
    procs = [ctx.Process(target=_worker, args=(i, *args)) for i in range(processes)]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    cpu = sum(r["cpu_s"] for r in results)
    us = sorted(t * 1e6 for r in results for _, t in r["picks"])
    by_kind: dict[str, list[float]] = {}
    for r in results:
        for kind, t in r["picks"]:
            by_kind.setdefault(kind, []).append(t * 1e6)
    return {
        "processes": processes,
        "boxes": boxes,
        "live_sessions": sessions,
        "calls_per_s": round(sum(r["calls"] / r["wall_s"] for r in results), 1),
        "per_process_calls_per_s": [round(r["calls"] / r["wall_s"], 1) for r in results],
        "cores_used": round(cpu / max(r["wall_s"] for r in results), 2),
        # of the processes' time: in picks (timed around `BoxPicker.pick`); the rest is the box
        # polls' installs, most of it, and the bench's own work
        "pick_share": round(sum(us) / 1e6 / sum(r["wall_s"] for r in results), 3),
        # a pick's time with the polls at their real rate (`epp_bench --part decision` sweeps
        # every box before each pick it times)
        "pick_p50_us": round(pct(us, 0.5), 1),
        "pick_p99_us": round(pct(us, 0.99), 1),
        "by_kind": {
            kind: {
                "picks": len(v),
                "p50_us": round(pct(v, 0.5), 1),
                "p99_us": round(pct(v, 0.99), 1),
            }
            for kind, v in sorted(by_kind.items())
        },
        "refused": sum(r["refused"] for r in results),
    }


def cores(boxes: int, sessions: int, seconds: float) -> list[dict]:
    """`run` for one process and for as many as the machine has cores (at least 2)."""
    counts = sorted({1, max(2, os.cpu_count() or 1)})
    return [run(n, boxes, sessions, seconds) for n in counts]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--boxes", type=int, default=256)
    ap.add_argument("--sessions", type=int, default=20_000, help="live sessions over all processes")
    ap.add_argument("--seconds", type=float, default=10.0, help="real seconds each run places for")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    out = {
        "load_start": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "cores": cores(args.boxes, args.sessions, args.seconds),
        "load_end": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
