"""A pool's capacity through the real Envoy (3 sim boxes, one picker, loopback, fail-open unless
told): many calls at once, bodies that trickle, large bodies. What each call got (status, 429
code), what Envoy routed without a pick, the most calls the picker had open on one box, the
picker's RSS and the load. Provisional numbers: the machine is shared.

    python bench/pool_capacity.py --streams 1500 --trickle 2000 --big 8 [--json]
    python bench/pool_capacity.py --streams 1500 --box-connections 108   # past the pool's 300
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from talaria_pool import devpool, envoy
from talariad.epp.config import GATEWAY_STATS

MIB = 2**20


def envoy_stats(admin: str) -> dict[str, int]:
    text = httpx.get(f"{admin}/stats", params={"filter": GATEWAY_STATS}, timeout=10).text
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(": ")
        if value.strip().isdigit() and int(value):
            out[name] = int(value)
    return out


def rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) / 1024


class Sampler:
    """The picker's RSS and, from its /status, the most calls it had open on one box."""

    def __init__(self, pool: devpool.LocalPool) -> None:
        self.pool, self.pid = pool, pool.procs["epp"].proc.pid
        self.rss0 = self.rss_max = rss_mib(self.pid)
        self.box_peak: Counter = Counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            self.rss_max = max(self.rss_max, rss_mib(self.pid))
            for b in devpool.epp_status(self.pool.epp_admin).get("boxes", []):
                self.box_peak[b["name"]] = max(self.box_peak[b["name"]], b["in_flight"])
            time.sleep(0.05)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


async def call(c: httpx.AsyncClient, sid: str, max_tokens: int) -> tuple[int, str, float]:
    body = {
        "model": "claude-sonnet-4",
        "messages": [{"role": "user", "content": f"{sid}: " + "work " * 30}],
        "max_tokens": max_tokens,
    }
    t0 = time.monotonic()
    try:
        r = await c.post("/v1/chat/completions", json=body, headers={"x-session-id": sid})
    except httpx.HTTPError as err:
        return 0, type(err).__name__, time.monotonic() - t0
    code = ""
    if r.status_code != 200:
        try:
            code = r.json()["error"]["code"] or ""
        except (ValueError, KeyError, TypeError):
            code = r.text[:60]
    return r.status_code, code, time.monotonic() - t0


async def streams(gateway: str, n: int, max_tokens: int) -> list[tuple[int, str, float]]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    timeout = httpx.Timeout(300, connect=60, pool=300)
    async with httpx.AsyncClient(base_url=f"http://{gateway}", limits=limits, timeout=timeout) as c:
        return await asyncio.gather(*(call(c, f"s{i}", max_tokens) for i in range(n)))


async def others(gateway: str, n: int) -> list[tuple[int, str, float]]:
    async with httpx.AsyncClient(base_url=f"http://{gateway}", timeout=120) as c:
        return [await call(c, f"other-{i % 4}", 8) for i in range(n)]


async def trickle(gateway: str, n: int, hold_s: float) -> tuple[list, Counter]:
    """`n` connections sending a body a byte a second for `hold_s`, other calls meanwhile."""
    host, port = envoy.split_address(gateway)
    conns = []
    for _ in range(n):
        conns.append(await asyncio.open_connection(host, port))
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: pool\r\ncontent-length: 100000\r\n\r\n{"
    for _, w in conns:
        w.write(head)
    reads = [asyncio.create_task(r.read(200)) for r, _ in conns]

    async def drip() -> None:
        t_end = time.monotonic() + hold_s
        while time.monotonic() < t_end:
            for (_, w), rd in zip(conns, reads, strict=True):
                if not rd.done():
                    w.write(b" ")
            await asyncio.sleep(1.0)

    dripping = asyncio.create_task(drip())
    await asyncio.sleep(2.0)
    meanwhile = await others(gateway, 40)
    await dripping
    ended = Counter()
    for rd in reads:
        if rd.done():
            raw = rd.result()
            ended[raw[:12].decode(errors="replace") or "closed"] += 1
        else:
            ended["still open"] += 1
            rd.cancel()
    for _, w in conns:
        w.close()
    return meanwhile, ended


async def big(gateway: str, n: int, size: int) -> Counter:
    """`n` chunked and `n` declared `size`-byte bodies at once: the status lines."""

    async def one(chunked: bool) -> str:
        host, port = envoy.split_address(gateway)
        reader, writer = await asyncio.open_connection(host, port)
        framing = "transfer-encoding: chunked" if chunked else f"content-length: {size}"
        writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nhost: p\r\n{framing}\r\n\r\n".encode())
        answer = asyncio.create_task(reader.read(200))
        piece, sent = b"x" * MIB, 0
        try:
            while chunked and sent < size and not answer.done():
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                sent += len(piece)
        except ConnectionError:
            pass
        try:
            raw = await asyncio.wait_for(answer, 300)
        finally:
            writer.close()
        kind = "chunked" if chunked else "declared"
        return f"{kind} {raw[:12].decode(errors='replace') or 'closed'}"

    got = await asyncio.gather(*(one(ch) for ch in [True] * n + [False] * n))
    return Counter(got)


def p99(xs: list[float]) -> float | None:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(0.99 * len(xs)))], 3) if xs else None


