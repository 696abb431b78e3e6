"""What the pool's gateway costs: the latency Envoy + EPP adds over Envoy alone and over a direct
call to a box (p50/p99, arms interleaved, c=1, response body echoed and NONE): today's full-duplex
path (`envoy_epp_*`), a lease return placed at its request headers (`envoy_epp_lease_*`) and a new
session through the same config (`envoy_epp_new_*`), beside their floors, Envoy + a server that
picks nothing (`null_ext_proc.py`: `envoy_null_none`, `envoy_null_lease_none`); the picker's CPU
per call through Envoy with 70 KB agent bodies (`picker_cpu_ms_per_call`) and the calls/s it
sustains with them; the EPP's CPU per box poll (answered 304, in full, as before conditional
polls, beside a bare httpx GET) and its poll loop's over 256 boxes, idle and busy, following the
boxes' snapshot streams and polling them; and the EPP's
decision time at 16, 256 and 1,000 boxes with 100k live sessions (the picker in-process, fed
synthetic box snapshots).

    python bench/epp_bench.py [--calls 300] [--agent-calls 100] [--throughput-s 10]
        [--polls 300] [--decisions 2000] [--sessions 100000] [--boxes N ...]
        [--part latency|poll|decision|cores|memory|all] [--memory-sessions 6000] [--json]

`--part memory` places agents' returns past the picker's memory bound (`past_memory`).
`--part cores` runs `bench/epp_cores.py`: picker processes side by side, each fed the same
snapshots of 256 boxes, their calls/s at one process and at as many as the machine has cores.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
from pydantic_core import from_json

from talaria_pool import devpool, envoy
from talariad.epp.boxpicker import BoxPicker
from talariad.epp.config import PICKER_KNOBS
from talariad.epp.contract import EPPRequest, Pick
from talariad.epp.poller import BoxPoller
from talariad.gateway.pool import box_target
from talariad.gc_tuning import PacedCollector
from talariad.router import Router, RouterKnobs
from talariad.router.snapshot import router_snapshot
from talariad.types import KVLocation, KVState
from talariad.wire.box import SNAPSHOT_PATH, BoxModel, BoxSnapshot
from talariad.wire.messages import Telemetry

MODEL = "tiny-agent"
NULL_EXT_PROC = Path(__file__).with_name("null_ext_proc.py")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary_ms(seconds: list[float]) -> dict:
    ms = [s * 1000 for s in seconds]
    return {"p50_ms": round(statistics.median(ms), 3), "p99_ms": round(pct(ms, 0.99), 3)}


# --- latency: direct, Envoy alone, Envoy + EPP (echo), Envoy + EPP (response body NONE) ---------


def plain_envoy_config(box: str) -> str:
    """Envoy alone to one box (the control arm): the same listener shape, no ext_proc."""
    host, port = envoy.split_address(box)
    router = {
        "name": "envoy.filters.http.router",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
        },
    }
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
        "HttpConnectionManager",
        "stat_prefix": "plain",
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "box"}}],
                }
            ]
        },
        "http_filters": [router],
    }
    address = {"socket_address": {"address": host, "port_value": port}}
    cfg = {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "gateway",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": hcm,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "box",
                    "type": "STATIC",
                    "connect_timeout": "2s",
                    "load_assignment": {
                        "cluster_name": "box",
                        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}],
                    },
                }
            ],
        },
    }
    return json.dumps(cfg)  # JSON is YAML


LATENCY_ARMS = {
    # name: (gateway, a session of its own for every call), beside "direct" and "envoy"
    "envoy_epp_echo": ("body_echo", False),  # today's path: the full-duplex filter only
    "envoy_epp_none": ("body_none", False),
    "envoy_null_none": ("null_none", False),  # its floor: a no-op full-duplex ext_proc
    "envoy_epp_lease_none": ("lease_none", False),  # a lease return, placed at its headers
    "envoy_epp_lease_echo": ("lease_echo", False),
    "envoy_null_lease_none": ("null_lease_none", False),  # its floor: a no-op check at headers
    "envoy_epp_new_none": ("lease_none", True),  # a new session: headers, then body
    "envoy_epp_new_echo": ("lease_echo", True),
}
"""The latency arms over Envoy + EPP: which gateway each calls, and whether each of its calls is
a new session (else one session returning to its lease, within τ)."""


def latency(calls: int, agent_calls: int, throughput_s: float) -> dict:
    """One box; the arms called in rotating order, one keep-alive connection each; then, on a
    pool of its own whose box takes no modelled time (the picker's work is what is measured),
    the picker's CPU per call and its calls/s with agent-sized (70 KB) bodies."""
    workdir = Path(tempfile.mkdtemp(prefix="epp-bench-"))
    pool = devpool.start_pool(workdir, boxes=1)
    try:
        gateways = _gateways(pool, workdir, GATEWAYS)
        arms = {"direct": (pool.boxes[0], False), "envoy": (gateways["plain"], False)}
        arms |= {name: (gateways[gw], new) for name, (gw, new) in LATENCY_ARMS.items()}
        placed_before = _at_headers(pool)
        load_before = os.getloadavg()
        times = run_arms(arms, calls)
        load_after = os.getloadavg()
        placed = _at_headers(pool) - placed_before
    finally:
        pool.stop()
    out: dict = {name: summary_ms(ts) for name, ts in times.items()}
    for arm in LATENCY_ARMS:
        for base in ("envoy", "direct"):
            out[f"{arm}_over_{base}"] = {
                k: round(out[arm][k] - out[base][k], 3) for k in ("p50_ms", "p99_ms")
            }
    lease_calls = 2 * (calls + WARM_UP)  # the two lease arms' calls, warm-up included
    out["lease_returns_placed_at_headers"] = round(placed / lease_calls, 3)
    out["calls_per_arm"] = calls
    out["load_before"], out["load_after"] = (
        [round(x, 2) for x in load_before],
        [round(x, 2) for x in load_after],
    )
    workdir = Path(tempfile.mkdtemp(prefix="epp-bench-agents-"))
    pool = devpool.start_pool(workdir, boxes=1, time_scale=AGENT_TIME_SCALE)
    try:
        gateways = _gateways(pool, workdir, ("lease_echo", "body_echo", "null_lease_none"))
        cpu = picker_cpu(pool, gateways, agent_calls)
        rate = throughput(pool, gateways["lease_echo"], throughput_s)
    finally:
        pool.stop()
    # the same lease returns with the box polled once a second: what the calls cost the picker
    # beside what installing the snapshots their changes cause does (the polls' share)
    workdir = Path(tempfile.mkdtemp(prefix="epp-bench-agents-1s-"))
    slow = {"poll_interval_s": 1.0}
    pool = devpool.start_pool(workdir, boxes=1, time_scale=AGENT_TIME_SCALE, epp=slow)
    try:
        gateways = _gateways(pool, workdir, ("lease_echo",))
        polled_1s = picker_cpu(pool, gateways, agent_calls, ("lease_return",))["lease_return"]
    finally:
        pool.stop()
    cpu["lease_return_polled_1s"] = polled_1s
    out["picker_cpu_ms_per_call"] = cpu["lease_return"]
    out["picker_cpu_ms_per_call_by_kind"] = cpu
    out["throughput_70k"] = rate
    return out


AGENT_TIME_SCALE = 0.001
"""The 70 KB measurements' box: its modelled prefill of ~17k tokens takes a thousandth of real
time, so the calls/s say what the gateway and the picker allow, not the box."""

GATEWAYS = {
    "body_echo": ("epp", "full-duplex", False),
    "body_none": ("epp", "none", False),
    "lease_echo": ("epp", "full-duplex", True),
    "lease_none": ("epp", "none", True),
    "null_none": ("null", "none", False),
    "null_lease_none": ("null", "none", True),
}
"""The shipped config's variants: (whose ext_proc: the picker's or the no-op server's, the
response body mode, the check at request headers rendered?)."""


def _gateways(pool: devpool.LocalPool, workdir: Path, names) -> dict[str, str]:
    """Envoy alone and the `GATEWAYS` named, each "host:port"; the no-op server if one needs it."""
    (workdir / "plain.yaml").write_text(plain_envoy_config(pool.boxes[0]))
    plain = envoy.start(workdir / "plain.yaml", workdir, "envoy-plain")
    pool.procs["envoy-plain"] = devpool.Proc("envoy-plain", plain.proc, workdir / "envoy-plain.log")
    out = {"plain": plain.listen}
    null_at = ""
    if any(GATEWAYS[n][0] == "null" for n in names):
        null_at = f"127.0.0.1:{devpool.free_port()}"
        argv = [sys.executable, str(NULL_EXT_PROC), null_at, pool.boxes[0]]
        _wait_listening(pool.spawn("null-ext-proc", argv, workdir), null_at)
    for name in names:
        whose, body, at_headers = GATEWAYS[name]
        epp = pool.epp if whose == "epp" else null_at
        spec = envoy.GatewaySpec(
            "127.0.0.1:0", epp, tuple(pool.boxes), 0, "fail_closed", body, "/dev/null"
        )
        spec = dataclasses.replace(spec, lease_at_headers=at_headers)
        out[name] = devpool.start_gateway(pool, spec, f"envoy-{name}").listen
    return out


def _wait_listening(proc: devpool.Proc, address: str, wait_s: float = 30) -> None:
    deadline = time.monotonic() + wait_s
    while not devpool.connects(address):
        if proc.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the null ext_proc server did not start: see {proc.log}")
        time.sleep(0.1)


WARM_UP = 20  # rounds of every arm before the measured ones


def run_arms(arms: dict[str, tuple[str, bool]], calls: int) -> dict[str, list[float]]:
    """Seconds per call of each arm ("host:port", a new session every call?), c=1."""
    body = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}
    clients = {n: httpx.Client(base_url=f"http://{a}", timeout=30) for n, (a, _) in arms.items()}
    times: dict[str, list[float]] = {n: [] for n in arms}
    names = list(arms)
    try:
        for i in range(calls + WARM_UP):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                session = f"lat-{name}-{i}" if arms[name][1] else f"lat-{name}"
                started = time.perf_counter()
                r = clients[name].post(
                    "/v1/chat/completions", json=body, headers={"x-session-id": session}
                )
                elapsed = time.perf_counter() - started
                if r.status_code != 200:
                    raise RuntimeError(f"{name}: {r.status_code} {r.text[:200]}")
                if i >= WARM_UP:
                    times[name].append(elapsed)
    finally:
        for c in clients.values():
            c.close()
    return times


