"""Does the daemon age well? Drive one daemon for N rounds of the same load and print, per round,
calls/s, latency p50/p99, errors, `/ready` failures, the oldest telemetry age, and what each
process holds (RSS, open files, asyncio tasks, tracked Python objects).

Each round runs `--sessions` concurrent sessions of `--calls` calls (half `tiny-chat`, half
`tiny-code`, a short tool gap, the prompt growing by the answer and a tool result per call), with
new session ids each round unless `--reuse-ids`. The daemon is started from `--config` (default
the embedded one, its hot torch instance pinning `--hot-model`, default `tiny-chat`, so both
pools serve the load) on a free port, or `--url`/`--admin-socket` name one already running.

Run: .venv/bin/python bench/soak.py [--rounds 12] [--sessions 200] [--calls 10] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from talariad.admin.client import AdminClient, as_dict  # noqa: E402

MiB = 1 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(xs: list[float], q: float) -> float | None:
    """Nearest rank; None for no samples."""
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * len(xs) + 0.5) - 1))]


def slope(ys: list[float]) -> float:
    """Least-squares slope per round (0 for fewer than two points)."""
    if len(ys) < 2:
        return 0.0
    xs = range(len(ys))
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=False)) / den


@contextmanager
def daemon(config: Path, hot_model: str | None):
    """A daemon on a free port and a private admin socket; yields (url, admin socket, process)."""
    cfg = yaml.safe_load(config.read_text())
    for inst in cfg.get("instances", []) if hot_model else []:
        if inst.get("pool") == "hot" and inst.get("executor") == "torch":
            inst["models"] = [hot_model]
    served = {m for inst in cfg.get("instances", []) for m in inst.get("models", [])}
    cfg["models"] = [m for m in cfg.get("models", []) if m.get("name") in served]
    tmp = Path(tempfile.mkdtemp(prefix="talaria-soak-"))
    port = free_port()
    cfg["listen"] = {"http": f"127.0.0.1:{port}", "admin_socket": str(tmp / "admin.sock")}
    (tmp / "talaria.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen(
        [sys.executable, "-m", "talariad.cli", "run", "--config", str(tmp / "talaria.yaml")],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / "daemon.log", "wb"),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        print(f"soak: daemon log {tmp / 'daemon.log'}", file=sys.stderr)
        yield f"http://127.0.0.1:{port}", str(tmp / "admin.sock"), proc
    finally:
        proc.terminate()
        proc.wait(60)


async def wait_ready(client: httpx.AsyncClient, base: str, alive) -> None:
    for _ in range(600):
        if not alive():
            raise SystemExit("soak: the daemon exited before it was ready (see its log)")
        try:
            if (await client.get(base + "/ready")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.2)
    raise SystemExit("soak: the daemon never became ready")


class Round:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.statuses: dict[int, int] = {}
        self.ready_polls = 0
        self.ready_failures = 0
        self.telemetry_age_s = 0.0


async def session(client, base, sid: str, model: str, calls: int, gap_s: float, rnd: Round):
    msgs = [{"role": "user", "content": f"session {sid}: fix the bug in module {sid} " * 4}]
    for k in range(calls):
        t0 = time.perf_counter()
        try:
            r = await client.post(
                base + "/v1/chat/completions",
                json={"model": model, "messages": msgs, "max_tokens": 8},
                headers={"x-session-id": sid},
            )
            status = r.status_code
        except httpx.HTTPError:
            status = 599  # the connection failed: no status at all
        rnd.latencies.append(time.perf_counter() - t0)
        rnd.statuses[status] = rnd.statuses.get(status, 0) + 1
        text = r.json()["choices"][0]["message"]["content"] if status == 200 else ""
        msgs += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": f"tool output {k}: 3 passed, 1 failed in module {sid}"},
        ]
        await asyncio.sleep(gap_s)


async def watch(client, base, admin: AdminClient, rnd: Round, stop: asyncio.Event) -> None:
    """Poll /ready and the admin status every half second until the round ends."""
    while not stop.is_set():
        try:
            ok = (await client.get(base + "/ready")).status_code == 200
        except httpx.HTTPError:
            ok = False
        rnd.ready_polls += 1
        rnd.ready_failures += not ok
        status = await asyncio.to_thread(admin.status)
        ages = [i.telemetry_age_s for i in status.instances]
        rnd.telemetry_age_s = max([rnd.telemetry_age_s, *ages])
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except TimeoutError:
            pass


METRIC = re.compile(r"^(process_resident_memory_bytes|process_open_fds|talaria_process_\w+) (\S+)$")


async def daemon_figures(client, base: str, pid: int) -> dict:
    text = (await client.get(base + "/metrics")).text
    found = {m[1]: float(m[2]) for line in text.splitlines() if (m := METRIC.match(line))}
    return {
        "pid": pid,
        "rss_bytes": int(found["process_resident_memory_bytes"]),
        "open_files": int(found["process_open_fds"]),
        "asyncio_tasks": int(found["talaria_process_asyncio_tasks"]),
        "gc_objects": int(found["talaria_process_gc_objects"]),
    }


async def figures(client, base: str, admin: AdminClient, pid: int) -> dict[str, dict]:
    out = {"daemon": await daemon_figures(client, base, pid)}
    for inst in (await asyncio.to_thread(admin.status)).instances:
        reply = await asyncio.to_thread(admin.memory, inst.name)
        out[inst.name] = as_dict(reply)["process"]
    return out


async def soak(args, base: str, admin_socket: str, pid: int, alive=lambda: True) -> list[dict]:
    admin = AdminClient(admin_socket, timeout_s=30)
    limits = httpx.Limits(max_connections=args.sessions + 8)
    rows = []
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        await wait_ready(client, base, alive)
        for r in range(args.rounds):
            rnd, stop = Round(), asyncio.Event()
            watcher = asyncio.create_task(watch(client, base, admin, rnd, stop))
            t0 = time.perf_counter()
            await asyncio.gather(
                *(
                    session(
                        client,
                        base,
                        f"s{i}" if args.reuse_ids else f"r{r}-s{i}",
                        "tiny-chat" if i % 2 == 0 else "tiny-code",
                        args.calls,
                        args.gap_s,
                        rnd,
                    )
                    for i in range(args.sessions)
                )
            )
            wall = time.perf_counter() - t0
            stop.set()
            await watcher
            rows.append(
                {
                    "round": r + 1,
                    "calls": len(rnd.latencies),
                    "calls_per_s": len(rnd.latencies) / wall,
                    "p50_s": percentile(rnd.latencies, 0.5),
                    "p99_s": percentile(rnd.latencies, 0.99),
                    "errors": sum(n for s, n in rnd.statuses.items() if s != 200),
                    "statuses": {str(s): n for s, n in sorted(rnd.statuses.items())},
                    "ready_polls": rnd.ready_polls,
                    "ready_failures": rnd.ready_failures,
                    "telemetry_age_max_s": rnd.telemetry_age_s,
                    "load_average": os.getloadavg()[0],
                    "processes": await figures(client, base, admin, pid),
                }
            )
            if not args.json:
                print_round(rows[-1], header=r == 0)
    admin.close()
    return rows


def print_round(row: dict, header: bool) -> None:
    procs = row["processes"]
    if header:
        names = "  ".join(f"{n + ' MiB/fds/tasks/kobj':>27}" for n in procs)
        print(
            f"{'round':>5} {'calls/s':>8} {'p50 s':>6} {'p99 s':>6} {'err':>4} ready-fail  age s  {names}"
        )
    cells = "  ".join(
        f"{p['rss_bytes'] / MiB:>9.0f}/{p['open_files']:>4}/{p['asyncio_tasks']:>5}/"
        f"{p['gc_objects'] / 1e3:>6.0f}"
        for p in procs.values()
    )
    print(
        f"{row['round']:>5} {row['calls_per_s']:>8.1f} {row['p50_s']:>6.2f} {row['p99_s']:>6.2f} "
        f"{row['errors']:>4} {row['ready_failures']:>4}/{row['ready_polls']:<5} "
        f"{row['telemetry_age_max_s']:>5.1f}  {cells}"
    )


def summary(rows: list[dict]) -> dict:
    """First vs last round, and the slopes over the last half of the rounds."""
    half = rows[len(rows) // 2 :]
    names = list(rows[-1]["processes"])
    return {
        "last_over_first_calls_per_s": rows[-1]["calls_per_s"] / rows[0]["calls_per_s"],
        "ready_failures": sum(r["ready_failures"] for r in rows),
        "errors": sum(r["errors"] for r in rows),
        "rss_slope_mib_per_round": {
            n: slope([r["processes"][n]["rss_bytes"] / MiB for r in half]) for n in names
        },
        "open_files_slope_per_round": {
            n: slope([r["processes"][n]["open_files"] for r in half]) for n in names
        },
        "gc_objects_slope_per_round": {
            n: slope([r["processes"][n]["gc_objects"] for r in half]) for n in names
        },
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--sessions", type=int, default=200)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--gap-s", type=float, default=0.3, help="tool gap between a session's calls")
    p.add_argument("--reuse-ids", action="store_true", help="the same session ids every round")
    p.add_argument("--config", type=Path, default=ROOT / "etc" / "talaria.yaml")
    p.add_argument(
        "--hot-model",
        default="tiny-chat",
        help="the model the config's hot torch instance pins ('' keeps the config's)",
    )
    p.add_argument("--url", help="a running daemon (needs --admin-socket and --pid)")
    p.add_argument("--admin-socket")
    p.add_argument("--pid", type=int, help="the running daemon's process id")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.rounds < 1 or args.sessions < 1 or args.calls < 1:
        p.error("--rounds, --sessions and --calls must be at least 1")
    if args.url and not (args.admin_socket and args.pid):
        p.error("--url needs --admin-socket and --pid")
    if args.url:
        rows = asyncio.run(soak(args, args.url.rstrip("/"), args.admin_socket, args.pid))
    else:
        if not args.config.is_file():
            p.error(f"--config {args.config}: no such file")
        with daemon(args.config, args.hot_model) as (base, admin_socket, proc):
            rows = asyncio.run(
                soak(args, base, admin_socket, proc.pid, lambda: proc.poll() is None)
            )
    result = {"rounds": rows, "summary": summary(rows), "cpus": os.cpu_count()}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(json.dumps(result["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
