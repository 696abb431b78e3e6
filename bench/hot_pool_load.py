"""Where the default daemon sends a session load: N concurrent sessions, half `tiny-chat` (pinned by
the hot instance, also allowed on the cold one), half `tiny-code` (cold only), a few calls each with
a short tool gap, `max_tokens` 8. Prints calls per (model, instance, status) from the
`x-talaria-instance` response header: the hot pool should serve its model unless over budget.

Run: .venv/bin/python bench/hot_pool_load.py [--sessions 200] [--calls 3] [--config etc/talaria.yaml]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def drive(base: str, sessions: int, calls: int) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    async with httpx.AsyncClient(timeout=120) as client:
        for _ in range(300):
            try:
                if (await client.get(base + "/ready")).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)

        async def session(i: int) -> None:
            model = "tiny-chat" if i % 2 == 0 else "tiny-code"
            msgs = [{"role": "user", "content": f"session {i}: fix the bug in module {i} " * 4}]
            for k in range(calls):
                r = await client.post(
                    base + "/v1/chat/completions",
                    json={"model": model, "messages": msgs, "max_tokens": 8},
                    headers={"x-talaria-session-id": f"s{i}"},
                )
                counts[(model, r.headers.get("x-talaria-instance", "-"), r.status_code)] += 1
                text = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else ""
                msgs += [
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": f"tool output {k}"},
                ]
                await asyncio.sleep(0.3)

        await asyncio.gather(*(session(i) for i in range(sessions)))
    return counts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sessions", type=int, default=200)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--config", default=str(ROOT / "etc" / "talaria.yaml"))
    args = p.parse_args()
    cfg = yaml.safe_load(Path(args.config).read_text())
    tmp = Path(tempfile.mkdtemp())
    port = free_port()
    cfg["listen"] = {"http": f"127.0.0.1:{port}", "admin_socket": str(tmp / "admin.sock")}
    (tmp / "talaria.yaml").write_text(yaml.safe_dump(cfg))
    daemon = subprocess.Popen(
        [sys.executable, "-m", "talariad.cli", "run", "--config", str(tmp / "talaria.yaml")],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        t0 = time.perf_counter()
        counts = asyncio.run(drive(f"http://127.0.0.1:{port}", args.sessions, args.calls))
        took = time.perf_counter() - t0
    finally:
        daemon.terminate()
        daemon.wait(30)
    print(
        f"{args.sessions} sessions x {args.calls} calls in {took:.1f} s; load average {os.getloadavg()[0]:.2f}"
    )
    for (model, instance, status), n in sorted(counts.items()):
        print(f"{model:10s} {instance:8s} {status}  {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