def _metric(pool: devpool.LocalPool, series: str) -> float:
    text = httpx.get(f"http://{pool.epp_admin}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def _at_headers(pool: devpool.LocalPool) -> float:
    return _metric(pool, 'talaria_epp_at_headers_total{result="placed"}')


# --- the picker's CPU and calls/s through Envoy with agent-sized bodies -----------------------


def _cpu_s(pid: int) -> float:
    """CPU seconds of every thread of process `pid` so far (schedstat: nanoseconds)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that just ended
            pass
    return total / 1e9


class AgentSession:
    """A coding agent's session ~70 KB in (`_agent_conversation`): each call resends it with one
    more exchange."""

    def __init__(self, sid: str) -> None:
        self.sid, self.messages = sid, _agent_conversation()

    def call(self, client: httpx.Client) -> None:
        self.messages.append({"role": "user", "content": f"tool output {len(self.messages)}"})
        body = {"model": MODEL, "max_tokens": 1, "messages": self.messages}
        r = client.post("/v1/chat/completions", json=body, headers={"x-session-id": self.sid})
        if r.status_code != 200:
            raise RuntimeError(f"agent call: {r.status_code} {r.text[:200]}")
        answer = r.json()["choices"][0]["message"]["content"]
        self.messages.append({"role": "assistant", "content": answer})


def picker_cpu(
    pool: devpool.LocalPool, gateways: dict[str, str], calls: int, only: tuple[str, ...] = ()
) -> dict:
    """The picker process's CPU (every thread) per call through Envoy, c=1, 70 KB bodies, net of
    its idle polling (its CPU with no call over as long, measured first): a lease return placed
    at its headers (the shipped config), the same return on the full-duplex path alone, and a
    new session; beside them the no-op server's CPU per call as the check at request headers
    (the floor). `only`: those kinds alone."""
    pid = pool.procs["epp"].proc.pid
    idle_from, idle_at = _cpu_s(pid), time.perf_counter()
    time.sleep(2.0)  # the picker polling its box, no call
    idle_per_s = (_cpu_s(pid) - idle_from) / (time.perf_counter() - idle_at)
    null = pool.procs.get("null-ext-proc")
    kinds = {
        "lease_return": ("lease_echo", False, pid, idle_per_s),
        "body_path_return": ("body_echo", False, pid, idle_per_s),
        "new_session": ("lease_echo", True, pid, idle_per_s),
        "null_floor_at_headers": ("null_lease_none", False, null and null.proc.pid, 0.0),
    }
    out: dict = {}
    for kind, (gateway, new, whose, idle) in kinds.items():
        if only and kind not in only:
            continue
        with httpx.Client(base_url=f"http://{gateways[gateway]}", timeout=60) as client:
            agent = AgentSession(f"cpu-{kind}")
            for _ in range(5):  # warm-up: the session placed, its lease live
                agent.call(client)
            cpu_from, at = _cpu_s(whose), time.perf_counter()
            for i in range(calls):
                if new:
                    agent = AgentSession(f"cpu-{kind}-{i}")
                agent.call(client)
            cpu, wall = _cpu_s(whose) - cpu_from, time.perf_counter() - at
        out[kind] = round((cpu - idle * wall) / calls * 1e3, 3)
    out["body_bytes"] = len(json.dumps(AgentSession("x").messages)) + 50
    out["calls"] = calls
    out["idle_cpu_ms_per_s"] = round(idle_per_s * 1e3, 3)
    return out


def throughput(pool: devpool.LocalPool, gateway: str, seconds: float, concurrency: int = 8) -> dict:
    """Calls/s through Envoy and the picker (the shipped config) with 70 KB bodies: `concurrency`
    agent sessions returning back to back for `seconds`, and the picker's share of a core. On
    one machine with the client, Envoy and the box, the picker is not what bounds the calls/s;
    `picker_bound_calls_per_s` is what its CPU per call would allow on a core of its own."""
    pid = pool.procs["epp"].proc.pid

    async def run() -> int:
        stop_at = time.perf_counter() + seconds
        done = 0

        async def session(i: int) -> None:
            nonlocal done
            agent = AgentSession(f"rate-{i}")
            async with httpx.AsyncClient(base_url=f"http://{gateway}", timeout=60) as client:
                while time.perf_counter() < stop_at:
                    agent.messages.append(
                        {"role": "user", "content": f"tool {len(agent.messages)}"}
                    )
                    body = {"model": MODEL, "max_tokens": 1, "messages": agent.messages}
                    r = await client.post(
                        "/v1/chat/completions", json=body, headers={"x-session-id": agent.sid}
                    )
                    if r.status_code != 200:
                        raise RuntimeError(f"throughput call: {r.status_code} {r.text[:200]}")
                    agent.messages.append({"role": "assistant", "content": "ok"})
                    done += 1

        await asyncio.gather(*(session(i) for i in range(concurrency)))
        return done

    placed_before = _at_headers(pool)
    cpu_from, at = _cpu_s(pid), time.perf_counter()
    done = asyncio.run(run())
    cpu, wall = _cpu_s(pid) - cpu_from, time.perf_counter() - at
    cpu_ms = cpu / max(done, 1) * 1e3
    return {
        "calls_per_s": round(done / wall, 1),
        "concurrency": concurrency,
        "seconds": round(wall, 1),
        "placed_at_headers": round((_at_headers(pool) - placed_before) / max(done, 1), 3),
        "picker_cores": round(cpu / wall, 3),
        "picker_cpu_ms_per_call": round(cpu_ms, 3),
        "picker_bound_calls_per_s": round(1e3 / cpu_ms, 1) if cpu_ms > 0 else None,
        "llm_d_reference": "llm-d's Go endpoint picker: about 324-388 requests/s per replica with "
        "large prompts (its published figures, not measured on this machine)",
    }


# --- polling: the EPP's CPU per box poll ----------------------------------------------------------

BUSY_CHANGES_PER_S = 4.0
"""How often a busy box's snapshot changes: its daemon reads its instances' telemetry every
250 ms (`policy.telemetry_interval_s`); an idle box's says the same for as long as it idles."""
BUSY_SHARE = 0.5
"""The share of the pool's boxes taken as busy for `core_fraction` (the rest idle)."""
LOOP_S = 10.0
"""Seconds the picker's poll loop runs against the idle box, and against the busy one."""
LOOP_BOXES = 256
"""Boxes the poll loop polls: the one box under this many names."""

_BUSY_DRIVER = """
import sys, time, httpx
url, model, end = sys.argv[1], sys.argv[2], time.monotonic() + float(sys.argv[3])
body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}
with httpx.Client(timeout=30) as c:
    i = 0
    while time.monotonic() < end:  # a new session every 100 ms: its view changes every read
        c.post(url, json=body, headers={"x-session-id": f"busy-{i}"})
        i += 1
        time.sleep(0.1)
"""
"""Calls a busy box takes (a process of its own: its CPU is not the picker's)."""


def poll_cost(polls: int) -> dict:
    """The picker's polling CPU, with real HTTP against one sim box. Per poll, arms interleaved
    (`hold_s` 0: answered at once): the poller polling the idle box (conditional: answered
    `304`, the target held kept), a poll answered in full and installed (a changed box: its held
    etag and basis dropped first), the poll as it was before polls were conditional (answered
    in full, the same basis, not installed), and a bare httpx GET; the box daemon's CPU per poll
    answered `304` and in full. Then the poll loop as it runs (`poll_interval_s`,
    `poll_hold_s`) for `LOOP_S` against the idle box and against the box kept busy, following
    the box's snapshot stream (`idle_loop`, `busy_loop`: what the picker does) and polling it
    (`*_polled`: as before, and what an older box gets): its CPU and answers per second per box.
    The core fraction at 256 and 1,000 boxes is extrapolated from those (not run with that many
    boxes). The one box under `LOOP_BOXES` names changes for all of them at once, so one wake-up
    of the loop reads 256 frames: `spread` follows 1,000 boxes' streams whose frames come spread
    in time, as distinct boxes' do (`snapshot_feed.py`), half of them busy and all busy."""
    workdir = Path(tempfile.mkdtemp(prefix="epp-bench-"))
    pool = devpool.LocalPool(workdir)
    (workdir / devpool.TOKEN_FILE).write_text(secrets.token_urlsafe(32) + "\n")
    try:
        box = devpool.start_box(pool, 0)
        token = (workdir / devpool.TOKEN_FILE).read_text().strip()
        pid = pool.procs["box0"].proc.pid
        out = asyncio.run(_poll_cost(box, pid, token, polls))
        out["idle_loop"] = asyncio.run(_loop_cpu(box, token, stream=True, pid=pid))
        out["idle_loop_polled"] = asyncio.run(_loop_cpu(box, token, stream=False, pid=pid))
        argv = [sys.executable, "-c", _BUSY_DRIVER, f"http://{box}/v1/chat/completions"]
        driver = pool.spawn("busy", [*argv, MODEL, str(2 * LOOP_S + 20)], workdir)
        try:
            out["busy_loop"] = asyncio.run(_loop_cpu(box, token, stream=True, pid=pid))
            out["busy_loop_polled"] = asyncio.run(_loop_cpu(box, token, stream=False, pid=pid))
        finally:
            driver.proc.kill()
            driver.proc.wait()
        out["spread"] = [_spread(pool, workdir, token, share) for share in (BUSY_SHARE, 1.0)]
        return _at_scale(out, polls)
    finally:
        pool.stop()


def _at_scale(out: dict, polls: int) -> dict:
    """The pool-scale figures: `core_fraction` for `BUSY_SHARE` of the boxes busy (their loop's
    CPU per second as measured), beside all idle, all busy, polled every `poll_interval_s`
    unheld (a busy box's polls changed at `BUSY_CHANGES_PER_S`), and as before conditional
    polls (every poll answered in full)."""
    interval = BoxPoller.__init__.__defaults__[0]  # type: ignore[index]
    out["poll_interval_s"] = interval
    out["poll_hold_s"] = BoxPoller.__init__.__defaults__[2]  # type: ignore[index]
    idle, busy, idle_polled, busy_polled = (
        {
            k: v / LOOP_BOXES
            for k, v in out[loop].items()
            if k in ("cpu_fraction", "answers_per_s", "changed_per_s")
        }
        for loop in ("idle_loop", "busy_loop", "idle_loop_polled", "busy_loop_polled")
    )
    unheld_busy = min(BUSY_CHANGES_PER_S * interval, 1.0)  # share of a busy box's polls changed
    same_s, changed_s = out["poller_cpu_ms"] / 1e3, out["changed_cpu_ms"] / 1e3
    per_box = {
        "idle": idle["cpu_fraction"],
        "busy": busy["cpu_fraction"],
        "unheld": (1 - BUSY_SHARE) * same_s / interval
        + BUSY_SHARE * ((1 - unheld_busy) * same_s + unheld_busy * changed_s) / interval,
        "unconditional": out["unconditional_cpu_ms"] / 1e3 / interval,
        "polled": (1 - BUSY_SHARE) * idle_polled["cpu_fraction"]
        + BUSY_SHARE * busy_polled["cpu_fraction"],
        "polled_busy": busy_polled["cpu_fraction"],
    }
    mix = (1 - BUSY_SHARE) * per_box["idle"] + BUSY_SHARE * per_box["busy"]
    polls_per_box = (1 - BUSY_SHARE) * idle["answers_per_s"] + BUSY_SHARE * busy["answers_per_s"]
    out["busy_share"] = BUSY_SHARE
    out["changed_share"] = round(
        BUSY_SHARE * busy["changed_per_s"] / max(polls_per_box, 1e-9)
        + (1 - BUSY_SHARE) * idle["changed_per_s"] / max(polls_per_box, 1e-9),
        3,
    )
    out["pool"] = [
        {
            "boxes": n,
            "polls_per_s": round(n * polls_per_box),
            "core_fraction": round(mix * n, 3),
            **{f"core_fraction_{k}": round(v * n, 3) for k, v in per_box.items()},
        }
        for n in (256, 1000)
    ]
    return out


SPREAD_BOXES = 1000
"""The streams `snapshot_feed.py` serves the picker in `spread`, one box each."""


def _spread(pool: devpool.LocalPool, workdir: Path, token: str, busy_share: float) -> dict:
    """The picker following `SPREAD_BOXES` boxes' streams from `snapshot_feed.py` (a process of
    its own), `busy_share` of them busy, for `LOOP_S`: its CPU (`core_fraction`), and its frames
    a second and those installed."""
    port_file = workdir / f"feed-{busy_share}.port"
    feeder = Path(__file__).with_name("snapshot_feed.py")
    feed = pool.spawn(
        f"feed-{busy_share}",
        [sys.executable, str(feeder), str(port_file), str(busy_share)],
        workdir,
    )
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            if feed.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"snapshot_feed.py did not start: see {feed.log}")
            time.sleep(0.05)
        endpoint = f"127.0.0.1:{port_file.read_text()}"
        loop = asyncio.run(_loop_cpu(endpoint, token, stream=True, boxes=SPREAD_BOXES))
    finally:
        feed.proc.kill()
        feed.proc.wait()
    return {"busy_share": busy_share, "core_fraction": loop.pop("cpu_fraction"), **loop}


