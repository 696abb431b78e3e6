"""Real-mode replay, Talaria vs Round-only: the same scaled trace against two real `talariad` runs.

Run: .venv/bin/python bench/e2e_replay.py [--sessions 9] [--max-calls 12] [--scale 50] [--output-scale 4]

Each configuration is `etc/talaria.yaml` as it is at run time (whatever executor it uses), on free
loopback ports, with only its cold instances unless `--with-hot` (the paper's fixed replay runs on
one box time-sharing every model); Round-only also sets `ablations: {sp: false, host_kv: false, d2d: false}` (§5.1).
The trace is the paper's fixed-replay shape (seed 0): its first `--sessions` model-sessions (three
issues x three models by default), the first `--max-calls` calls of each, prompts divided by
`--scale`, outputs by `--output-scale`, gaps as generated (capped at 10 s). Times are real wall
clock on this machine; SCT is from a session's first intended enqueue to its last response.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from talariad.replay.client import ReplayOptions, replay_measured, served_models, summary  # noqa: E402
from talariad.replay.metrics import row_metrics  # noqa: E402
from talariad.replay.report import print_report  # noqa: E402
from talariad.replay.scale import load_trace, map_models, scale_trace  # noqa: E402

CONFIGS = {
    "Talaria": {},
    "Round-only": {"sp": False, "host_kv": False, "d2d": False},
}


def write_config(
    workdir: Path, ablations: dict, with_hot: bool, device_ids: list[int] | None = None
) -> Path:
    cfg = yaml.safe_load((ROOT / "etc" / "talaria.yaml").read_text())
    cfg["listen"] = {"http": "127.0.0.1:0", "admin_socket": str(workdir / "admin.sock")}
    if not with_hot:  # the paper's box: every call goes through the time-shared cold pool (§5.1)
        cfg["instances"] = [i for i in cfg["instances"] if i.get("pool") == "cold"]
        served = {
            m for i in cfg["instances"] for m in i["models"]
        }  # no trace session maps to a model
        cfg["models"] = [m for m in cfg["models"] if m["name"] in served]  # no instance serves
    if device_ids is not None:  # e.g. the torch engine on CUDA device 0 instead of the CPU
        for inst in cfg["instances"]:
            inst["devices"] = device_ids
    cfg["ablations"] = {**(cfg.get("ablations") or {}), **ablations}
    path = workdir / "talaria.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _pump(stream, sink: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        sink.put(line)


def start_daemon(config: Path, ready_timeout_s: float) -> tuple[subprocess.Popen, str]:
    """Start `talariad run`; return it and its endpoint once it prints its listening line."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "talariad.cli",
            "run",
            "--config",
            str(config),
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=config.parent,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    deadline, seen = time.monotonic() + ready_timeout_s, []
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            seen.append(lines.get(timeout=0.5))
        except queue.Empty:
            continue
        m = re.search(r"listening on (http://\S+/v1)", seen[-1])
        if m:
            return proc, m.group(1)
    stop_daemon(proc)
    raise SystemExit("talariad did not start:\n" + "".join(seen[-20:]))


