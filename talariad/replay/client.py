"""Real-mode replay: a closed-loop client that drives a running `talariad` over HTTP with a scaled trace.

Each session sends its calls in order; call k is released one (capped) gap after the response of
call k-1, and its TTFT runs from that intended enqueue time to the first streamed content chunk
(schedule-aware TTFT, App. A), so time spent waiting on 429s counts. Every call carries the
session's `x-session-id`. The run fills a `RunResult`, so `talariad.replay.report` prints the
simulator's table; switches and rounds are not visible over the public API and stay empty.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from dataclasses import dataclass, field

import httpx

from talariad.replay.metrics import CallRecord, RunResult, SessionRecord
from talariad.replay.scale import (
    GENERATORS,
    Conversation,
    ScaledCall,
    ScaledSession,
    count_tokens,
    filler,
    fit_context,
    load_trace,
    map_models,
    parse_model_map,
    scale_trace,
)


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    endpoint: str  # http://HOST:PORT or http://HOST:PORT/v1
    config: str = "real"  # the report row's label
    timeout_s: float = 600.0  # the whole run; sessions still running then are cancelled
    request_timeout_s: float = 120.0  # one HTTP request (connect, or silence between chunks)
    max_retries: int = 5  # per call, on 429 / 503
    retry_cap_s: float = 5.0  # longest Retry-After honoured
    start_interval_s: float = 0.0  # session i starts at i x this
    session_tag: str | None = None  # prefix of every x-session-id; None: a fresh one per run, so a
    # replay never finds the KV an earlier replay of the same trace left on the server
    contexts: dict[str, int | None] | None = (
        None  # served model -> context tokens: calls are fitted
    )
    tokens_per_unit: float = 1.0  # server tokens per scaling unit before a session's first answer


@dataclass(frozen=True, slots=True)
class CallUsage:
    """What the server said about one call (`usage` and its `talaria` extension)."""

    session_id: str
    call_idx: int
    sent_session_id: str  # the x-session-id header
    server_session_id: str  # the session the server filed the call under
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    kv_source: str
    instance: str
    route: str


@dataclass(frozen=True, slots=True)
class CallError:
    session_id: str
    call_idx: int
    status: int | None  # HTTP status; None for a transport error or the run's timeout
    message: str


@dataclass
class ReplayResult:
    run: RunResult
    usage: list[CallUsage] = field(default_factory=list)
    errors: list[CallError] = field(default_factory=list)
    retries: int = 0  # 429 / 503 answers that were retried
    fitted: int = 0  # calls whose history or max_tokens was cut to fit the model's context


@dataclass(slots=True)
class _Reply:
    text: str
    first_token_s: float | None
    done_s: float
    usage: dict
    instance: str
    route: str
    call_id: str = ""


class _Retry(Exception):
    def __init__(self, status: int, after_s: float, message: str) -> None:
        super().__init__(message)
        self.status, self.after_s = status, after_s


class _Failed(Exception):
    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(message)
        self.status = status


def base_url(endpoint: str) -> str:
    url = endpoint.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--endpoint must be an http(s) URL, got {endpoint!r}")
    return url.removesuffix("/v1")


async def served_models(endpoint: str, timeout_s: float = 10.0) -> list[str]:
    """The model ids `GET /v1/models` lists, in order."""
    async with httpx.AsyncClient(base_url=base_url(endpoint), timeout=timeout_s) as http:
        try:
            r = await http.get("/v1/models")
            r.raise_for_status()
        except httpx.HTTPError as e:
            raise ValueError(f"cannot list models at {endpoint}: {e}") from None
    return [m["id"] for m in r.json()["data"]]


class _Run:
    """Shared state of one replay: the HTTP client, the run clock and what was recorded."""

    def __init__(self, http: httpx.AsyncClient, opts: ReplayOptions) -> None:
        self.http, self.opts = http, opts
        self.tag = opts.session_tag if opts.session_tag is not None else f"r{uuid.uuid4().hex[:8]}:"
        self.t0 = time.monotonic()
        self.result = ReplayResult(RunResult(opts.config))

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def sleep_until(self, t: float) -> None:
        await asyncio.sleep(max(0.0, t - self.now()))


async def replay(
    sessions: list[ScaledSession],
    opts: ReplayOptions,
    transport: httpx.AsyncBaseTransport | None = None,
) -> ReplayResult:
    """Run every session closed-loop against `opts.endpoint`; never longer than `opts.timeout_s`."""
    limits = httpx.Limits(
        max_connections=len(sessions) + 4, max_keepalive_connections=len(sessions) + 4
    )
    timeout = httpx.Timeout(opts.request_timeout_s)
    async with httpx.AsyncClient(
        base_url=base_url(opts.endpoint), timeout=timeout, limits=limits, transport=transport
    ) as http:
        run = _Run(http, opts)
        tasks = [
            asyncio.create_task(_session(run, s, i * opts.start_interval_s))
            for i, s in enumerate(sessions)
        ]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=opts.timeout_s)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        run.result.run.wall_clock_s = run.now()
    run.result.run.calls.sort(key=lambda c: (c.session_id, c.call_idx))
    run.result.run.sessions.sort(key=lambda s: s.session_id)
    return run.result


async def _session(run: _Run, calls: ScaledSession, start_s: float) -> None:
    conv, intended, prev = Conversation(calls[0].session_id), start_s, None
    current, ratio = calls[0], run.opts.tokens_per_unit
    try:
        for current in calls:
            if prev is not None:
                intended = prev.done_s + current.gap_s
            await run.sleep_until(intended)
            messages = conv.messages(current)
            context = (run.opts.contexts or {}).get(current.model)
            if context:
                current, cut = fit_context(conv, current, ratio, context)
                run.result.fitted += cut
                messages = [dict(m) for m in conv.history]
            reply = await _call(run, current, messages)
            if reply.usage.get("prompt_tokens") and conv.tokens():  # this conversation's own ratio
                ratio = max(ratio, reply.usage["prompt_tokens"] / conv.tokens())
            conv.answered(reply.text)
            _record(run, current, intended, reply, prev)
            prev = reply
        run.result.run.sessions.append(
            SessionRecord(current.session_id, current.model, start_s, prev.done_s)
        )
    except _Failed as e:
        run.result.errors.append(CallError(current.session_id, current.call_idx, e.status, str(e)))
    except asyncio.CancelledError:
        run.result.errors.append(
            CallError(
                current.session_id,
                current.call_idx,
                None,
                f"run timeout ({run.opts.timeout_s:g} s) before the session finished",
            )
        )
        raise


def _record(
    run: _Run, call: ScaledCall, intended: float, reply: _Reply, prev: _Reply | None
) -> None:
    u, ext = reply.usage, reply.usage.get("talaria") or {}
    reply.instance = ext.get("instance") or reply.instance  # the usage extension wins over headers
    reply.route = ext.get("route") or reply.route
    kv_source = ext.get("kv_source", "none")
    run.result.run.calls.append(
        CallRecord(
            call.session_id,
            call.call_idx,
            call.model,
            reply.instance,
            intended,
            reply.first_token_s,
            reply.done_s,
            same_instance=None if prev is None else reply.instance == prev.instance,
            opened_model=reply.route == "replica_open",
            kv_source=kv_source,
            call_id=reply.call_id,
        )
    )
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    run.result.usage.append(
        CallUsage(
            call.session_id,
            call.call_idx,
            run.tag + call.session_id,
            ext.get("session_id", ""),
            u.get("prompt_tokens", 0),
            cached,
            u.get("completion_tokens", 0),
            kv_source,
            reply.instance,
            reply.route,
        )
    )


def chat_body(call: ScaledCall, messages: list[dict]) -> dict:
    # ignore_eos: the call produces its recorded output length, whatever the model's end of turn
    return {
        "model": call.model,
        "messages": messages,
        "max_tokens": call.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def _call(run: _Run, call: ScaledCall, messages: list[dict]) -> _Reply:
    """One call with bounded retries on 429 / 503 (waiting Retry-After, capped)."""
    body, headers = chat_body(call, messages), {"x-session-id": run.tag + call.session_id}
    tries = 0
    while True:
        tries += 1
        try:
            return await _stream(run, body, headers)
        except _Retry as r:
            if tries > run.opts.max_retries:
                raise _Failed(r.status, f"gave up after {tries} tries: {r}") from None
            run.result.retries += 1
            await asyncio.sleep(min(r.after_s, run.opts.retry_cap_s))
        except httpx.HTTPError as e:
            raise _Failed(None, f"{type(e).__name__}: {e}") from None


async def _stream(run: _Run, body: dict, headers: dict) -> _Reply:
    async with run.http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as resp:
        if resp.status_code != 200:
            await resp.aread()
            _raise_for(resp)
        reply = _Reply(
            "",
            None,
            0.0,
            {},
            resp.headers.get("x-talaria-instance", ""),
            resp.headers.get("x-talaria-route", ""),
        )
        parts: list[str] = []
        async for line in resp.aiter_lines():
            if _on_line(run, line, reply, parts):
                break
    reply.text, reply.done_s = "".join(parts), run.now()
    if reply.first_token_s is None:
        reply.first_token_s = (
            reply.done_s
        )  # an empty answer: the response itself is the first token
    return reply


def _on_line(run: _Run, line: str, reply: _Reply, parts: list[str]) -> bool:
    """Consume one SSE line; True at the end of the stream."""
    if not line.startswith("data:"):
        return False
    data = line[5:].strip()
    if data == "[DONE]":
        return True
    try:
        obj = json.loads(data)
    except ValueError:
        raise _Failed(200, f"malformed stream line: {data[:80]!r}") from None
    if "error" in obj:
        raise _Failed(200, f"error in stream: {obj['error'].get('message', obj['error'])}")
    for choice in obj.get("choices") or []:
        text = (choice.get("delta") or {}).get("content")
        if text:
            if not parts:
                reply.first_token_s = run.now()
            parts.append(text)
    if obj.get("usage"):
        reply.usage = obj["usage"]
    reply.call_id = reply.call_id or obj.get("id", "")
    return False


def _raise_for(resp: httpx.Response) -> None:
    try:
        message = resp.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = resp.text[:200]
    if resp.status_code in (429, 503):
        raise _Retry(resp.status_code, _retry_after(resp), f"HTTP {resp.status_code}: {message}")
    raise _Failed(resp.status_code, f"HTTP {resp.status_code}: {message}")


def _retry_after(resp: httpx.Response) -> float:
    try:
        return max(0.0, float(resp.headers.get("retry-after", "1")))
    except ValueError:
        return 1.0


# --- `python -m talariad.replay run` ------------------------------------------------------------


def add_run_parser(sub) -> None:
    r = sub.add_parser(
        "run", help="replay a trace, scaled to small models, against a running talariad"
    )
    r.add_argument(
        "trace",
        metavar="TRACE_OR_GENERATOR",
        help=f"trace file (.jsonl[.gz]) or one of {GENERATORS}",
    )
    r.add_argument("--endpoint", required=True, help="http://HOST:PORT/v1 of a running talariad")
    r.add_argument(
        "--scale", type=float, default=50.0, help="divide prompt sizes by this (default 50)"
    )
    r.add_argument(
        "--output-scale", type=float, default=1.0, help="divide output lengths by this (default 1)"
    )
    r.add_argument("--sessions", type=int, help="replay only the first N sessions")
    r.add_argument("--max-calls", type=int, help="replay only the first N calls of each session")
    r.add_argument("--seed", type=int, default=0, help="generator seed")
    r.add_argument(
        "--model-map", nargs="*", metavar="TRACE=SERVED", help="else round-robin over /v1/models"
    )
    r.add_argument(
        "--gap-cap", type=float, default=10.0, help="cap on each gap, seconds (App. A: 10)"
    )
    r.add_argument(
        "--start-interval", type=float, default=0.0, help="seconds between session starts"
    )
    r.add_argument("--timeout", type=float, default=600.0, help="bound on the whole run, seconds")
    r.add_argument("--label", default="real", help="the report row's name")
    r.add_argument("--json", metavar="FILE", help="also write the numbers as JSON")
    r.add_argument(
        "--admin-socket",
        metavar="PATH",
        help="talariad's admin socket, for rounds, switches and HBM (default: talaria-ctl's)",
    )


async def served_contexts(endpoint: str, timeout_s: float = 10.0) -> dict[str, int | None]:
    """Each served model's context in tokens (`max_model_len` of `GET /v1/models`; None if not listed)."""
    async with httpx.AsyncClient(base_url=base_url(endpoint), timeout=timeout_s) as http:
        try:
            r = await http.get("/v1/models")
            r.raise_for_status()
        except httpx.HTTPError as e:
            raise ValueError(f"cannot list models at {endpoint}: {e}") from None
    return {m["id"]: m.get("max_model_len") for m in r.json()["data"]}