class _CountingPicker(BoxPicker):
    """The picker, counting the polls answered `304` (`box_same`) and in full (`box_seen`)."""

    def __init__(self) -> None:
        super().__init__(Router(RouterKnobs(), {}))
        self.same = self.seen = 0

    def box_same(self, name: str, age_s: float, now: float) -> bool:
        self.same += 1
        return super().box_same(name, age_s, now)

    def box_seen(self, name: str, endpoint: str, snap: BoxSnapshot, now: float) -> bool:
        self.seen += 1
        return super().box_seen(name, endpoint, snap, now)

    def changed(self, name: str) -> None:
        """Its next poll of `name` is answered in full and installed, as a changed box's is."""
        held = self._held[name]
        held.etag, held.basis = None, []

    def unconditional(self, name: str) -> None:
        """Its next poll of `name` is answered in full, as before polls were conditional."""
        self._held[name].etag = None


async def _loop_cpu(
    box: str, token: str, stream: bool, boxes: int = LOOP_BOXES, pid: int | None = None
) -> dict:
    """The poll loop as it runs, on `boxes` boxes (the one box under as many names) for
    `LOOP_S`, following each box's snapshot stream (`stream`, as the picker does) or polling it
    (as it did before, and does an older box): this process's CPU per second (nothing else runs
    in it), its answers (frames) per second and those in full; then, as a pick on that loop
    would see it, how late a 10 ms timer fires with the loop polling (`lag_*`) and with it not
    yet polling (`lag_unpolled_*`). `pid`: the box daemon's process, whose CPU over the same
    seconds is `box_cpu_fraction` (its own telemetry reads, and a busy box's calls, included).
    The picker runs with the collector `talariad epp` runs (`gc_tuning`): CPython's default
    passes walk every box's install, and more of them as the bench's process grows."""
    picker = _CountingPicker()
    picker.collector = PacedCollector.started()  # as `talariad epp`'s: the boxes come after it
    poller = BoxPoller(picker, token, stream=stream)  # a connection per box name
    try:
        unpolled = await _loop_lag(2.0)
        poller.set_boxes({f"box{i}": box for i in range(boxes)})
        await asyncio.sleep(3.0)  # the first, whole snapshots
        answers, changed = picker.same + picker.seen, picker.seen
        box_before = 0.0 if pid is None else _cpu_s(pid)
        cpu, wall = time.process_time(), time.monotonic()
        await asyncio.sleep(LOOP_S)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        box_cpu = None if pid is None else (_cpu_s(pid) - box_before) / wall
        answers, changed = picker.same + picker.seen - answers, picker.seen - changed
        polled = await _loop_lag(3.0)
    finally:
        await poller.aclose()
        picker.collector.stop()
    return {
        "boxes": boxes,
        "stream": stream,
        "cpu_fraction": round(cpu / wall, 4),
        "cpu_ms_per_answer": round(cpu / max(answers, 1) * 1e3, 4),
        **({} if box_cpu is None else {"box_cpu_fraction": round(box_cpu, 4)}),
        "answers_per_s": round(answers / wall, 1),
        "changed_per_s": round(changed / wall, 1),
        "lag_p50_ms": round(pct(polled, 0.5) * 1e3, 3),
        "lag_p99_ms": round(pct(polled, 0.99) * 1e3, 3),
        "lag_unpolled_p50_ms": round(pct(unpolled, 0.5) * 1e3, 3),
        "lag_unpolled_p99_ms": round(pct(unpolled, 0.99) * 1e3, 3),
    }


