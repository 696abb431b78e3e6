"""Built-in engine benchmark: a config model served the way a hot torch instance serves it (the
executor the daemon builds: one copy of the weights), in each dtype, on the CPU.

    python bench/engine_bench.py [--config etc/talaria.yaml] [--model smol-chat]
                                 [--dtypes float32,bfloat16] [--prompt 500] [--steps 12]
                                 [--rounds 2] [--threads 1]

Each dtype runs in a fresh process (its resident memory is its own): build the executor, prefill
a `--prompt`-token prompt (README text) for 8 sequences, then decode `--steps` steps at batch 1
and batch 8 with the context held at `--prompt` (every step rewrites the same slot). The best
round is kept. Rates are wall-clock tokens/s and tokens per process-CPU second; memory is the
process RSS after the build and at the end (KV of 8 sequences included) and its peak (VmHWM).
The prototype's figures (docs: real-small-model note, 1 thread, load 3.4-3.8) print beside.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTOTYPE = {  # prototype bench, SmolLM2 GGUF, same method; RSS from an earlier run at load 8.7-12
    "float32": {"prefill": 305.8, "b1": 13.3, "b8": 31.6, "rss_loaded": 780, "rss_end": 1073},
    "bfloat16": {"prefill": 442.5, "b1": 11.8, "b8": 30.2, "rss_loaded": 526, "rss_end": 666},
}
COLUMNS = ("prefill", "b1", "b8", "rss_loaded", "rss_end")


def mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def one(args: argparse.Namespace, dtype: str) -> dict:
    import torch

    from talariad.checks import parse_checked
    from talariad.config import load_config
    from talariad.engine.executors.torch_engine.factory import build_torch_executor
    from talariad.engine.model import DecodeSeq, PrefillSeq

    torch.set_num_threads(args.threads)
    base = load_config(args.config)
    spec = base.model(args.model).model_copy(update={"dtype": dtype})
    data = {
        "models": [spec.model_dump(exclude_none=True)],
        "instances": [{"name": "hot0", "pool": "hot", "executor": "torch", "models": [args.model]}],
    }
    cfg = parse_checked(data, "bench", Path(args.config).resolve().parent)
    out = {"dtype": dtype, "rss_start": mib("VmRSS")}
    t = time.perf_counter()
    ex = build_torch_executor(cfg, cfg.instances[0], Path(args.config).resolve().parent)
    out["load_s"], out["rss_loaded"] = time.perf_counter() - t, mib("VmRSS")
    runner, tok = ex.runners[args.model], ex.models[args.model].tokenizer
    ids = tok.encode((ROOT / "README.md").read_text())[: args.prompt]
    p, n = len(ids), args.steps
    best = {"prefill": [], "b1": [], "b8": []}
    for rnd in range(args.rounds):
        seqs = []
        for b in range(8):
            table = runner.allocator.allocate((rnd, b), p + n + 2)
            w, c = time.perf_counter(), time.process_time()
            logits = runner.prefill([PrefillSeq((rnd, b), ids, 0, table)])
            if b == 0:
                best["prefill"].append(
                    (p / (time.perf_counter() - w), p / (time.process_time() - c))
                )
            seqs.append(((rnd, b), table, int(logits.argmax())))
        for batch in (1, 8):
            w, c = time.perf_counter(), time.process_time()
            for _ in range(n):
                runner.decode([DecodeSeq(r, tk, p, tb) for r, tb, tk in seqs[:batch]])
            rate = (batch * n / (time.perf_counter() - w), batch * n / (time.process_time() - c))
            best[f"b{batch}"].append(rate)
        for r, _, _ in seqs:
            runner.allocator.free(r)
    for key, rates in best.items():
        out[key] = max(r[0] for r in rates)
        out[key + "_cpu"] = max(r[1] for r in rates)
    out["rss_end"], out["rss_peak"] = mib("VmRSS"), mib("VmHWM")
    out["prompt_tokens"], out["loadavg"] = p, Path("/proc/loadavg").read_text().split()[:3]
    return out


def fmt(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "etc" / "talaria.yaml"))
    ap.add_argument("--model", default="smol-chat")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--prompt", type=int, default=500)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args, args.one)))
        return
    argv = [a for a in sys.argv[1:]]
    rows = []
    for dtype in args.dtypes.split(","):
        res = subprocess.run(
            [sys.executable, __file__, *argv, "--one", dtype], capture_output=True, text=True
        )
        if res.returncode:
            sys.exit(f"{dtype}: {res.stderr.strip().splitlines()[-1]}")
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    print(
        f"{args.model}, {args.threads} torch thread(s), prompt {args.prompt} tokens, tok/s wall; "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )
    head = "dtype     load_s  prefill  (cpu)  dec_b1  (cpu)  dec_b8  (cpu)  rss_MiB loaded/end/peak  load avg"
    print(head)
    for r in rows:
        print(
            f"{r['dtype']:9} {r['load_s']:6.2f} {r['prefill']:8.1f} {r['prefill_cpu']:6.1f}"
            f" {r['b1']:7.1f} {r['b1_cpu']:6.1f} {r['b8']:7.1f} {r['b8_cpu']:6.1f}"
            f"  {r['rss_loaded']:6.0f} / {r['rss_end']:5.0f} / {r['rss_peak']:5.0f}   "
            + " ".join(r["loadavg"])
        )
        proto = PROTOTYPE.get(r["dtype"], {})
        vals = "  ".join(f"{c} {fmt(proto.get(c))}" for c in COLUMNS)
        print(f"  prototype: {vals}")


if __name__ == "__main__":
    main()
