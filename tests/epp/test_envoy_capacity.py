"""A pool's capacity behind the real Envoy, fail-open (where Envoy could route a call unpicked):
more calls at once than the boxes take are each picked or answered 429 with `retry-after`, never
a 5xx and never routed round robin; Envoy's own limits, sized from the pool, overflow as a 429
too; many bodies that trickle do not stop other calls being picked; large bodies, chunked and
declared, leave the picker's memory bounded. Scaled to what a loaded 2-core machine does; the
full-size runs are bench/pool_faults.py's."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter

import httpx
import pytest
from typer.testing import CliRunner

from talaria_ctl.main import app as ctl
from talaria_pool import devpool, envoy
from talariad.epp.config import box_call_capacity
from tests.support.loopback import peer_closed
from tests.support.pool import chat, needs_envoy, running_pool, served_by_id

pytestmark = [pytest.mark.e2e, needs_envoy]

BOX_CONNECTIONS = 12  # a box takes 4 calls at once (8 connections kept for polls and checks)
BOXES = 2
BODY_TIMEOUT_S = 12.0
MIB = 2**20


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    epp = {"body_timeout_s": BODY_TIMEOUT_S}
    limits = {"max_connections": BOX_CONNECTIONS}
    with running_pool(
        tmp_path_factory.mktemp("capacity"), boxes=BOXES, limits=limits, epp=epp
    ) as p:
        yield p


def envoy_stats(admin: str) -> dict[str, int]:
    text = httpx.get(f"{admin}/stats", timeout=5).text
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(": ")
        if value.strip().isdigit():
            out[name] = int(value)
    return out


def unpicked(admin: str) -> dict[str, int]:
    """What Envoy routed without a pick: the fail-open cluster's requests and ext_proc's
    failures it let through (the one query docs/pool.md gives operators reads these)."""
    stats = envoy_stats(admin)
    return {
        k: v
        for k, v in stats.items()
        if k == "cluster.pool_fallback.upstream_rq_total" or k.endswith("failure_mode_allowed")
    }


async def burst(gateway: str, calls: int, max_tokens: int, rounds: int = 2) -> list:
    """`calls` sessions at once, each calling `rounds` times in a row."""
    limits = httpx.Limits(max_connections=calls)
    timeout = httpx.Timeout(120, connect=10)
    async with httpx.AsyncClient(base_url=f"http://{gateway}", limits=limits, timeout=timeout) as c:

        async def session(i: int) -> list:
            history = [{"role": "user", "content": f"session {i}: " + "work " * 20}]
            return [
                await chat(c, f"cap-{gateway}-{i}", history, stream=False, max_tokens=max_tokens)
                for _ in range(rounds)
            ]

        done = await asyncio.gather(*(session(i) for i in range(calls)))
    return [a for answers in done for a in answers]


def check_answers(answers: list) -> Counter:
    """Every call picked and served (200) or refused 429 with retry-after in the API's shape."""
    statuses = Counter(a.status for a in answers)
    assert set(statuses) <= {200, 429}, statuses
    for a in answers:
        if a.status == 429:
            assert a.headers["retry-after"] == "1", a.headers
            assert a.body["error"]["type"] == "rate_limit_exceeded", a.body
    return statuses


class Watch:
    """Samples the picker's /status in a thread: the most calls it had open on each box."""

    def __init__(self, admin: str) -> None:
        self.admin, self.peak, self.stop = admin, Counter(), threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            for box in devpool.epp_status(self.admin).get("boxes", []):
                self.peak[box["name"]] = max(self.peak[box["name"]], box["in_flight"])
            time.sleep(0.02)

    def __enter__(self) -> Watch:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def test_more_calls_than_the_pool_takes_are_picked_or_429_never_5xx_nor_unpicked(pool):
    capacity = box_call_capacity(BOX_CONNECTIONS)
    status = devpool.epp_status(pool.epp_admin)
    assert all(b["capacity"] == capacity for b in status["boxes"])  # from the boxes' snapshots
    with Watch(pool.epp_admin) as watch:
        answers = asyncio.run(burst(pool.gateway, 5 * capacity * BOXES, max_tokens=300))
    statuses = check_answers(answers)
    codes = Counter(a.body["error"]["code"] for a in answers if a.status == 429)
    print(f"\n{len(answers)} calls, capacity {capacity * BOXES}: {dict(statuses)}, 429s {codes}")
    assert statuses[200] >= capacity * BOXES and codes["pool_full"] > 0
    assert all(n <= capacity for n in watch.peak.values()), watch.peak  # no box over its limit
    log = served_by_id(pool)
    served = [log[a.headers["x-request-id"]] for a in answers if a.status == 200]
    assert served and all(row["picked"] not in ("", "-", None) for row in served)
    assert all(v == 0 for v in unpicked(pool.envoy_admin).values()), unpicked(pool.envoy_admin)
    # the operator's one place: the picker's refusals and what Envoy did, side by side
    argv = ["--epp", pool.epp_admin, "status", "--gateway", pool.envoy_admin]
    shown = CliRunner().invoke(ctl, argv)
    assert shown.exit_code == 0, shown.output
    assert f"refused: {codes['pool_full']} x 429 pool_full" in shown.stdout
    assert "no call routed unpicked, no limit overflowed" in shown.stdout


