"""Does the pool survive its parts? One row per case, each a fresh pool on loopback (sim boxes,
`talariad epp` pickers and the real Envoy: `talaria_pool/devpool.py`) under agent sessions (the
session driver of `bench/pool_load.py`: N sessions x 10 calls with tool gaps, odd ones streamed,
a refused or cut call sent again after its `retry-after`), with one fault or extra load from
`--fault-at` seconds into the load (issue 38, "Benchmark"):

    baseline      no fault
    picker_kill   SIGKILL one of the pickers (Envoy has --pickers of them)
    picker_term   SIGTERM one (it drains: NOT_SERVING, then its open streams, then exits)
    box_kill      SIGKILL one box
    box_stop      SIGSTOP one box for 10 s, then SIGCONT
    streams_1500  1,500 concurrent streamed calls of new sessions
    big_bodies    8 concurrent 60 MB bodies (declared with content-length)
    trickle_2000  2,000 connections sending a body at 1 byte/s until the sessions end
    fuzz          3,000 malformed requests (bench/fuzz.py's, one after another)

Columns. `calls`: the sessions' calls sent (retries included). A failed call (anything but a
whole 200) is counted once, in the first of: `failed_in_flight`, sent before the fault and
ended after it (the stream it was on was cut: it cannot be saved); `failed_not_at_box`, the
gateway's 503 `box_unreachable` (neither its pick nor its fallback took it: it never reached a
box); `failed_after`, sent at or after the fault. A failure sent and ended before the fault is
in none (the text says how many). `status_5xx`: 5xx answers to the sessions' calls and to the
case's own extra requests. `sessions_one_box`: sessions whose answered calls all went to one
box. `other_p99_s`: p99 of send-to-end of the sessions' calls answered 200 (for a kill or a
stop, less those on their way at its instant, as `failed_in_flight` counts). `picker_rss_mib`:
the largest peak RSS (VmHWM) of any picker. `load`: the 1-minute load average at the row's end.
A column a row does not measure is `-` (JSON null), never 0.

    PYTHONPATH=. python bench/pool_faults.py [--sessions 200] [--cases baseline,box_kill]
        [--pickers 2] [--fault-at 3] [--seed 0] [--json]

`--json` prints {"rows": [...]}, one object per row with exactly: case, calls, failed_in_flight,
failed_not_at_box, failed_after, status_5xx, sessions_one_box, other_p99_s, picker_rss_mib,
load. The text report adds, per row, the statuses, what the case's extra traffic got, and how
many calls Envoy routed without a pick (its access log).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import shutil
import signal
import ssl
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's talariad, here and (PYTHONPATH) in the pool

import fuzz  # noqa: E402  (bench/fuzz.py: the fuzzed requests, sent one after another)
import pool_load  # noqa: E402  (bench/pool_load.py: the agent sessions)

from talaria_pool import devpool, envoy  # noqa: E402

ROW_FIELDS = (
    "case",
    "calls",
    "failed_in_flight",
    "failed_not_at_box",
    "failed_after",
    "status_5xx",
    "sessions_one_box",
    "other_p99_s",
    "picker_rss_mib",
    "load",
)
CALLS = 10
BOX_STOP_S = 10.0
STREAMS = 1500
BIG_BODIES, BIG_BODY_BYTES = 8, 60 * 1000 * 1000
TRICKLES = 2000
FUZZ_REQUESTS = 3000
SLOW_S = 5.0  # a call sent after the fault slower than this waited on it (a stopped box)
CUTS = {"picker_kill", "picker_term", "box_kill", "box_stop"}
"""Cases whose fault hits the calls on their way at its instant: `other_p99_s` leaves those out
(the other cases' extra load starts then: every call of the sessions is an "other" call)."""
UNREACHABLE = envoy.UNREACHABLE.code  # the gateway's 503 for a call no box took
VICTIM_PICKER = 1  # the second picker: the first's operators' address stays up for reading
VICTIM_BOX = 1


class UsageError(Exception):
    """A bad command line: one line, exit 2."""


@dataclass
class Extra:
    """What a case's own traffic got (streams, bodies, trickles, fuzzed requests)."""

    sent: int = 0
    statuses: collections.Counter = field(default_factory=collections.Counter)
    note: str = ""

    @property
    def status_5xx(self) -> int:
        return sum(n for s, n in self.statuses.items() if s.isdigit() and s.startswith("5"))


@dataclass
class Row:
    case: str
    calls: list[pool_load.Call]
    fault_at: float | None  # monotonic; None: no fault
    extra: Extra
    rss_start_mib: float | None
    rss_peak_mib: float | None
    load: float
    took_s: float
    unpicked: collections.Counter = field(default_factory=collections.Counter)
    """Calls Envoy routed without a pick (its access log: no picked endpoint), sessions' or
    the case's own."""


# --- the faults and extra loads ----------------------------------------------------------------


def _signal(pool: devpool.LocalPool, name: str, sig: int) -> None:
    os.kill(pool.procs[name].proc.pid, sig)


async def picker_signal(pool: devpool.LocalPool, sig: int, extra: Extra) -> None:
    name = devpool.picker_name(VICTIM_PICKER)
    proc = pool.procs[name].proc
    started = time.monotonic()
    _signal(pool, name, sig)
    while proc.poll() is None:
        await asyncio.sleep(0.05)
    extra.note = f"{name} exited {proc.returncode} after {time.monotonic() - started:.2f} s"


async def box_kill(pool: devpool.LocalPool, extra: Extra) -> None:
    _signal(pool, f"box{VICTIM_BOX}", signal.SIGKILL)
    extra.note = f"box{VICTIM_BOX} killed"


async def box_stop(pool: devpool.LocalPool, extra: Extra) -> None:
    name = f"box{VICTIM_BOX}"
    _signal(pool, name, signal.SIGSTOP)
    try:
        await asyncio.sleep(BOX_STOP_S)
    finally:
        _signal(pool, name, signal.SIGCONT)
    extra.note = f"{name} stopped {BOX_STOP_S:g} s"


async def streams(pool: devpool.LocalPool, extra: Extra) -> None:
    """1,500 streamed calls at once, each a new session's first call."""
    limits = httpx.Limits(max_connections=STREAMS + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(
        base_url=f"http://{pool.gateway}", timeout=300, limits=limits
    ) as client:

        async def one(i: int) -> None:
            body = {
                "model": pool_load.MODEL,
                "messages": [
                    {
                        "role": "user",
                        "content": f"stream {i}: {pool_load.words(30, random.Random(i))}",
                    }
                ],
                "max_tokens": pool_load.MAX_TOKENS,
                "stream": True,
            }
            headers = {pool_load.SESSION_HEADER: f"streams-{i}", "x-request-id": f"st-{i}"}
            try:
                async with client.stream(
                    "POST", "/v1/chat/completions", json=body, headers=headers
                ) as r:
                    async for _ in r.aiter_bytes():
                        pass
                    status = str(r.status_code)
            except httpx.HTTPError as err:
                status = type(err).__name__
            extra.statuses[status] += 1

        extra.sent = STREAMS
        await asyncio.gather(*(one(i) for i in range(STREAMS)))


def request_head(length: int) -> bytes:
    """A chat call's request line and headers, its body `length` bytes (declared)."""
    return (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: pool\r\ncontent-type: application/json\r\n"
        f"content-length: {length}\r\n\r\n"
    ).encode()


async def raw_call(
    pool: devpool.LocalPool, body: bytes, chunk: int, every_s: float, done: asyncio.Event
) -> str:
    """Send a call's body `chunk` bytes at a time, `every_s` apart, over a socket of its own,
    until it is whole, answered (an answer may come before the body is: a 413 at the headers)
    or `done`; its status, or what stopped it. (An HTTP client reports an answer that came
    while it was still writing as a reset.)"""
    host, port = envoy.split_address(pool.gateway)
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as err:
        return f"connect {type(err).__name__}"
    answer = asyncio.create_task(reader.readline())
    cut = ""
    try:
        try:
            writer.write(request_head(len(body)))
            for at in range(0, len(body), chunk):
                if answer.done() or done.is_set():
                    break
                writer.write(body[at : at + chunk])
                await writer.drain()
                if every_s:
                    await asyncio.wait([answer], timeout=every_s)
        except OSError as err:  # the gateway closed its side: its answer may be read yet
            cut = type(err).__name__
        if not done.is_set():
            await asyncio.wait([answer], timeout=60)
        parts = answer.result().split() if answer.done() else []
        return parts[1].decode() if len(parts) > 1 else cut or "unanswered"
    except (OSError, asyncio.IncompleteReadError) as err:
        return cut or type(err).__name__
    finally:
        answer.cancel()
        writer.close()


async def big_bodies(pool: devpool.LocalPool, extra: Extra) -> None:
    """8 bodies of 60 MB at once, each declared with its length (a chat call, padded), sent
    as fast as the gateway reads them."""
    pad = b"x" * (BIG_BODY_BYTES - 200)
    body = b'{"model": "' + pool_load.MODEL.encode() + b'", "messages": [{"role": "user", '
    body += b'"content": "' + pad + b'"}]}'
    never = asyncio.Event()
    extra.sent = BIG_BODIES
    got = await asyncio.gather(
        *(raw_call(pool, body, 1 << 20, 0.0, never) for _ in range(BIG_BODIES))
    )
    extra.statuses.update(got)


async def trickle(pool: devpool.LocalPool, extra: Extra, done: asyncio.Event) -> None:
    """2,000 connections, each a call whose body comes at one byte a second, until the
    sessions end (or it is answered)."""
    body = json.dumps({"model": pool_load.MODEL, "messages": []}).encode()
    extra.sent = TRICKLES
    extra.statuses.update(
        await asyncio.gather(*(raw_call(pool, body, 1, 1.0, done) for _ in range(TRICKLES)))
    )


async def fuzzed(pool: devpool.LocalPool, extra: Extra, seed: int) -> None:
    result = await asyncio.to_thread(fuzz.fire, f"http://{pool.gateway}", FUZZ_REQUESTS, seed)
    extra.sent = result["requests"]
    extra.statuses.update(result["by_status"])
    extra.note = (
        f"retryable (429/503/retry-after) {result['retryable']}, "
        f"unanswered {result['unanswered']}, {result['seconds']} s"
    )


Fault = Callable[[devpool.LocalPool, Extra, asyncio.Event, int], Awaitable[None]]
CASES: dict[str, Fault | None] = {
    "baseline": None,
    "picker_kill": lambda p, x, _d, _s: picker_signal(p, signal.SIGKILL, x),
    "picker_term": lambda p, x, _d, _s: picker_signal(p, signal.SIGTERM, x),
    "box_kill": lambda p, x, _d, _s: box_kill(p, x),
    "box_stop": lambda p, x, _d, _s: box_stop(p, x),
    "streams_1500": lambda p, x, _d, _s: streams(p, x),
    "big_bodies": lambda p, x, _d, _s: big_bodies(p, x),
    "trickle_2000": lambda p, x, d, _s: trickle(p, x, d),
    "fuzz": lambda p, x, _d, s: fuzzed(p, x, s),
}


# --- one row ------------------------------------------------------------------------------------


def vm_kib(pid: int, key: str) -> int | None:
    """A `/proc/PID/status` size in KiB (VmRSS, VmHWM: the peak); None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class RSSWatch:
    """The pickers' peak RSS, read every 0.2 s (a killed picker's peak is its last reading)."""

    def __init__(self, pool: devpool.LocalPool, pickers: int) -> None:
        self.pids = [pool.procs[devpool.picker_name(i)].proc.pid for i in range(pickers)]
        start = [vm_kib(pid, "VmRSS") for pid in self.pids]
        self.start_kib = max((k for k in start if k is not None), default=None)
        self.peak_kib: dict[int, int] = {}

    def read(self) -> None:
        for pid in self.pids:
            kib = vm_kib(pid, "VmHWM")
            if kib is not None:
                self.peak_kib[pid] = max(kib, self.peak_kib.get(pid, 0))

    async def watch(self) -> None:
        while True:
            self.read()
            await asyncio.sleep(0.2)


async def drive(pool: devpool.LocalPool, case: str, args: argparse.Namespace) -> Row:
    a = pool_load.agents(args.seed, f"{case}-{os.urandom(2).hex()}")
    tls = ssl.create_default_context()  # unused (plain HTTP); one, not one per client
    rss = RSSWatch(pool, args.pickers)
    extra, done = Extra(), asyncio.Event()
    start = time.monotonic()
    fault_at: float | None = None
    watcher = asyncio.create_task(rss.watch())

    async def fault() -> None:
        nonlocal fault_at
        await asyncio.sleep(args.fault_at)
        fault_at = time.monotonic()
        await CASES[case](pool, extra, done, args.seed)

    faulting = asyncio.create_task(fault()) if CASES[case] is not None else None
    try:
        await asyncio.gather(
            *(
                pool_load.session(pool.gateway, tls, a, i, CALLS, args.gap, args.seed)
                for i in range(args.sessions)
            )
        )
        done.set()
        if faulting is not None:
            await faulting
    finally:
        done.set()
        for task in (faulting, watcher):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (faulting, watcher) if t), return_exceptions=True)
    rss.read()
    peak = max(rss.peak_kib.values(), default=None)
    return Row(
        case,
        a.calls,
        fault_at,
        extra,
        None if rss.start_kib is None else rss.start_kib / 1024,
        None if peak is None else peak / 1024,
        os.getloadavg()[0],
        time.monotonic() - start,
    )


def run_case(case: str, args: argparse.Namespace) -> Row:
    """A fresh pool, the sessions, the case; every process stopped however it ends."""
    workdir = Path(tempfile.mkdtemp(prefix=f"talaria-pool-faults-{case}-"))
    pool = None
    ok = False
    try:
        pool = devpool.start_pool(workdir, args.boxes, pickers=args.pickers)
        row = asyncio.run(drive(pool, case, args))
        row.unpicked = unpicked(pool)
        ok = True
        return row
    finally:
        if pool is not None:
            _resume_all(pool)
            pool.stop()
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"pool_faults: {case}: logs kept in {workdir}", file=sys.stderr)


def unpicked(pool: devpool.LocalPool) -> collections.Counter:
    """Envoy's access log: the calls it routed with no picked endpoint (failing open, or an
    overflow of the pickers' cluster), the sessions' (`pl-` request ids) and the others."""
    time.sleep(0.5)  # Envoy flushes its access log every 200 ms
    out: collections.Counter = collections.Counter()
    for r in pool.access_log():
        if r.get("picked") in (None, "", "-") and r.get("served") not in (None, "", "-"):
            out["sessions" if str(r.get("request_id")).startswith("pl-") else "other"] += 1
    return out


def _resume_all(pool: devpool.LocalPool) -> None:
    """A stopped box takes no SIGTERM: continue every part before stopping them."""
    for p in pool.procs.values():
        if p.proc.poll() is None:
            os.kill(p.proc.pid, signal.SIGCONT)


# --- the table ----------------------------------------------------------------------------------


def classify(row: Row) -> tuple[dict, int]:
    """The failure columns, and how many failures came before the fault (in none of them)."""
    failed = [c for c in row.calls if c.status != "200"]
    at = row.fault_at
    in_flight = not_at_box = after = before = 0
    for c in failed:
        if at is not None and c.sent < at <= c.ended:
            in_flight += 1
        elif c.error == UNREACHABLE:
            not_at_box += 1
        elif at is None or c.sent >= at:
            after += 1
        else:
            before += 1
    cols = {
        "failed_in_flight": None if at is None else in_flight,
        "failed_not_at_box": not_at_box,
        "failed_after": after,
    }
    return cols, before


def summarize(row: Row, sessions: int) -> tuple[dict, dict]:
    cols, before = classify(row)
    answered = [c for c in row.calls if c.status == "200"]
    boxes: dict[int, set] = collections.defaultdict(set)
    for c in answered:
        boxes[c.session].add(c.box)
    own_5xx = sum(1 for c in row.calls if c.status.startswith("5"))
    at = row.fault_at if row.case in CUTS else None
    others = [c for c in answered if at is None or not c.sent < at <= c.ended]
    latencies = [c.ended - c.sent for c in others]
    out = {
        "case": row.case,
        "calls": len(row.calls),
        **cols,
        "status_5xx": own_5xx + row.extra.status_5xx,
        "sessions_one_box": sum(1 for i in range(sessions) if len(boxes[i]) == 1),
        "other_p99_s": _round(pool_load.pct(latencies, 0.99), 3),
        "picker_rss_mib": _round(row.rss_peak_mib, 1),
        "load": round(row.load, 2),
    }
    statuses = collections.Counter(c.status + (f" {c.error}" if c.error else "") for c in row.calls)
    notes = {
        "statuses": statuses,
        "before": before,
        "extra": row.extra,
        "rss_start_mib": row.rss_start_mib,
        "took_s": row.took_s,
        "unpicked": row.unpicked,
        "slow_after": sum(
            1
            for c in answered
            if row.fault_at is not None and c.sent >= row.fault_at and c.ended - c.sent > SLOW_S
        ),
        "fault_s": None if row.fault_at is None else fault_offset(row),
    }
    return out, notes


def fault_offset(row: Row) -> float:
    """Seconds from the first call to the fault."""
    first = min((c.sent for c in row.calls), default=row.fault_at)
    return row.fault_at - first


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def _cell(x) -> str:
    return "-" if x is None else str(x)


def table(rows: list[dict], notes: list[dict], args: argparse.Namespace) -> str:
    head = (
        "case",
        "calls",
        "in_flight",
        "not_at_box",
        "after",
        "5xx",
        "one_box",
        "p99_s",
        "rss_MiB",
        "load",
    )
    lines = [
        f"pool_faults: {args.sessions} sessions x {CALLS} calls, {args.boxes} boxes, "
        f"{args.pickers} pickers, tool gaps {args.gap[0]:g}-{args.gap[1]:g} s, fault at "
        f"{args.fault_at:g} s, seed {args.seed}, {os.cpu_count()} CPUs",
        "  ".join(f"{h:>12}" for h in head),
    ]
    for r in rows:
        lines.append("  ".join(f"{_cell(r[k]):>12}" for k in ROW_FIELDS))
    lines.append("")
    for r, n in zip(rows, notes, strict=True):
        x = n["extra"]
        parts = [
            f"statuses {dict(sorted(n['statuses'].items()))}",
            f"{n['before']} failed before the fault",
            f"took {n['took_s']:.1f} s",
            f"picker RSS at start {_cell(_round(n['rss_start_mib'], 1))} MiB",
            f"routed without a pick: {n['unpicked']['sessions']} of the sessions' calls, "
            f"{n['unpicked']['other']} others",
        ]
        if n["fault_s"] is not None:
            parts.append(f"fault {n['fault_s']:.1f} s after the first call")
            parts.append(f"{n['slow_after']} calls sent after it took over {SLOW_S:g} s")
        if x.sent:
            parts.append(f"its own {x.sent} requests: {dict(sorted(x.statuses.items()))}")
        if x.note:
            parts.append(x.note)
        lines.append(f"{r['case']}: " + "; ".join(parts))
    return "\n".join(lines)


# --- the command line ---------------------------------------------------------------------------


def case_list(text: str) -> list[str]:
    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in CASES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown case {', '.join(unknown) or text!r}: choose from {', '.join(CASES)}"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    ap = pool_load.Parser(
        prog="pool_faults",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--cases", type=case_list, default=list(CASES), help="comma-separated")
    ap.add_argument("--boxes", type=int, default=3)
    ap.add_argument("--pickers", type=int, default=2)
    ap.add_argument("--gap", type=pool_load.gap_range, default=(0.2, 1.0), help="LOW,HIGH s")
    ap.add_argument("--fault-at", type=float, default=3.0, help="seconds into the load (default 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help='{"rows": [...]} on stdout')
    args = ap.parse_args(argv)
    if args.sessions < 1 or args.boxes < 2 or args.pickers < 2 or args.fault_at < 0:
        ap.error("need --sessions >= 1, --boxes >= 2, --pickers >= 2, --fault-at >= 0")
    if not pool_load.ready_to_run("pool_faults"):
        return 1
    rows, notes = [], []
    try:
        for case in args.cases:
            out, note = summarize(run_case(case, args), args.sessions)
            rows.append(out)
            notes.append(note)
            if not args.json:
                print(f"pool_faults: {case} done", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("pool_faults: interrupted", file=sys.stderr)
        return 130
    except (devpool.PoolError, envoy.EnvoyError) as err:
        print(f"pool_faults: {err}", file=sys.stderr)
        return 1
    print(json.dumps({"rows": rows}) if args.json else table(rows, notes, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
