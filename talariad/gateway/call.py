"""One call's lifecycle, the same for every API: admit → place → forward → finish.

A dialect (`calls/dialects/`) parses its body into a `CallSpec`; `Call` admits it (limits,
model, session branch, the router's request and the instance's), `respond` places it, forwards it
and hands the instance's events back to the dialect, which renders them as its bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING
from urllib.parse import quote

from fastapi.responses import JSONResponse, StreamingResponse
from pydantic_core import to_json

from talariad.calls.errors import APIError
from talariad.calls.placement import refusal
from talariad.calls.spec import CALL_ID_HEADER, CallSpec, canonical_prompt, make_call_id
from talariad.gateway import limits
from talariad.gateway.routing import ModelUnavailable
from talariad.tools import ToolStream
from talariad.wire.messages import (
    DoneEvent,
    ErrorEvent,
    GenerateRequest,
    StreamEvent,
    TokenEvent,
    ToolCall,
)

if TYPE_CHECKING:
    from talariad.gateway.gateway import Gateway


class Call:
    """One admitted call: its placement, the instance's request, and its completion books."""

    def __init__(self, gw: Gateway, spec: CallSpec, body, headers, raw: bytes | None = None):
        """`body`: the parsed request (its limits are screened); `raw`: the JSON text it came from."""
        limits.screen(body, gw.cfg.limits, raw)
        model = _served_model(gw, spec)
        self.gw, self.spec, self.body, self.model = gw, spec, body, model.name
        self.series = gw.metrics.model(model.name)
        self.tools = spec.tools
        self.parser = model.tool_parser
        self.prompt = canonical_prompt(spec.messages, spec.prompt, spec.tools)
        self.text = self.prompt.text
        clamp = not spec.max_tokens or (
            spec.api == "anthropic" and gw.cfg.anthropic.clamp_max_tokens
        )
        # a prompt that alone cannot fit is refused from its size, before anything hashes or
        # tokenizes it; whether max_tokens fits is the instance's to say (it knows the exact count)
        limits.check_context(self.text, 1, model.max_context, gw.cfg.limits)
        self.id = make_call_id()
        self.started = gw.clock()
        max_tokens = spec.max_tokens or model.default_max_tokens
        self.session, self.branch, self.info = gw.routing.placement.plan(
            self.id,
            spec,
            self.prompt,
            headers,
            self.model,
            max_tokens,
            model.max_context if clamp else None,
            arrived=self.started,  # a lease is judged at the call's receipt
        )
        self.req = GenerateRequest(
            call_id=self.id,
            session_id=self.branch,
            model=self.model,
            prompt=spec.prompt,
            messages=spec.messages,
            tools=spec.tools,
            max_tokens=max_tokens,
            clamp_max_tokens=clamp,
            temperature=_sampling(spec.temperature, model.temperature),
            top_p=_sampling(spec.top_p, model.top_p),
            seed=spec.seed,
            stop=spec.stop,
            ignore_eos=spec.ignore_eos,
        )
        self.instance = ""
        self.route = ""
        self.first_token_at: float | None = None
        self.answer: list[str] = []
        self.done = True  # nothing to release until placed

    async def place(self) -> None:
        try:
            decision = await self.gw.routing.place(self.info, self.gw.clock)
        except ModelUnavailable as why:
            raise APIError(
                503,
                f"no instance can take {self.spec.requested!r} calls now: {why}",
                type="api_error",
                param="model",
                code="model_unavailable",
                headers={"Retry-After": "5"},
            ) from None
        if decision.instance is None:
            raise refusal(decision, self.spec.requested, "instance")
        self.instance, self.route, self.done = decision.instance, decision.kind.value, False
        self.series.running.inc()

    def headers(self) -> dict[str, str]:
        # the session id is client text: percent-encode it so any value is a legal header
        return {
            "x-talaria-session-id": quote(self.session, safe="-_.~:@+="),
            "x-talaria-instance": self.instance,
            "x-talaria-route": self.route,
            CALL_ID_HEADER: self.id,  # a pool's picker maps it to the call it decided
        }

    def events(self) -> AsyncIterator[StreamEvent]:
        return self.gw.directory.client.generate(self.instance, self.req)

    def on_token(self, ev: TokenEvent) -> None:
        self.answer.append(ev.text)
        if self.first_token_at is None:
            self.first_token_at = self.gw.clock()
            self.series.ttft.observe(self.first_token_at - self.started)

    def finish(self, ev: DoneEvent | ErrorEvent) -> None:
        if self.done:
            return
        self.done = True
        m = self.series
        m.running.dec()
        now = self.gw.clock()
        if isinstance(ev, ErrorEvent):
            self.gw.routing.failed(self.id, now)
            m.finished("error").inc()
            return
        self.gw.routing.completed(self.id, self.instance, ev.kv_state, ev.kv_len, now)
        self.gw.routing.branches.remember(
            self.session, self.model, self.branch, self.prompt, "".join(self.answer)
        )
        usage = ev.usage
        m.finished(ev.finish_reason).inc()
        m.e2e.observe(now - self.started)
        m.prompt_tokens.inc(usage.prompt_tokens)
        m.generation_tokens.inc(usage.completion_tokens)
        m.cached_tokens(usage.kv_source).inc(usage.cached_tokens)

    def talaria(self, ev: DoneEvent) -> dict:
        """The `talaria` usage extension: where the call ran and where its prefix came from."""
        return {
            "kv_source": ev.usage.kv_source,
            "instance": self.instance,
            "session_id": self.session,
            "branch": self.branch,
            "route": self.route,
            "model": self.model,
        }