def row(case: str, pool: devpool.LocalPool, s: Sampler, extra: dict) -> dict:
    return {
        "case": case,
        **extra,
        "envoy": envoy_stats(pool.envoy_admin),
        "box_peak_in_flight": dict(s.box_peak),
        "picker_rss_mib": round(s.rss0, 1),
        "picker_rss_growth_mib": round(s.rss_max - s.rss0, 1),
        "load": round(os.getloadavg()[0], 2),
    }


def run_case(case: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        limits = {"max_connections": args.box_connections} if args.box_connections else None
        pool = devpool.start_pool(Path(tmp), boxes=3, failure_mode=args.failure_mode, limits=limits)
        if args.workdir:
            print(f"{case}: logs in {tmp} (removed after)", file=sys.stderr)
        try:
            with Sampler(pool) as s:
                t0 = time.monotonic()
                if case == "streams":
                    got = asyncio.run(streams(pool.gateway, args.streams, args.max_tokens))
                    statuses = Counter(st for st, _, _ in got)
                    codes = Counter(f"{st} {c}" for st, c, _ in got if st != 200)
                    extra = {
                        "calls": len(got),
                        "statuses": dict(statuses),
                        "refusals": dict(codes),
                        "status_5xx": sum(n for st, n in statuses.items() if st >= 500),
                        "no_answer": statuses.get(0, 0),
                        "p99_s": p99([t for st, _, t in got if st == 200]),
                    }
                elif case == "trickle":
                    base = asyncio.run(others(pool.gateway, 40))
                    meanwhile, ended = asyncio.run(trickle(pool.gateway, args.trickle, 20.0))
                    extra = {
                        "trickling": args.trickle,
                        "other_statuses": dict(Counter(st for st, _, _ in meanwhile)),
                        "other_p99_s": p99([t for _, _, t in meanwhile]),
                        "baseline_p99_s": p99([t for _, _, t in base]),
                        "trickles_ended": dict(ended),
                    }
                else:
                    got = asyncio.run(big(pool.gateway, args.big, 60 * 10**6))
                    after = asyncio.run(others(pool.gateway, 4))
                    extra = {
                        "bodies": dict(got),
                        "other_statuses": dict(Counter(st for st, _, _ in after)),
                    }
                extra["wall_s"] = round(time.monotonic() - t0, 1)
            return row(case, pool, s, extra)
        finally:
            pool.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--streams", type=int, default=0, help="calls at once (0: skip)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument(
        "--box-connections", type=int, help="the boxes' limits.max_connections (default 512)"
    )
    ap.add_argument("--trickle", type=int, default=0, help="trickling bodies (0: skip)")
    ap.add_argument("--big", type=int, default=0, help="chunked and declared 60 MB bodies each")
    ap.add_argument("--failure-mode", default="fail_open", choices=("fail_open", "fail_closed"))
    ap.add_argument("--workdir", help="where the pool's logs go (default: a temporary folder)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    cases = [
        c for c, n in (("streams", args.streams), ("trickle", args.trickle), ("big", args.big)) if n
    ]
    rows = [run_case(c, args) for c in cases]
    if args.json:
        print(json.dumps({"rows": rows}))
    else:
        for r in rows:
            print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
