"""How fast the edge refuses what it must: a 9 MiB body (413), a 4 MB prompt (400 from its size)
and a lone surrogate (400), side by side with an ordinary small call in the same run.

Run: .venv/bin/python bench/edge_refusals.py [--repeat 5]

Starts one `talariad` on the embedded default with sim executors on free loopback ports, times each
request (median of `--repeat`, wall clock on this machine) and prints each as milliseconds and as a
ratio to the small call, which goes through placement and an instance.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.conftest import start_daemon, stop_daemon  # noqa: E402

CASES = {
    "small call (200)": lambda: {
        "model": "tiny-chat",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "hello"}],
    },
    "9 MiB body (413)": lambda: b"x" * (9 << 20),
    "4 MB prompt (400)": lambda: {
        "model": "tiny-chat",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "word " * 800_000}],
    },
    "lone surrogate (400)": lambda: {
        "model": "tiny-chat",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "a\ud800b"}],
    },
}


def _time(client: httpx.Client, url: str, body) -> tuple[float, int]:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    started = time.perf_counter()
    r = client.post(url, content=content, headers={"content-type": "application/json"})
    return time.perf_counter() - started, r.status_code


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    d = start_daemon(Path(tempfile.mkdtemp()), executor="sim")
    try:
        url = f"{d.endpoint}/v1/chat/completions"
        rows = {}
        with httpx.Client(timeout=120) as client:
            for name, make in CASES.items():
                body = make()
                runs = [_time(client, url, body) for _ in range(args.repeat)]
                rows[name] = (statistics.median(t for t, _ in runs), {s for _, s in runs})
    finally:
        stop_daemon(d)
    base = rows["small call (200)"][0]
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'request':24} {'status':>6} {'median ms':>10} {'x small call':>13}")
    for name, (t, statuses) in rows.items():
        print(
            f"{name:24} {'/'.join(map(str, sorted(statuses))):>6} {1000 * t:10.1f} {t / base:13.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
