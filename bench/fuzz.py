"""Fire fuzzed requests across the five generation APIs at a daemon and count its answers.

Run: .venv/bin/python bench/fuzz.py [--url http://127.0.0.1:8000] [-n 10000] [--seed 1] [--json]

The requests are those of the suite's bounded fuzz (tests/support/fuzz.py), many more of them:
well-formed bodies with wrong types, junk, huge and negative numbers, deep nesting or lone
surrogates at any field, some with mangled bytes, some raw bytes. Without `--url` it starts one
`talariad` from etc/talaria.yaml on free loopback ports. Prints the answers counted by status, how
many were 5xx and how many retryable (429, 503 or a Retry-After: none should be, all of it is
input), and whether the daemon still answered /health afterwards; exits 1 when any was.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.conftest import start_daemon, stop_daemon  # noqa: E402
from tests.support import fuzz  # noqa: E402


def fire(url: str, count: int, seed: int) -> dict:
    """Send `count` fuzzed requests one after another; the tally and the first few bad answers."""
    by_status: collections.Counter = collections.Counter()
    by_api: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    bad: list[dict] = []
    started = time.monotonic()
    with httpx.Client(timeout=120) as client:
        for path, kind, content in fuzz.cases(count, seed):
            try:
                r = client.post(f"{url}{path}", content=content, headers={"content-type": kind})
                status, ok = str(r.status_code), fuzz.acceptable(r.status_code, r.headers)
            except httpx.HTTPError as err:
                status, ok, r = f"no answer ({type(err).__name__})", False, None
            by_status[status] += 1
            by_api[path][status] += 1
            if not ok and len(bad) < 5:
                bad.append(
                    {
                        "path": path,
                        "status": status,
                        "body": content[:200].decode("latin-1"),
                        "answer": r.text[:200] if r is not None else "",
                    }
                )
    alive = _alive(url)
    return {
        "requests": count,
        "seconds": round(time.monotonic() - started, 1),
        "by_status": dict(sorted(by_status.items())),
        "by_api": {p: dict(sorted(c.items())) for p, c in by_api.items()},
        "server_errors": sum(n for s, n in by_status.items() if s.startswith("5")),
        "retryable": sum(n for s, n in by_status.items() if s in ("429", "503")),
        "unanswered": sum(n for s, n in by_status.items() if not s.isdigit()),
        "alive_after": alive,
        "first_bad": bad,
    }


def _alive(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def _print(result: dict) -> None:
    print(
        f"{result['requests']} fuzzed requests in {result['seconds']} s; "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )
    print(f"{'status':>24} {'count':>7}")
    for status, n in result["by_status"].items():
        print(f"{status:>24} {n:7d}")
    for path, counts in sorted(result["by_api"].items()):
        print(f"  {path:28} " + "  ".join(f"{s}: {n}" for s, n in counts.items()))
    print(
        f"5xx: {result['server_errors']}  retryable (429/503): {result['retryable']}  "
        f"unanswered: {result['unanswered']}  alive after: {result['alive_after']}"
    )
    for b in result["first_bad"]:
        print(f"bad: {b['status']} {b['path']} {b['body']!r} -> {b['answer']!r}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="a running daemon (default: start one from etc/talaria.yaml)")
    p.add_argument("-n", "--requests", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    args = p.parse_args()
    daemon = None if args.url else start_daemon(Path(tempfile.mkdtemp()))
    try:
        result = fire(args.url or daemon.endpoint, args.requests, args.seed)
    finally:
        if daemon is not None:
            stop_daemon(daemon)
    print(json.dumps(result, indent=2)) if args.json else _print(result)
    failed = result["server_errors"] or result["retryable"] or result["unanswered"]
    return 1 if failed or not result["alive_after"] else 0


if __name__ == "__main__":
    sys.exit(main())
