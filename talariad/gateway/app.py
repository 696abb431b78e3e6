"""The OpenAI-compatible HTTP endpoint: parse, find the session, place, forward, stream back."""

from __future__ import annotations

import json
import time
import uuid
from urllib.parse import quote
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from talariad.config import TalariaConfig
from talariad.engine.messages import ChatMessage, DoneEvent, ErrorEvent, GenerateRequest, TokenEvent
from talariad.gateway import anthropic, errors
from talariad.gateway.errors import APIError
from talariad.engine.messages import StreamEvent
from talariad.gateway.instances import InstanceDirectory
from talariad.gateway.metrics import GatewayMetrics
from talariad.gateway.routing import RouterShell
from talariad.router import CallRequest
from talariad.gateway.schemas import ChatCompletionRequest, CompletionRequest
from talariad.gateway.session import session_id

DEFAULT_MAX_TOKENS = 256


class Gateway:
    """Everything a request handler needs; the daemon builds one and the tests can too."""

    def __init__(self, cfg: TalariaConfig, directory: InstanceDirectory, routing: RouterShell,
                 ready: Callable[[str], bool]):
        self.cfg, self.directory, self.routing, self.ready = cfg, directory, routing, ready
        self.metrics = GatewayMetrics()

    @staticmethod
    def clock() -> float:
        return time.monotonic()

    def residency(self, model: str) -> str:
        snaps = [self.directory.snapshot(i.name) for i in self.cfg.instances if model in i.models]
        if any(s and s.active_model == model for s in snaps):
            return "loaded"
        return "parked" if any(s and model in s.opened_models for s in snaps) else "cold"


def _estimate_tokens(texts: list[str]) -> int:
    return sum(len(t) for t in texts) // 4 + 1


async def _first(events: AsyncIterator[StreamEvent]) -> StreamEvent:
    return await anext(events, ErrorEvent(message="instance closed the stream without an answer"))


def _canonical(messages: list[tuple[str, str]], prompt: str | None) -> str:
    return prompt if prompt is not None else "".join(f"<|{r}|> {c}\n" for r, c in messages)


class _Call:
    """One forwarded call: placement, the internal request, and its completion bookkeeping."""

    def __init__(self, gw: Gateway, body, headers, messages: list[tuple[str, str]], prompt: str | None):
        if gw.cfg.model(body.model) is None:
            raise APIError(404, f"The model {body.model!r} does not exist", type="not_found_error",
                           param="model", code="model_not_found")
        self.gw, self.body = gw, body
        self.id = uuid.uuid4().hex[:24]
        self.session = session_id(headers, body.model_dump(), messages)
        self.started = gw.clock()
        self.text = _canonical(messages, prompt)
        covered = gw.routing.prefixes.covered_chars(self.session, body.model, self.text)
        self.info = CallRequest(self.id, self.session, body.model, _estimate_tokens([self.text]),
                                min(_estimate_tokens([self.text[:covered]]) if covered else 0,
                                    _estimate_tokens([self.text])),
                                body.limit(DEFAULT_MAX_TOKENS))
        self.req = GenerateRequest(
            call_id=self.id, session_id=self.session, model=body.model, prompt=prompt,
            messages=[ChatMessage(role=r, content=c) for r, c in messages], max_tokens=self.info.max_tokens,
            temperature=body.temperature, top_p=body.top_p, seed=body.seed, stop=body.stop_list())
        self.instance = ""
        self.route = ""
        self.first_token_at: float | None = None
        self.answer: list[str] = []
        self.done = True  # nothing to release until placed

    async def place(self) -> None:
        decision = await self.gw.routing.place(self.info, self.gw.clock)
        if decision.instance is None:
            retry = str(max(1, round(decision.retry_after_s or 1)))
            raise APIError(429, f"no instance can take a {self.body.model!r} call now ({decision.reason})",
                           type="rate_limit_exceeded", code=decision.kind.value, headers={"Retry-After": retry})
        self.instance, self.route, self.done = decision.instance, decision.kind.value, False
        self.gw.metrics.running.labels(self.body.model).inc()

    def headers(self) -> dict[str, str]:
        # the session id is client text: percent-encode it so any value is a legal header
        return {"x-talaria-session-id": quote(self.session, safe="-_.~:@+="), "x-talaria-instance": self.instance,
                "x-talaria-route": self.route}

    def events(self) -> AsyncIterator[StreamEvent]:
        return self.gw.directory.generate(self.instance, self.req)

    def on_token(self, ev: TokenEvent) -> None:
        self.answer.append(ev.text)
        if self.first_token_at is None:
            self.first_token_at = self.gw.clock()
            self.gw.metrics.ttft.labels(self.body.model).observe(self.first_token_at - self.started)

    def finish(self, ev: DoneEvent | ErrorEvent) -> None:
        if self.done:
            return
        self.done = True
        m, model = self.gw.metrics, self.body.model
        m.running.labels(model).dec()
        now = self.gw.clock()
        if isinstance(ev, ErrorEvent):
            self.gw.routing.failed(self.id, now)
            m.finished.labels(model, "error").inc()
            return
        self.gw.routing.completed(self.id, self.instance, ev.kv_state, ev.kv_len, now)
        self.gw.routing.prefixes.remember(self.session, model, self.text, "".join(self.answer))
        m.finished.labels(model, ev.finish_reason).inc()
        m.e2e.labels(model).observe(now - self.started)
        m.prompt_tokens.labels(model).inc(ev.usage.prompt_tokens)
        m.generation_tokens.labels(model).inc(ev.usage.completion_tokens)
        m.cached_tokens.labels(model, ev.usage.kv_source).inc(ev.usage.cached_tokens)

    def usage(self, ev: DoneEvent) -> dict:
        u = ev.usage
        return {
            "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
            "talaria": {"kv_source": u.kv_source, "instance": self.instance, "session_id": self.session,
                        "route": self.route},
        }