async def _loop_lag(seconds: float) -> list[float]:
    """How late each of a run of 10 ms timers fired on this loop, for `seconds`."""
    lags, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.perf_counter()
        await asyncio.sleep(0.01)
        lags.append(time.perf_counter() - started - 0.01)
    return lags


async def _poll_cost(box: str, box_pid: int, token: str, polls: int) -> dict:
    picker = _CountingPicker()
    poller = BoxPoller(picker, token, hold_s=0.0)
    url, headers = f"http://{box}{SNAPSHOT_PATH}", {"authorization": f"Bearer {token}"}
    async with httpx.AsyncClient() as client:

        async def with_httpx() -> None:
            (await client.get(url, headers=headers)).raise_for_status()

        async def polled(before=None) -> None:
            if before is not None:
                before("box0")
            assert await poller.poll("box0", box)

        try:
            await _until_quiet(poller, picker, box)
            arms = {
                "poller": polled,
                "changed": lambda: polled(picker.changed),
                "unconditional": lambda: polled(picker.unconditional),
                "httpx_get": with_httpx,
            }
            cpu = {name: 0.0 for name in arms}
            same_before = picker.same
            for i in range(polls + 20):  # the first 20 warm up
                for name, one in arms.items():
                    started = time.process_time()
                    await one()
                    if i >= 20:
                        cpu[name] += time.process_time() - started
            # of the "poller" arm's polls, those answered 304 (the box stayed idle)
            answered_304 = picker.same - same_before
            box_cpu = await _box_cpu(poller, picker, box, box_pid, polls)
        finally:
            await poller.aclose()
    out = {f"{name}_cpu_ms": round(total / polls * 1e3, 3) for name, total in cpu.items()}
    out["polls"] = polls
    out["poller_answered_304"] = answered_304
    out.update(box_cpu)
    return out