def _served_model(gw: Gateway, spec: CallSpec):
    """The model serving the requested id (404 when none is named so; 503 when none serves it)."""
    model = gw.resolve(spec.requested, spec.api)
    if not gw.served(model.name):
        raise APIError(
            503,
            f"The model {spec.requested!r} is not loaded on any instance now",
            type="api_error",
            param="model",
            code="model_not_loaded",
            headers={"Retry-After": "5"},
        )
    return model


def _sampling(sent: float | None, model_default: float | None) -> float:
    """The client's value; when it sent none, the model's configured default, else the APIs' 1.0."""
    if sent is not None:
        return sent
    return model_default if model_default is not None else 1.0


def upstream_error(call: Call, ev: ErrorEvent) -> APIError:
    call.finish(ev)
    if ev.status < 500:  # the call itself can never be served: retrying would not help
        message = ev.message
        wording = call.spec.context_error
        if wording and ev.code == "context_length_exceeded" and ev.prompt_tokens is not None:
            message = wording(ev.prompt_tokens, call.req.max_tokens, ev.limit or 0)
        return APIError(ev.status, message, param=ev.param, code=ev.code)
    return APIError(
        503, ev.message, type="api_error", code="instance_unavailable", headers={"Retry-After": "1"}
    )


class TextPiece(str):
    """A piece of answer text to send now."""


class Answer:
    """The end of an answer: the done event and the tool calls parsed from the held text."""

    def __init__(self, done: DoneEvent, calls: list[ToolCall]):
        self.done, self.calls = done, calls


async def first_event(events: AsyncIterator[StreamEvent]) -> StreamEvent:
    return await anext(events, ErrorEvent(message="instance closed the stream without an answer"))


async def answer(
    call: Call, first: StreamEvent, rest: AsyncIterator[StreamEvent]
) -> AsyncIterator[TextPiece | Answer | ErrorEvent]:
    """The instance's events as text pieces and one final Answer (or ErrorEvent); one parser for
    every API splits tool calls out of the text."""
    stream = ToolStream(call.parser, bool(call.tools))
    ev = first
    while True:
        if isinstance(ev, TokenEvent):
            call.on_token(ev)
            if piece := stream.push(ev.text):
                yield TextPiece(piece)
        elif isinstance(ev, DoneEvent):
            text, calls = stream.finish()
            if text:
                yield TextPiece(text)
            call.finish(ev)
            yield Answer(ev, calls)
            return
        else:
            call.finish(ev)
            yield ev
            return
        ev = await first_event(rest)


async def collect(
    call: Call, first: StreamEvent, rest: AsyncIterator[StreamEvent]
) -> tuple[str, Answer]:
    parts = []
    # closed here, not by the loop's finalizer (a task per generator left suspended)
    async with contextlib.aclosing(answer(call, first, rest)) as items:
        async for item in items:
            if isinstance(item, Answer):
                return "".join(parts), item
            if isinstance(item, ErrorEvent):
                raise upstream_error(call, item)
            parts.append(item)
    raise upstream_error(call, ErrorEvent(message="instance closed the stream without an answer"))


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


async def _guarded(call: Call, rest: AsyncIterator[StreamEvent], lines: AsyncIterator[str]):
    try:
        async for line in lines:
            yield line
    finally:  # a client that disconnects mid-stream still releases its placement
        call.finish(ErrorEvent(message="client disconnected"))
        await rest.aclose()


Renderer = Callable[[Call, StreamEvent, AsyncIterator[StreamEvent]], AsyncIterator[str]]
"""A dialect's stream: the event lines of an answer, from its first event on."""


async def respond(call: Call, stream: Renderer, full: Callable[[Call, str, Answer], dict]):
    """Place, forward, and answer as one body or as a stream (`stream` renders the event lines)."""
    await call.place()
    rest = call.events()
    try:
        first = await first_event(rest)
        if isinstance(first, ErrorEvent):
            raise upstream_error(call, first)
        if call.spec.stream:
            return Streamed(
                _guarded(call, rest, stream(call, first, rest)),
                media_type="text/event-stream",
                headers=call.headers(),
            )
        text, end = await collect(call, first, rest)
        await rest.aclose()  # over: closed now rather than by the loop's finalizer
    except BaseException:  # cancelled or failed before a stream took over: release the placement
        call.finish(ErrorEvent(message="call aborted"))
        await rest.aclose()
        raise
    return JSONBody(full(call, text, end), headers=call.headers())


class Streamed(StreamingResponse):
    """StreamingResponse without a task group per stream: the stream runs in the request's own
    task and a bare task watches for the client leaving, which cancels the stream at its next
    wait (Starlette's task group costs more than the rest of a streamed call's start; a server
    of ASGI spec < 2.4, such as uvicorn, drops a gone client's writes silently)."""

    async def __call__(self, scope, receive, send) -> None:
        spec = scope.get("asgi", {}).get("spec_version", "2.0")
        if scope["type"] != "http" or tuple(map(int, spec.split("."))) >= (2, 4):
            return await super().__call__(scope, receive, send)
        task, streaming = asyncio.current_task(), True

        def left(watch: asyncio.Task) -> None:
            if streaming and not watch.cancelled() and watch.exception() is None:
                task.cancel()

        watch = asyncio.ensure_future(self.listen_for_disconnect(receive))
        watch.add_done_callback(left)
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not watch.done() or watch.cancelled():
                raise  # cancelled from elsewhere
            task.uncancel()  # the client left: the stream is over
        finally:
            streaming = False
            watch.cancel()
        if self.background is not None:
            await self.background()


class JSONBody(JSONResponse):
    """JSONResponse's compact UTF-8 JSON, written by pydantic's serializer (several times faster
    than the json module; an answer body is written once per call)."""

    def render(self, content) -> bytes:
        return to_json(content)