def _upstream_error(call: _Call, ev: ErrorEvent) -> APIError:
    call.finish(ev)
    if ev.status < 500:  # the call itself can never be served: retrying would not help
        return APIError(ev.status, ev.message, param=ev.param, code=ev.code)
    return APIError(503, ev.message, type="api_error", code="instance_unavailable", headers={"Retry-After": "1"})


async def _collect(call: _Call, first: StreamEvent,
                   rest: AsyncIterator[StreamEvent]) -> tuple[str, DoneEvent]:
    parts, ev = [], first
    while True:
        if isinstance(ev, TokenEvent):
            call.on_token(ev)
            parts.append(ev.text)
        elif isinstance(ev, DoneEvent):
            call.finish(ev)
            return "".join(parts), ev
        else:
            raise _upstream_error(call, ev)
        ev = await _first(rest)


def _sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


async def _guarded(call: _Call, rest: AsyncIterator[StreamEvent], lines: AsyncIterator[str]):
    try:
        async for line in lines:
            yield line
    finally:  # a client that disconnects mid-stream still releases its placement
        call.finish(ErrorEvent(message="client disconnected"))
        await rest.aclose()


def _openai_stream(chunk: Callable) -> Callable:
    def stream(call: _Call, first: StreamEvent, rest: AsyncIterator[StreamEvent]):
        return _stream_lines(call, first, rest, chunk, call.body.include_usage())
    return stream


async def _stream_lines(call: _Call, first: StreamEvent, rest: AsyncIterator[StreamEvent],
                        chunk: Callable, usage_chunk: bool):
    if chunk is chat_chunk:
        yield _sse(chunk(call, {"role": "assistant", "content": ""}, None))
    ev = first
    while True:
        if isinstance(ev, TokenEvent):
            call.on_token(ev)
            yield _sse(chunk(call, {"content": ev.text}, None))
        elif isinstance(ev, DoneEvent):
            call.finish(ev)
            yield _sse(chunk(call, {}, ev.finish_reason))
            if usage_chunk:
                yield _sse({**chunk(call, {}, None), "choices": [], "usage": call.usage(ev)})
            break
        else:
            call.finish(ev)
            yield _sse(_upstream_error_body(ev))
            break
        ev = await _first(rest)
    yield _sse("[DONE]")


