"""Telemetry with many live sessions: what each poll carries and what an idle daemon costs.

Run: .venv/bin/python bench/telemetry_bench.py [--sessions 10000] [--idle 6]

Starts `talariad` with one hot `sim` instance on the zero-cost `instant` profile, makes `--sessions`
sessions live (one one-token call each, 32 at a time), then leaves the daemon idle for `--idle`
seconds while it keeps polling telemetry (every 0.25 s by default), and prints:
- the call rate while sessions accumulate (first tenth against last tenth: a call whose cost
  grows with the live sessions shows as a ratio well below 1);
- the gateway's telemetry payload per poll in steady state (`talaria_telemetry_payload_bytes`,
  sampled from /metrics through the idle window; `-` where the daemon does not export it);
- the size of the instance's whole telemetry (sessions included), read once at the end;
- the idle CPU share of the daemon and of the instance process over the window.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from front_bench import BODY, _read_response, start_talariad  # noqa: E402

GOAL_BYTES = 16 * 1024


async def make_sessions(port: int, sessions: int, conns: int = 32) -> list[float]:
    """One call per session id, `conns` kept-alive connections; returns when each call finished."""
    body = json.dumps(BODY).encode()
    todo = iter(range(sessions))
    done: list[float] = []

    async def worker() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for n in todo:
            writer.write(
                (
                    f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                    f"x-session-id: bench-{n}\r\ncontent-length: {len(body)}\r\n\r\n"
                ).encode()
                + body
            )
            await _read_response(reader)
            done.append(time.perf_counter())
        writer.close()

    done.append(time.perf_counter())
    await asyncio.gather(*(worker() for _ in range(conns)))
    return done


def call_rates(done: list[float]) -> tuple[float, float, float]:
    """Calls per second over all of them, over the first tenth (from the first answer, so the
    connections' set-up is left out) and over the last tenth."""
    n, tenth = len(done) - 1, max((len(done) - 1) // 10, 1)
    rate = lambda a, b: (b - a) / (done[b] - done[a])  # noqa: E731
    return rate(0, n), rate(1, 1 + tenth), rate(n - tenth, n)


def payload_gauge(port: int) -> int | None:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    m = re.search(r'^talaria_telemetry_payload_bytes\{instance="hot0"\} (\S+)$', text, re.M)
    return int(float(m.group(1))) if m else None


def whole_telemetry(instance: psutil.Process) -> bytes | None:
    """The instance's whole telemetry, asked for on its call socket (its HTTP API answers only the
    daemon, which holds its token); None where the instance answers no `Query` frames."""
    from talariad.wire.messages import Query
    from talariad.wire.stream import StreamClient

    path = next(c.laddr for c in instance.net_connections(kind="unix") if c.laddr)

    async def ask() -> bytes:
        client = StreamClient()
        try:
            return await client.query(path, Query(query="telemetry"))
        finally:
            await client.aclose()

    body = asyncio.run(ask())
    return body if b'"sessions"' in body else None


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--idle", type=float, default=6.0, help="seconds of idle measurement")
    args = ap.parse_args()
    if args.sessions < 20:
        ap.error("--sessions must be at least 20 (the call rates compare tenths of them)")
    print(
        f"telemetry: {args.sessions} sessions; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )
    with tempfile.TemporaryDirectory(prefix="talaria-telemetry-") as d:
        # every completed session charges its lease's admission unit to the instance for τ; at this
        # rate of new sessions that would hold calls back, and the bench only needs them live
        proc, port = start_talariad(Path(d), "policy:\n  admission_unit_s: 0\n")
        try:
            daemon = psutil.Process(proc.pid)
            instance = psutil.Process(next(c.pid for c in daemon.children()))
            rate, first, last = call_rates(asyncio.run(make_sessions(port, args.sessions)))
            print(
                f"made {args.sessions} sessions live at {rate:.0f} calls/s: {first:.0f} over the "
                f"first tenth, {last:.0f} over the last (last/first {last / first:.2f})"
            )
            time.sleep(2.0)  # the first polls after the burst carry its changes
            samples, d0, i0, t0 = [], cpu_s(daemon), cpu_s(instance), time.monotonic()
            while time.monotonic() - t0 < args.idle:
                samples.append(payload_gauge(port))
                time.sleep(0.3)
            wall = time.monotonic() - t0
            daemon_share, inst_share = (cpu_s(daemon) - d0) / wall, (cpu_s(instance) - i0) / wall
            full = whole_telemetry(instance)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    seen = [s for s in samples if s is not None]
    if seen:
        steady = max(seen)
        print(
            f"payload per poll, steady state: max {steady} B, median {statistics.median(seen):.0f} B "
            f"over {len(seen)} samples (goal <= {GOAL_BYTES} B: {'met' if steady <= GOAL_BYTES else 'not met'})"
        )
    else:
        print(
            "payload per poll, steady state: - (this daemon exports no talaria_telemetry_payload_bytes)"
        )
    if full is None:
        print("whole telemetry of the instance: - (this instance answers no queries on its socket)")
    else:
        listed = len(json.loads(full)["sessions"])
        print(f"whole telemetry of the instance: {len(full)} B with {listed} sessions listed")
    print(
        f"idle CPU share over {wall:.1f} s: daemon {daemon_share:.1%}, instance {inst_share:.1%} of one CPU"
    )


if __name__ == "__main__":
    main()