async def tokens_per_unit(endpoint: str, model: str, timeout_s: float = 120.0) -> float:
    """Server tokens per scaling unit (word or punctuation mark), measured with one short call: its
    `usage.prompt_tokens` over the prompt's size in units (template tokens included: errs high)."""
    text = filler(random.Random(0), 200)
    async with httpx.AsyncClient(base_url=base_url(endpoint), timeout=timeout_s) as http:
        try:
            r = await http.post(
                "/v1/chat/completions",
                json={
                    "model": model,
                    "max_tokens": 1,
                    "messages": [{"role": "user", "content": text}],
                },
            )
            r.raise_for_status()
        except httpx.HTTPError as e:
            raise ValueError(f"cannot measure {model}'s tokenizer at {endpoint}: {e}") from None
    return r.json()["usage"]["prompt_tokens"] / count_tokens(text)


def prepare(args) -> tuple[list[ScaledSession], ReplayOptions]:
    trace = load_trace(args.trace, args.seed, args.sessions)
    if args.timeout <= 0 or args.gap_cap < 0 or args.start_interval < 0:
        raise ValueError("--timeout must be > 0, --gap-cap and --start-interval >= 0")
    contexts = asyncio.run(served_contexts(args.endpoint))
    models = map_models(trace.models(), list(contexts), parse_model_map(args.model_map))
    sessions = scale_trace(
        trace, models, args.scale, args.output_scale, args.gap_cap, args.max_calls
    )
    used = sorted(set(models.values()))
    ratio = (
        max(asyncio.run(tokens_per_unit(args.endpoint, m)) for m in used)
        if any(contexts.values())
        else 1.0
    )
    return sessions, ReplayOptions(
        args.endpoint,
        config=args.label,
        timeout_s=args.timeout,
        start_interval_s=args.start_interval,
        contexts=contexts,
        tokens_per_unit=ratio,
    )