def _upstream_error_body(ev: ErrorEvent) -> dict:
    return APIError(503, ev.message, type="api_error", code="instance_unavailable").body()


def chat_chunk(call: _Call, delta: dict, finish: str | None) -> dict:
    return {"id": f"chatcmpl-{call.id}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": call.body.model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def text_chunk(call: _Call, delta: dict, finish: str | None) -> dict:
    return {"id": f"cmpl-{call.id}", "object": "text_completion", "created": int(time.time()),
            "model": call.body.model,
            "choices": [{"index": 0, "text": delta.get("content", ""), "finish_reason": finish}]}


async def _respond(call: _Call, stream: Callable, full: Callable) -> Response:
    """Place, forward, and answer as one body or as a stream (`stream` renders the event lines)."""
    await call.place()
    rest = call.events()
    try:
        first = await _first(rest)
        if isinstance(first, ErrorEvent):
            raise _upstream_error(call, first)
        if call.body.stream:
            return StreamingResponse(_guarded(call, rest, stream(call, first, rest)),
                                     media_type="text/event-stream", headers=call.headers())
        text, done = await _collect(call, first, rest)
    except BaseException:  # cancelled or failed before a stream took over: release the placement
        call.finish(ErrorEvent(message="call aborted"))
        await rest.aclose()
        raise
    return JSONResponse(full(call, text, done), headers=call.headers())


def _chat_body(call: _Call, text: str, done: DoneEvent) -> dict:
    return {"id": f"chatcmpl-{call.id}", "object": "chat.completion", "created": int(time.time()),
            "model": call.body.model, "usage": call.usage(done),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": done.finish_reason}]}


def _completion_body(call: _Call, text: str, done: DoneEvent) -> dict:
    return {"id": f"cmpl-{call.id}", "object": "text_completion", "created": int(time.time()),
            "model": call.body.model, "usage": call.usage(done),
            "choices": [{"index": 0, "text": text, "finish_reason": done.finish_reason}]}


async def _anthropic_stream(call: _Call, first: StreamEvent, rest: AsyncIterator[StreamEvent]):
    for line in anthropic.start_events(call.id, call.body.model, call.info.prompt_tokens):
        yield line
    ev = first
    while isinstance(ev, TokenEvent):
        call.on_token(ev)
        yield anthropic.token_event(ev)
        ev = await _first(rest)
    call.finish(ev)
    if isinstance(ev, DoneEvent):
        for line in anthropic.end_events(ev):
            yield line
    else:
        yield anthropic.event("error", {"error": anthropic.error_body(503, ev.message)["error"]})


def _message_body(call: _Call, text: str, done: DoneEvent) -> dict:
    return anthropic.message_body(call.id, call.body.model, text, done)


def build_app(gw: Gateway) -> FastAPI:
    app = FastAPI(title="Talaria", docs_url=None, redoc_url=None)
    errors.install(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        ready = [i.name for i in gw.cfg.instances if gw.ready(i.name)]
        return JSONResponse({"status": "ok" if ready else "starting", "instances_ready": ready},
                            status_code=200 if ready else 503)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [
            {"id": m.name, "object": "model", "created": 0, "owned_by": "talaria",
             "max_model_len": m.max_context, "status": gw.residency(m.name)} for m in gw.cfg.models]}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        messages = [(m.role, m.text()) for m in body.messages]
        call = _Call(gw, body, request.headers, messages, None)
        return await _respond(call, _openai_stream(chat_chunk), _chat_body)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        call = _Call(gw, body, request.headers, [("user", body.text())], body.text())
        return await _respond(call, _openai_stream(text_chunk), _completion_body)

    @app.post("/v1/messages")
    async def messages(body: anthropic.MessagesRequest, request: Request) -> Response:
        """Anthropic Messages; `?beta=true`, `anthropic-version` and the API key are accepted and ignored."""
        return await _respond(_Call(gw, body, request.headers, body.chat(), None), _anthropic_stream, _message_body)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