def test_envoys_own_limits_overflow_as_a_429_in_the_apis_shape(pool):
    # a gateway that believes the boxes take fewer calls than they publish to the picker: its
    # circuit breakers, not the picker, are the limit (as with several pickers)
    spec = envoy.GatewaySpec(
        "127.0.0.1:0", pool.epp, tuple(pool.boxes), box_max_connections=9, access_log="/dev/null"
    )
    gateway = devpool.start_gateway(pool, spec, "envoy-tight")
    answers = asyncio.run(burst(gateway.listen, 24, max_tokens=300))
    statuses = check_answers(answers)
    overflowed = envoy_stats(gateway.admin).get("cluster.pool_picked.upstream_rq_pending_overflow")
    codes = Counter(a.body["error"]["code"] for a in answers if a.status == 429)
    print(f"\ntight gateway: {dict(statuses)}, 429s {codes}, Envoy overflows {overflowed}")
    assert overflowed and codes["pool_full"] >= overflowed
    assert statuses[200] >= BOXES
    assert all(v == 0 for v in unpicked(gateway.admin).values())


async def _trickle(gateway: str, n: int, stop: asyncio.Event) -> list[bytes]:
    """`n` connections each sending a body one byte a second; each one's answer."""
    host, port = envoy.split_address(gateway)
    conns = [await asyncio.open_connection(host, port) for _ in range(n)]
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: pool\r\ncontent-type: application/json\r\n"
        b"content-length: 1000\r\n\r\n{"
    )
    for _, w in conns:
        w.write(head)
    answers = [asyncio.create_task(r.read(65536)) for r, _ in conns]
    while not stop.is_set() and not all(a.done() for a in answers):
        for (_, w), a in zip(conns, answers, strict=True):
            if not a.done():
                w.write(b" ")
        await asyncio.sleep(1.0)
    out = await asyncio.gather(*answers)
    for _, w in conns:
        w.close()
    return out


def test_trickling_bodies_do_not_stop_other_calls_being_picked(pool):
    trickles = 200

    async def run() -> tuple[list[bytes], list, float]:
        stop = asyncio.Event()
        slow = asyncio.create_task(_trickle(pool.gateway, trickles, stop))
        admin = f"http://{pool.epp_admin}/metrics"
        deadline = time.monotonic() + 30
        while _gauge(admin, "talaria_epp_streams_in_flight") < trickles:  # all at the picker
            assert time.monotonic() < deadline, "the trickling calls never reached the picker"
            await asyncio.sleep(0.1)
        peak = _gauge(admin, "talaria_epp_streams_in_flight")
        answers = []
        async with httpx.AsyncClient(base_url=f"http://{pool.gateway}", timeout=60) as c:
            for turn in range(12):  # while every trickle is held open
                history = [{"role": "user", "content": f"meanwhile {turn}"}]
                answers.append(
                    await chat(c, f"meanwhile-{turn % 3}", history, stream=turn % 2 == 1)
                )
        still = _gauge(admin, "talaria_epp_streams_in_flight")
        assert still >= trickles, "a trickle ended before the other calls were done"
        slow_answers = await slow
        return slow_answers, answers, peak

    slow_answers, answers, peak = asyncio.run(run())
    print(
        f"\n{trickles} trickling bodies (picker streams at peak {peak}): other calls {len(answers)}"
    )
    assert [a.status for a in answers] == [200] * len(answers)
    # each trickle, at the body's deadline, gets the box's 408 in the API's shape
    for raw in slow_answers:
        assert raw.startswith(b"HTTP/1.1 408"), raw[:200]
    assert all(v == 0 for v in unpicked(pool.envoy_admin).values())