def replay_measured(
    sessions: list[ScaledSession], opts: ReplayOptions, admin_socket: str | None
) -> ReplayResult:
    """Replay, then add what the daemon measured (rounds, switches, HBM peak) from its admin API."""
    from talariad.admin.client import AdminClient, default_socket
    from talariad.replay.admin_records import REPLAY_UNMEASURED, HBMSampler, fill

    client = AdminClient(admin_socket or default_socket())
    try:
        with HBMSampler(client) as hbm:
            result = asyncio.run(replay(sessions, opts))
        fill(result.run, client, hbm)
    finally:
        client.close()
    result.run.unmeasured = result.run.unmeasured | REPLAY_UNMEASURED
    return result


def summary(result: ReplayResult) -> str:
    cont = [u for u in result.usage if u.call_idx > 0]
    reused = sum(u.cached_tokens for u in cont) / max(1, sum(u.prompt_tokens for u in cont))
    sources = {
        s: sum(u.kv_source == s for u in result.usage)
        for s in ("device", "host", "recompute", "none")
    }
    return (
        f"{len(result.run.calls)} calls, {len(result.run.sessions)} sessions done, {len(result.errors)} errors, "
        f"{result.retries} retries, {result.fitted} fitted to context; "
        f"continuations cached {100 * reused:.1f}% of prompt tokens; "
        f"kv_source {sources}; wall {result.run.wall_clock_s:.1f} s"
    )


def run_command(args) -> int:
    """The `run` subcommand: replay, print the table (and JSON); exit 1 if any call failed."""
    from rich.console import Console

    from talariad.replay.report import print_report, to_json_obj

    sessions, opts = prepare(args)
    result = replay_measured(sessions, opts, args.admin_socket)
    print_report(
        [result.run], Console(width=200), title=f"Real-mode replay against {opts.endpoint}"
    )
    print(summary(result))
    for e in result.errors:
        print(f"error: {e.session_id} call {e.call_idx}: {e.message}")
    if args.json:
        obj = {
            **to_json_obj([result.run]),
            "errors": [vars_of(e) for e in result.errors],
            "summary": summary(result),
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2)
    return 1 if result.errors else 0


def vars_of(e: CallError) -> dict:
    return {
        "session_id": e.session_id,
        "call_idx": e.call_idx,
        "status": e.status,
        "message": e.message,
    }