def stop_daemon(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_config(name: str, ablations: dict, args) -> object:
    with tempfile.TemporaryDirectory(prefix="talaria-bench-") as tmp:
        started = time.monotonic()
        proc, endpoint = start_daemon(
            write_config(Path(tmp), ablations, args.with_hot, args.device_ids), args.ready_timeout
        )
        print(
            f"{name}: talariad up at {endpoint} in {time.monotonic() - started:.1f} s", flush=True
        )
        try:
            trace = load_trace("fixed", args.seed, args.sessions)
            models = map_models(trace.models(), asyncio.run(served_models(endpoint)))
            sessions = scale_trace(
                trace, models, args.scale, args.output_scale, 10.0, args.max_calls
            )
            result = replay_measured(
                sessions,
                ReplayOptions(endpoint, config=name, timeout_s=args.timeout),
                str(Path(tmp) / "admin.sock"),
            )
        finally:
            stop_daemon(proc)
    print(f"{name}: {summary(result)}", flush=True)
    for e in result.errors:
        print(f"{name}: error: {e.session_id} call {e.call_idx}: {e.message}", flush=True)
    return result


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--sessions", type=int, default=9, help="first N model-sessions of the fixed replay"
    )
    p.add_argument("--max-calls", type=int, default=12, help="first N calls of each session")
    p.add_argument("--scale", type=float, default=50.0, help="prompt sizes divided by this")
    p.add_argument("--output-scale", type=float, default=4.0, help="output lengths divided by this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--with-hot",
        action="store_true",
        help="keep the default config's hot instances (default: cold pool only, as in §5.1)",
    )
    p.add_argument(
        "--timeout", type=float, default=240.0, help="bound on each configuration's replay, s"
    )
    p.add_argument(
        "--ready-timeout", type=float, default=180.0, help="bound on each daemon's start-up, s"
    )
    p.add_argument(
        "--device-ids",
        type=lambda v: [int(x) for x in v.split(",")],
        default=None,
        help="run every instance on these CUDA device ids (e.g. 0) instead of the config's devices",
    )
    p.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help=f"comma-separated subset of {', '.join(CONFIGS)}",
    )
    return p


def main() -> None:
    p = _parser()
    args = p.parse_args()
    unknown = sorted(set(args.configs.split(",")) - set(CONFIGS))
    if unknown:
        p.error(f"--configs: unknown configuration(s) {unknown}; known: {', '.join(CONFIGS)}")
    executors = sorted(
        {
            i["executor"]
            for i in yaml.safe_load((ROOT / "etc/talaria.yaml").read_text())["instances"]
            if "executor" in i
        }
        or {"sim"}
    )
    print(
        f"fixed-replay shape, seed {args.seed}: {args.sessions} model-sessions x first {args.max_calls} calls, "
        f"prompts / {args.scale:g}, outputs / {args.output_scale:g}; executor(s) {executors}",
        flush=True,
    )
    wall = time.monotonic()
    results = [
        run_config(name, abl, args)
        for name, abl in CONFIGS.items()
        if name in args.configs.split(",")
    ]
    print_report(
        [r.run for r in results], Console(width=200), title="Real-mode replay (wall clock)"
    )
    _print_rows(results)
    print(
        f"bench wall clock {time.monotonic() - wall:.1f} s; load average {os.getloadavg()[0]:.2f}"
    )


def _print_rows(results) -> None:
    """Each configuration's SCT and what the daemon measured; the Round-only / Talaria ratio."""
    rows = {r.run.config: row_metrics(r.run) for r in results}
    for name, row in rows.items():
        print(
            f"{name:<11} SCT p50 {row.sct_p50_s:.2f} s  p95 {row.sct_p95_s:.2f} s  "
            f"({row.sessions} sessions, {row.calls} calls, replay {results_wall(results, name):.1f} s)"
        )
        paths = ", ".join(
            f"{p} p50 {1e3 * st.p50_s:.1f} ms (n={st.count})"
            for p, st in row.switch_by_path.items()
        )
        share = "-" if row.switch_share is None else f"{100 * row.switch_share:.1f}%"
        print(
            f"{name:<11} measured by the daemon: {'-' if row.rounds is None else row.rounds} rounds, "
            f"switch share {share}, switch {paths or '-'}"
        )
    for r in results:
        unfinished = len({e.session_id for e in r.errors})
        if unfinished:
            print(
                f"NOTE: {r.run.config}: {unfinished} session(s) unfinished; its SCT percentiles cover "
                f"finished sessions only, so they (and the ratio) understate its SCT"
            )
    if {"Talaria", "Round-only"} <= rows.keys():
        t, b = rows["Talaria"], rows["Round-only"]
        print(
            f"Round-only / Talaria SCT ratio: p50 {b.sct_p50_s / t.sct_p50_s:.2f}x, "
            f"p95 {b.sct_p95_s / t.sct_p95_s:.2f}x"
        )


def results_wall(results, name: str) -> float:
    return next(r.run.wall_clock_s for r in results if r.run.config == name)


if __name__ == "__main__":
    main()