def _gauge(url: str, name: str) -> float:
    for line in httpx.get(url, timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def _big_body(gateway: str, size: int, chunked: bool) -> bytes:
    """POST a `size`-byte body (chunked, or declared and never sent): the answer's first bytes.
    Writing stops when the answer comes (Envoy closes the connection after a refusal)."""
    host, port = envoy.split_address(gateway)
    reader, writer = await asyncio.open_connection(host, port)
    framing = "transfer-encoding: chunked" if chunked else f"content-length: {size}"
    writer.write(
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: pool\r\n{framing}\r\n"
        "content-type: application/json\r\n\r\n".encode()
    )
    answer = asyncio.create_task(reader.read(65536))
    piece = b"x" * MIB
    sent = 0
    try:
        while chunked and sent < size and not answer.done():
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            sent += len(piece)
        if chunked and not answer.done():
            writer.write(b"0\r\n\r\n")
            await writer.drain()
    except ConnectionError:
        pass  # refused and closed while the rest was on its way
    try:
        return await asyncio.wait_for(answer, 120)
    finally:
        writer.close()


def test_large_bodies_leave_the_pickers_memory_bounded(pool):
    pid = pool.procs["epp"].proc.pid
    before = rss_mib(pid)
    peak = [before]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak.append(rss_mib(pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    async def run() -> tuple[list[bytes], list[bytes], int]:
        size = 60 * 10**6
        declared = asyncio.gather(*(_big_body(pool.gateway, size, False) for _ in range(8)))
        chunked = asyncio.gather(*(_big_body(pool.gateway, size, True) for _ in range(4)))
        async with httpx.AsyncClient(base_url=f"http://{pool.gateway}", timeout=60) as c:
            history = [{"role": "user", "content": "meanwhile"}]
            other = await chat(c, "beside-big-bodies", history, stream=False)
        return await declared, await chunked, other.status

    try:
        declared, chunked, other = asyncio.run(run())
    finally:
        stop.set()
        sampler.join()
    grown = max(peak) - before
    print(f"\npicker RSS {before:.0f} MiB, +{grown:.0f} MiB at most under 12 x 60 MB bodies")
    assert all(raw.startswith(b"HTTP/1.1 413") for raw in declared), [r[:100] for r in declared]
    for raw in chunked:  # past the limit (413), or past what the picker holds at once (429)
        assert raw.startswith((b"HTTP/1.1 413", b"HTTP/1.1 429")), raw[:200]
        body = json.loads(raw.partition(b"\r\n\r\n")[2])
        assert body["error"]["code"] in ("request_too_large", "epp_body_buffer_full")
    assert other == 200
    assert grown <= 200, grown


def test_the_gateway_admits_no_more_calls_than_the_pickers_take_streams(pool):
    # pickers x max_streams connections at once: Envoy's breaker on the pickers' cluster, which
    # under fail-open would route a call unpicked, is never the limit a call meets
    spec = envoy.GatewaySpec(
        "127.0.0.1:0", pool.epp, tuple(pool.boxes), epp_max_streams=5, access_log="/dev/null"
    )
    gateway = devpool.start_gateway(pool, spec, "envoy-few-streams")

    async def run() -> tuple[int, int]:
        host, port = envoy.split_address(gateway.listen)
        conns = [await asyncio.open_connection(host, port) for _ in range(20)]
        head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: pool\r\ncontent-length: 10\r\n\r\n{"
        for _, w in conns:
            w.write(head)
        reads = [asyncio.create_task(peer_closed(r)) for r, _ in conns]
        # the 15 past the limit are closed at accept: wait for them (a loaded machine is slow),
        # not for a fixed time; the 5 admitted wait for their bodies' end, which never comes
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while sum(t.done() for t in reads) < 15 and loop.time() < deadline:
            waiting = [t for t in reads if not t.done()]
            await asyncio.wait(
                waiting, timeout=deadline - loop.time(), return_when="FIRST_COMPLETED"
            )
        closed = sum(1 for t in reads if t.done() and t.result())
        held = sum(1 for t in reads if not t.done())
        for t in reads:
            t.cancel()
        for _, w in conns:
            w.close()
        return closed, held

    closed, held = asyncio.run(run())
    stats = envoy_stats(gateway.admin)
    overflow = sum(v for k, v in stats.items() if k.endswith("downstream_cx_overflow"))
    print(f"\n20 connections to a gateway for 5 streams: {held} held, {closed} closed")
    assert held == 5 and closed == 15 and overflow == 15
    assert all(v == 0 for v in unpicked(gateway.admin).values())
