"""Time the simulator on the paper-shaped fixed replay (960 calls, 30 model-sessions): the five
ablation configurations, seconds per config and in total, plus decisions per second.

Run: .venv/bin/python bench/sim_bench.py [--seed N] [--configs Talaria,no-SP,...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from talariad.replay.generate import fixed_replay  # noqa: E402
from talariad.sim.configs import ablation_configs  # noqa: E402
from talariad.sim.profiles import load_set  # noqa: E402
from talariad.sim.simulator import Simulator  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", help="comma-separated subset of the ablation names")
    args = p.parse_args()
    pset = load_set("paper-tp8")
    trace = fixed_replay(args.seed)
    wanted = set(args.configs.split(",")) if args.configs else None
    total = 0.0
    for cfg in ablation_configs(pset, tuple(trace.models())):
        if wanted and cfg.name not in wanted:
            continue
        sim = Simulator(trace, cfg, pset)
        t0 = time.perf_counter()
        run = sim.run()
        dt = time.perf_counter() - t0
        total += dt
        sched = next(iter(sim.instances.values())).sched
        actions = sum(r.decode_steps for r in sched.round_summaries) + len(run.switches)
        print(f"{cfg.name:<11} {dt:7.2f} s  calls={len(run.calls)} rounds={len(run.rounds)} "
              f"switches={len(run.switches)} decode+switch actions={actions} ({actions / dt:,.0f}/s)")
    print(f"{'total':<11} {total:7.2f} s")


if __name__ == "__main__":
    main()