async def _until_quiet(poller: BoxPoller, picker: _CountingPicker, box: str) -> None:
    """Poll until the idle box answers `304` (its instances settled after the start)."""
    deadline = time.monotonic() + 60
    while picker.same == 0:
        if time.monotonic() > deadline:
            raise RuntimeError("the idle box never answered a conditional poll with 304")
        assert await poller.poll("box0", box)
        await asyncio.sleep(0.1)


async def _box_cpu(
    poller: BoxPoller, picker: _CountingPicker, box: str, pid: int, polls: int
) -> dict:
    """The box daemon's CPU per poll answered `304` and in full: blocks of polls, each less the
    daemon's idle CPU over as long (its own telemetry reads), measured before and after."""

    async def idle(seconds: float) -> float:
        cpu = _cpu_s(pid)
        await asyncio.sleep(seconds)
        return (_cpu_s(pid) - cpu) / seconds

    async def block(before) -> tuple[float, float]:
        cpu, wall = _cpu_s(pid), time.monotonic()
        for _ in range(20):
            if before is not None:
                before("box0")
            assert await poller.poll("box0", box)
        return _cpu_s(pid) - cpu, time.monotonic() - wall

    idle_rate = await idle(2.0)
    totals = {"box_304": [0.0, 0.0], "box_full": [0.0, 0.0]}
    for _ in range(max(polls // 20, 1)):
        for name, before in (("box_304", None), ("box_full", picker.changed)):
            cpu, wall = await block(before)
            totals[name][0] += cpu
            totals[name][1] += wall
    idle_rate = (idle_rate + await idle(2.0)) / 2
    n = max(polls // 20, 1) * 20
    out = {
        f"{name}_cpu_ms": round(max(cpu - idle_rate * wall, 0.0) / n * 1e3, 3)
        for name, (cpu, wall) in totals.items()
    }
    out["box_idle_cpu_fraction"] = round(idle_rate, 4)
    return out


# --- decision time: the picker over synthetic boxes ---------------------------------------------


class SyntheticBox:
    """One box of one hot sim instance, its round `round_load_s` long, that reports the
    prefixes of the calls the picker sent it, as a box does: by deltas (`?since=`)."""

    def __init__(self, index: int, round_load_s: float) -> None:
        self.name, self.index = f"box{index}", index
        self.address = f"10.0.{index // 250}.{index % 250 + 1}:8000"
        self.token: int | None = None
        self.changed: list[KVLocation] = []
        t = Telemetry(
            instance=f"i{index}",
            version=1,
            pool="hot",
            models=[MODEL],
            active_model=MODEL,
            loaded_models=[MODEL],
            opened_models=[MODEL],
            round_load_s=round_load_s,
            hbm_free_bytes=None,
        )
        box = Router(RouterKnobs(), {})
        box.observe(router_snapshot(t, t.models, 0.0, True), 0.0)
        self.target = box_target(box, 0.0, {t.instance})  # as the box publishes it, less sessions

    def served(self, session: str, kv_len: int) -> None:
        self.changed.append(KVLocation(session, MODEL, KVState.DEVICE, kv_len))

    def poll(self, picker: BoxPicker, now: float) -> None:
        """What the poller does with the box's reply to `?since=<its last token>`."""
        since, self.token = self.token, (self.token or 0) + 1
        # the box's daemon polls its instances every 250 ms: a new basis as often
        basis = [(f"i{self.index}", 1 + int(now / 0.25))]
        update = {"sessions": self.changed, "sessions_base": since, "basis": basis}
        target = self.target.model_copy(update=update)
        self.changed = []
        snap = BoxSnapshot(
            version=self.token,
            sessions_epoch=self.token,
            target=target,
            models=[BoxModel(name=MODEL)],
        )
        assert picker.box_seen(self.name, self.address, snap, now)


SYSTEM = "You are a coding agent working in a repository. " * 20


def _request(call_id: str, sid: str, messages: list[dict]) -> EPPRequest:
    body = {"model": MODEL, "max_tokens": 64, "messages": messages}
    heads = {"x-session-id": sid}
    return EPPRequest(call_id, "POST", "/v1/chat/completions", heads, json.dumps(body).encode())


class PickerPool:
    """The picker over synthetic boxes, polled every 100 ms of its clock (off the timed path),
    and the conversations of the sessions it has placed."""

    def __init__(self, boxes: int, rng: random.Random) -> None:
        # the router as the picker runs it (a session's home, the candidate set)
        self.picker = BoxPicker(Router(RouterKnobs(**PICKER_KNOBS), {}))
        # as `talariad epp`'s collector: the live sessions come after it
        self.picker.collector = PacedCollector.started()
        self.boxes = [SyntheticBox(b, rng.uniform(0.1, 1.0)) for b in range(boxes)]
        self.by_address = {box.address: box for box in self.boxes}
        self.polled = -1.0
        self.history: dict[str, list[dict]] = {}
        self.tau_s = self.picker.router.knobs.tau_s
        self.refused = 0  # picks that were not placements (a bench measuring 503s is wrong)
        self.poll_times: list[float] = []  # seconds each box's install took (`box_seen`)
        # and of this thread's CPU (the machine's other processes' time slices left out)
        self.poll_cpu: list[float] = []
        self.pick_cpu = 0.0  # the last pick's
        self.interleaved = False
        self.due, self.cursor = 0.0, 0  # installs owed, and the next box (`interleaved`)
        self.previous = 0  # untimed calls made before timed ones (`interleaved`)
        # each call first offered at its request headers (`BoxPicker.lease_return`), as the
        # gateway offers it (`GatewaySpec.lease_at_headers`), its body picked if declined
        self.at_headers = False
        self.last_at_headers = False  # the last call was placed at its headers

    def turn(self, call_id: str, sid: str, messages: list[dict], now: float) -> float:
        """One call at `now` after the poller's work due by then (every box's install when
        its poll is due); the seconds `pick` took. `interleaved`: as a busy picker sees it,
        right after another call (an untimed new session's) and the box installs a picker making
        `INTERLEAVED_CALLS_PER_S` sees between two calls (every box changing every poll)."""
        if now - self.polled >= 0.1:
            self.polled = now
            for box in self.boxes:
                self._install(box, now)
        if self.interleaved:
            self.previous += 1
            sid_before = f"before{self.previous}"
            self._pick(sid_before, sid_before, _opening(sid_before), now)
            self.due += len(self.boxes) / (0.1 * INTERLEAVED_CALLS_PER_S)
            while self.due >= 1.0:
                self.due -= 1.0
                self._install(self.boxes[self.cursor % len(self.boxes)], now)
                self.cursor += 1
        return self._pick(call_id, sid, messages, now)

    def _pick(self, call_id: str, sid: str, messages: list[dict], now: float) -> float:
        req = _request(call_id, sid, messages)
        heads = req.at_headers() if self.at_headers else None
        started, cpu = time.perf_counter(), time.thread_time()
        pick = None if heads is None else self.picker.lease_return(heads, now)
        self.last_at_headers = pick is not None
        if pick is None:
            pick = self.picker.pick(req, now)
        took = time.perf_counter() - started
        self.pick_cpu = time.thread_time() - cpu
        if not isinstance(pick, Pick):
            self.refused += 1
            return took
        # answered a millisecond later (after the snapshot the pick read: a completion at the
        # snapshot's own instant does not outrank it): the box it went to holds its prompt, by
        # the branch name the picker and the box both give it
        if self.last_at_headers:  # its end reported by Envoy's access log
            self.picker.logged(call_id, pick.endpoint, 200, True, now + 1e-3)
        else:
            self.picker.served(call_id, pick.endpoint, 200, now)
            self.picker.finished(call_id, True, now + 1e-3)
        branch = self.picker.explain(call_id).session_id or sid  # type: ignore[union-attr]
        self.by_address[pick.endpoint].served(branch, len(req.body) // 4)
        return took

    def _install(self, box: SyntheticBox, now: float) -> None:
        started, cpu = time.perf_counter(), time.thread_time()
        box.poll(self.picker, now)
        self.poll_times.append(time.perf_counter() - started)
        self.poll_cpu.append(time.thread_time() - cpu)

    def warm(self, sessions: int, now: float) -> tuple[float, dict]:
        """Every session's first call within one second of the picker's clock (a burst: the
        picker's live state), then one new session's call every 0.25 s while the burst's
        leases and the router's windows expire, and again past `session_idle_s`, when its
        session rows go; the clock after them, and the burst's slowest pick and box install
        (`box_seen`) over its expiry, the poll's work being the picker's too."""
        for i in range(sessions):
            sid = f"s{i}"
            self.history[sid] = _opening(f"{i}")
            self.turn(f"w{i}", sid, self.history[sid], now)
            self.history[sid].append({"role": "assistant", "content": f"Looking at issue {i}."})
            now += 1.0 / sessions
        knobs = self.picker.router.knobs
        self.poll_times.clear()
        self.poll_cpu.clear()
        picks: list[float] = []
        picks_cpu: list[float] = []
        # the collector's longest pass per generation meanwhile, in seconds and in CPU seconds
        passes: dict[int, float] = {}
        passes_cpu: dict[int, float] = {}
        started: list[float] = [0.0, 0.0]

        def collected(phase: str, info: dict) -> None:
            if phase == "start":
                started[:] = time.perf_counter(), time.thread_time()
            else:
                took, gen = time.perf_counter() - started[0], info["generation"]
                passes[gen] = max(passes.get(gen, 0.0), took)
                cpu = time.thread_time() - started[1]
                passes_cpu[gen] = max(passes_cpu.get(gen, 0.0), cpu)

        gc.callbacks.append(collected)
        horizon = max(knobs.control_window_s, knobs.retire_window_s, 2 * self.tau_s) + 2.0
        for at in (now, now + knobs.session_idle_s):
            for j in range(int(horizon / 0.25)):
                picks.append(self.turn(f"x{at}-{j}", f"x{at}-{j}", _opening(f"x{j}"), at))
                picks_cpu.append(self.pick_cpu)
                at += 0.25
        gc.callbacks.remove(collected)
        burst = {
            "sessions": sessions,
            "picks": len(picks),
            "max_pick_us": round(max(picks) * 1e6, 1),
            "max_box_install_us": round(max(self.poll_times) * 1e6, 1),
            "max_gc_pass_us": {str(g): round(t * 1e6, 1) for g, t in sorted(passes.items())},
            # the same maxima in this thread's CPU time: what the picker spent, its process not
            # scheduled left out (a shared machine's maxima are its other processes' slices)
            "max_pick_cpu_us": round(max(picks_cpu) * 1e6, 1),
            "max_box_install_cpu_us": round(max(self.poll_cpu) * 1e6, 1),
            "max_gc_pass_cpu_us": {
                str(g): round(t * 1e6, 1) for g, t in sorted(passes_cpu.items())
            },
            # the collector's freezes (gc_tuning.PacedCollector), warm-up included
            "freezes": self.picker.collector.freezes,  # type: ignore[union-attr]
        }
        return at + 2 * self.tau_s, burst

    def measure(self, kind: str, i: int, now: float, rng: random.Random, tag: str = "") -> float:
        """One measured call of `kind` at `now` (no lease is live then); `tag` names its calls
        apart from another pass's."""
        if kind == "new":
            return self.turn(f"{tag}c{i}", f"{tag}n{i}", _opening(f"{tag}n{i}"), now)
        sid = f"s{rng.randrange(len(self.history))}"
        messages = self.history[sid] + [{"role": "user", "content": f"turn {tag}{i}"}]
        took = self.turn(f"{tag}c{i}", sid, messages, now)
        if kind == "cost":
            return took
        # its next call comes back within τ: that one is timed as the lease kind
        again = messages + [{"role": "assistant", "content": "done"}]
        last = {"role": "user", "content": "next"}
        return self.turn(f"{tag}l{i}", sid, again + [last], now + 0.3)


def _opening(issue: str) -> list[dict]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Fix issue {issue}."},
    ]


AGENT_TURNS = {"agent_body": 100, "agent_body_400k": 570}  # ~70 KB and ~400 KB as JSON


INTERLEAVED_CALLS_PER_S = 2500
"""The call rate the `interleaved` decisions are timed at: about what one picker process
sustains at 1,000 boxes (`bench/epp_cores.py`), so 4 box installs between two calls there, one
at 256 boxes (every box changing every 100 ms poll)."""


def decision_time(boxes: int, live_sessions: int, decisions: int, seed: int = 0) -> dict:
    """p50/p99 of `BoxPicker.pick` with `live_sessions` sessions the picker placed itself (in a
    burst, `PickerPool.warm`) on `boxes` boxes of varied round load (uniform 0.1-1 s, seeded), by
    kind of call: a return within τ of its previous answer (the lease), a return after it (cost
    placement, the prefix where the previous call left it) and a new session's first call; their
    bodies are 1-2 KB. Beside them agents' calls: `agent_body` a new session whose first call
    carries a conversation a hundred tool rounds in (~70 KB, 202 messages; each its own, sharing
    only the system prompt), `agent_body_400k` the same at ~400 KB (1,142 messages), and each
    as a return of a session whose conversation grows by a tool round a call
    (`..._lease`, `..._cost`, as above). Each timed pick follows every box's install (a poll
    of all of them falls due between two timed calls: the pick's memory is cold); `interleaved`
    times the same kinds again with the installs spread between the calls as a picker at
    `INTERLEAVED_CALLS_PER_S` sees them. The kinds above pick on the body, as a call whose headers
    name no session is placed; `at_headers` times the lease returns again (in both passes) as
    the gateway places them when their headers do name it: `BoxPicker.lease_return` at the
    request headers, the body picked only where it declines (`placed_at_headers`: how many it
    placed). `parse_p50_us`: parsing a new session's body alone, the least a whole read costs."""
    rng = random.Random(seed)
    pool = PickerPool(boxes, rng)
    now, burst = pool.warm(live_sessions, 1.0)
    times, _, now = _decisions(pool, decisions, now, rng, "")
    out: dict = {"boxes": boxes, "live_sessions": live_sessions}
    out.update(_percentiles(times))
    pool.interleaved = True
    times, _, now = _decisions(pool, decisions, now, rng, "i")
    out["interleaved"] = {"calls_per_s": INTERLEAVED_CALLS_PER_S, **_percentiles(times)}
    out["refused"] = pool.refused  # of the passes above (as before the passes at headers)
    out["continued_reads"] = pool.picker.reader.continued
    pool.at_headers = True
    for interleaved, where in ((False, out), (True, out["interleaved"])):
        pool.interleaved = interleaved
        times, placed, now = _decisions(pool, decisions, now, rng, f"h{interleaved}", ("lease",))
        where["at_headers"] = _percentiles(times)  # the header check's time included
        for kind, n in placed.items():
            where["at_headers"][kind]["placed_at_headers"] = n
    pool.interleaved = pool.at_headers = False
    out["refused_at_headers"] = pool.refused - out["refused"]  # of the passes at headers
    for name, turns in AGENT_TURNS.items():
        body = _request("", "", _agent_conversation(turns, "size")).body
        for kind in ("", "_lease", "_cost"):
            out[name + kind]["body_bytes"] = len(body)
        out[name]["messages"] = 2 * turns + 2
        out[name]["parse_p50_us"] = _parse_time(body)
    out["burst"] = burst
    pool.picker.collector.stop()  # type: ignore[union-attr]  # the next pool size starts its own
    return out


KINDS = ("lease", "cost", "new")


def _decisions(
    pool: PickerPool,
    decisions: int,
    now: float,
    rng: random.Random,
    tag: str,
    kinds: tuple[str, ...] = KINDS,
) -> tuple[dict[str, list[float]], Counter, float]:
    """Each kind's pick times (`decision_time`) for `kinds` (a lease return's earlier call is
    untimed), how many of each kind's calls were placed at their headers, and the clock after
    them."""
    times: dict[str, list[float]] = {k: [] for k in kinds}
    at_headers: Counter = Counter()
    for i in range(decisions * len(kinds) // len(KINDS)):
        kind = kinds[i % len(kinds)]
        times[kind].append(pool.measure(kind, i, now, rng, tag))
        at_headers[kind] += pool.last_at_headers
        now += 2 * pool.tau_s  # the next measured call sees no live lease
    for name, turns in AGENT_TURNS.items():
        times.update((name + suffix, []) for k, suffix in _SUFFIX.items() if k in kinds)
        agents = [_agent_conversation(turns, f"{name}-{tag}{a}") for a in range(8)]
        for a, conv in enumerate(agents):  # each agent's first call and first return
            pool.turn(f"{name}-{tag}w{a}", f"{name}-{tag}{a}", conv, now)
            _tool_round(conv, 0)
            pool.turn(f"{name}-{tag}r{a}", f"{name}-{tag}{a}", conv, now + 0.3)
            now += 2 * pool.tau_s
        for i in range(max(decisions // 15, 3)):
            if "new" in kinds:
                conv = _agent_conversation(turns, f"{name}-{tag}new{i}")
                sid = f"{name}-{tag}n{i}"
                times[name].append(pool.turn(sid, sid, conv, now))
                at_headers[name] += pool.last_at_headers
            a = i % len(agents)
            sid = f"{name}-{tag}{a}"
            _tool_round(agents[a], i + 1)
            took = pool.turn(f"{name}-{tag}c{i}", sid, agents[a], now)
            if "cost" in kinds:
                times[name + "_cost"].append(took)
                at_headers[name + "_cost"] += pool.last_at_headers
            _tool_round(agents[a], i + 1)
            took = pool.turn(f"{name}-{tag}l{i}", sid, agents[a], now + 0.3)
            if "lease" in kinds:
                times[name + "_lease"].append(took)
                at_headers[name + "_lease"] += pool.last_at_headers
            now += 2 * pool.tau_s
    return times, at_headers, now


_SUFFIX = {"new": "", "lease": "_lease", "cost": "_cost"}  # an agent body's kinds


def _parse_time(body: bytes, times: int = 21) -> float:
    """p50 µs of parsing `body` as JSON alone (`pydantic_core.from_json`, the parser the
    picker reads a whole body with): what reading it whole costs at least."""
    took = []
    for _ in range(times):
        started = time.perf_counter()
        from_json(body)
        took.append(time.perf_counter() - started)
    return round(statistics.median(took) * 1e6, 1)


def past_memory(sessions: int, rounds: int = 3) -> dict:
    """`sessions` agents' 70 KB conversations through one picker (16 boxes, in-process, its
    default `conversation_bytes`), every session returning 0.5 s after its previous call while
    the others call, `rounds` calls each: how the returns are placed (by the router's decision
    kind, at headers or on the body) and how many moved box. Past the picker's memory a session's
    branch text is evicted by the others' before it returns."""
    pool = PickerPool(16, random.Random(0))
    pool.at_headers = True
    convs = [_agent_conversation(100, f"m{i}") for i in range(sessions)]
    home: dict[int, str | None] = {}
    kinds: Counter = Counter()
    at_headers = moved = 0
    for r in range(rounds):
        for i, conv in enumerate(convs):
            pool.turn(f"m{r}-{i}", f"m-{i}", conv, 1.0 + r * 0.5 + i * 0.5 / sessions)
            decision = pool.picker.explain(f"m{r}-{i}")
            box = decision.instance  # type: ignore[union-attr]
            if r:
                kinds[decision.kind.value] += 1  # type: ignore[union-attr]
                at_headers += pool.last_at_headers
                moved += box != home[i]
            home[i] = box
            _tool_round(conv, r)
    pool.picker.collector.stop()  # type: ignore[union-attr]
    return {
        "sessions": sessions,
        "returns": sessions * (rounds - 1),
        "kinds": dict(kinds),
        "placed_at_headers": at_headers,
        "moved_box": moved,
        "branch_text_bytes": pool.picker.branches.bytes,
        "branch_text_bound": pool.picker.branches.max_bytes,
    }


def _percentiles(times: dict[str, list[float]]) -> dict:
    out = {}
    for kind, seconds in times.items():
        us = [t * 1e6 for t in seconds]
        out[kind] = {
            "decisions": len(us),
            "p50_us": round(statistics.median(us), 1),
            "p99_us": round(pct(us, 0.99), 1),
        }
    return out


def _agent_conversation(turns: int = 100, issue: str = "agent") -> list[dict]:
    """A coding agent's conversation `turns` tool rounds in (~70 KB as JSON at 100, 202
    messages)."""
    out = _opening(issue)
    for i in range(turns):
        _tool_round(out, i)
    return out


def _tool_round(conv: list[dict], i: int) -> None:
    """One more tool round: the agent's step and the tool's output (~700 bytes)."""
    conv.append({"role": "assistant", "content": "I will run the tests now. " * 8})
    conv.append({"role": "user", "content": f"tool output line {i}\n" * 20})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--calls", type=int, default=300, help="measured calls per latency arm")
    ap.add_argument(
        "--agent-calls", type=int, default=100, help="70 KB calls per kind for the picker's CPU"
    )
    ap.add_argument(
        "--throughput-s", type=float, default=10.0, help="seconds of 70 KB calls for calls/s"
    )
    ap.add_argument("--decisions", type=int, default=2000, help="measured picks per pool size")
    ap.add_argument("--sessions", type=int, default=100_000, help="live sessions in the pool")
    ap.add_argument("--polls", type=int, default=300, help="measured box polls")
    ap.add_argument(
        "--part",
        choices=["latency", "poll", "decision", "cores", "memory", "all"],
        default="all",
    )
    ap.add_argument(
        "--boxes",
        type=int,
        action="append",
        help="a pool size for --part decision (repeatable; default 16, 256 and 1000)",
    )
    ap.add_argument(
        "--cores-sessions", type=int, default=20_000, help="live sessions for the cores part"
    )
    ap.add_argument(
        "--memory-sessions",
        type=int,
        default=6000,
        help="70 KB sessions for the memory part (6,000: past the default 256 MB)",
    )
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    out: dict = {"load_start": [round(x, 2) for x in os.getloadavg()]}
    try:
        if args.part in ("latency", "all"):
            out["latency"] = latency(args.calls, args.agent_calls, args.throughput_s)
        if args.part in ("poll", "all"):
            out["poll"] = poll_cost(args.polls)
        if args.part in ("decision", "all"):
            out["decision"] = []
            for n in args.boxes or (16, 256, 1000):
                out["decision"].append(decision_time(n, args.sessions, args.decisions))
                print(json.dumps(out["decision"][-1]), file=sys.stderr, flush=True)  # progress
        if args.part in ("memory", "all"):
            out["memory"] = past_memory(args.memory_sessions)
        if args.part in ("cores", "all"):
            import epp_cores  # its processes import it (and this module) by name

            out["cores"] = epp_cores.cores(256, args.cores_sessions, 10.0)
    except (devpool.PoolError, envoy.EnvoyError, RuntimeError) as err:
        print(f"epp_bench: {err}", file=sys.stderr)
        return 1
    out["load_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
