"""Measure the built-in torch engine on this machine and fit the `tiny` latency profile to it.

The cold instance of `etc/talaria.yaml` (the built-in `tiny` models on the torch executor) runs in
process, through the same `Worker` and instance core as the daemon; every step its executor runs is
timed. A calibration workload exercises each cost the profile has: prefills of several lengths
(batch 1), decode steps at several batch sizes, returns whose prefix is restored from host (HKVR)
after a switch, and switches between the two models. The fit is least squares on the profile's
linear forms (`talariad.types.LatencyProfile`):
  prefill = prefill_base_s + prefill_s_per_token x recomputed + restore_s_per_token x restored
  decode  = decode_step_s + decode_s_per_seq x batch
  switch  = the median measured switch per path (d2d, partial, h2d); open_s = the h2d median.
Nothing here looks at SCT, TTFT or any replay output.

Run: .venv/bin/python bench/calibrate_tiny.py [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from talariad.cold_sched import Decode, Prefill, Switch  # noqa: E402
from talariad.config import load_config  # noqa: E402
from talariad.engine.build import build_worker  # noqa: E402
from talariad.wire.messages import GenerateRequest, TokenEvent  # noqa: E402
from tests.support.worker import call_events  # noqa: E402

WORDS = "def return self import class test value file path error patch line module".split()


def text(n: int, salt: int) -> str:
    return " ".join(WORDS[(i * 7 + salt) % len(WORDS)] for i in range(n))


class Bench:
    def __init__(self) -> None:
        cfg = load_config(ROOT / "etc" / "talaria.yaml")
        inst = next(i for i in cfg.instances if i.pool == "cold" and i.executor == "torch")
        self.models = list(inst.models)
        self.worker = build_worker(cfg, inst, ROOT / "etc")
        self.steps: list[tuple[object, object, float]] = []
        run = self.worker.executor.run

        async def timed(plan):
            t0 = time.perf_counter()
            result = await run(plan)
            self.steps.append((plan, result, time.perf_counter() - t0))
            return result

        self.worker.executor.run = timed
        self.n = 0

    async def call(self, session: str, model: str, prompt: str, max_tokens: int) -> str:
        self.n += 1
        req = GenerateRequest(
            call_id=f"c{self.n}",
            session_id=session,
            model=model,
            prompt=prompt,
            max_tokens=max_tokens,
            ignore_eos=True,
        )
        out = []
        async for ev in call_events(self.worker, req):
            if isinstance(ev, TokenEvent):
                out.append(ev.text)
        return "".join(out)

    async def workload(self) -> None:
        a, b = self.models[:2]
        loop = asyncio.create_task(self.worker.run())
        try:
            for n in (16, 64, 128, 256, 512, 768):  # prefill lengths, batch 1
                for rep in range(3):
                    await self.call(f"p{n}-{rep}", a, text(n, rep), 1)
            for batch in (1, 2, 4, 8, 16):  # decode batch sizes
                await asyncio.gather(
                    *(self.call(f"d{batch}-{i}", a, text(32, i), 24) for i in range(batch))
                )
            for rep in range(6):  # returns across switches: HKVR restores, switch paths
                sessions = [f"r{rep}-{i}" for i in range(4)]
                first = await asyncio.gather(
                    *(self.call(s, a, text(200, i), 8) for i, s in enumerate(sessions))
                )
                await self.call(f"o{rep}", b, text(64, rep), 8)  # b's slot: a is switched out
                await asyncio.gather(
                    *(
                        self.call(s, a, text(200, i) + first[i] + text(20, 99), 8)
                        for i, s in enumerate(sessions)
                    )
                )
        finally:
            loop.cancel()
            try:
                await loop
            except (asyncio.CancelledError, Exception):
                pass

    def fit(self) -> dict:
        pre_x, pre_y, dec_x, dec_y, switches = [], [], [], [], {}
        for plan, result, s in self.steps:
            a = plan.action
            if isinstance(a, Prefill):
                pre_x.append(
                    [
                        1.0,
                        sum(i.recompute_tokens for i in a.calls),
                        sum(i.restore_tokens for i in a.calls),
                    ]
                )
                pre_y.append(s)
            elif isinstance(a, Decode):
                dec_x.append([1.0, len(a.call_ids)])
                dec_y.append(s)
            elif isinstance(a, Switch) and result.switch_failed is None:
                path = (result.switch_path or a.path).value
                switches.setdefault(path, []).append(s)
        pre = np.linalg.lstsq(np.array(pre_x), np.array(pre_y), rcond=None)[0]
        dec = np.linalg.lstsq(np.array(dec_x), np.array(dec_y), rcond=None)[0]
        med = {p: statistics.median(v) for p, v in switches.items()}
        return {
            "prefill_base_s": max(float(pre[0]), 0.0),
            "prefill_s_per_token": max(float(pre[1]), 0.0),
            "restore_s_per_token": max(float(pre[2]), 0.0),
            "decode_step_s": max(float(dec[0]), 0.0),
            "decode_s_per_seq": max(float(dec[1]), 0.0),
            "switch_s": med,
            "samples": {
                "prefill": len(pre_y),
                "decode": len(dec_y),
                "restored_prefills": sum(1 for x in pre_x if x[2] > 0),
                "switch": {p: len(v) for p, v in switches.items()},
            },
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args()
    bench = Bench()
    t0 = time.monotonic()
    asyncio.run(bench.workload())
    fit = bench.fit()
    fit["machine"] = f"{platform.processor() or platform.machine()}, {platform.python_version()}"
    fit["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(fit, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(fit, indent=2))


if __name__ == "__main__":
    main()
