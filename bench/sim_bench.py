"""Time the simulator on the paper-shaped fixed replay (960 calls, 30 model-sessions): the five
ablation configurations, seconds per config and in total, plus decisions per second, and a digest
of each run's full result (every call, session, switch and round record) so that two versions of
the simulator can be shown to produce identical results for the same seed.

Run: .venv/bin/python bench/sim_bench.py [--seed N] [--configs Talaria,no-SP,...]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from talariad.perfmodel.profiles import load_set  # noqa: E402
from talariad.replay.generate import fixed_replay  # noqa: E402
from talariad.sim.configs import ablation_configs  # noqa: E402
from talariad.sim.simulator import Simulator  # noqa: E402

FIVE = ("Talaria", "no-SP", "no-HKVR", "H2D-only", "Round-only")
"""The five ablations issue 16's goal counts (fair-share joined the suite later)."""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", help="comma-separated subset of the ablation names")
    args = p.parse_args()
    pset = load_set("paper-tp8")
    trace = fixed_replay(args.seed)
    wanted = set(args.configs.split(",")) if args.configs else None
    total = total_cpu = five = five_cpu = 0.0
    print(
        f"fixed replay, seed {args.seed}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )
    for cfg in ablation_configs(pset, tuple(trace.models())):
        if wanted and cfg.name not in wanted:
            continue
        sim = Simulator(trace, cfg, pset)
        t0, c0 = time.perf_counter(), time.process_time()
        run = sim.run()
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        total += dt
        total_cpu += cpu
        if cfg.name in FIVE:
            five, five_cpu = five + dt, five_cpu + cpu
        sched = next(iter(sim.instances.values())).sched
        actions = sum(r.decode_steps for r in sched.round_summaries) + len(run.switches)
        print(
            f"{cfg.name:<11} {dt:7.2f} s (cpu {cpu:5.2f} s)  calls={len(run.calls)} rounds={len(run.rounds)} "
            f"switches={len(run.switches)} decode+switch actions={actions} ({actions / dt:,.0f}/s) "
            f"result {digest(run)}"
        )
    print(f"{'total':<11} {total:7.2f} s (cpu {total_cpu:5.2f} s)")
    print(
        f"{'the five':<11} {five:7.2f} s (cpu {five_cpu:5.2f} s)  ({', '.join(FIVE)}; "
        f"goal < 5 s: {'met' if five < 5 else 'not met'})"
    )


def digest(run) -> str:
    """A short hash of everything the run produced except its own wall-clock time."""
    fields = dataclasses.asdict(run)
    fields.pop("wall_clock_s", None)
    return hashlib.sha256(repr(fields).encode()).hexdigest()[:12]


if __name__ == "__main__":
    main()
