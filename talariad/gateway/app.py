"""The OpenAI-compatible HTTP endpoint: parse, find the session, place, forward, stream back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from urllib.parse import quote
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic_core import to_json

from talariad.config import ModelConfig, TalariaConfig
from talariad.httpserver import fastapi_app, post_json
from talariad.engine.messages import (
    ChatMessage,
    DoneEvent,
    ErrorEvent,
    GenerateRequest,
    StreamEvent,
    TokenEvent,
    ToolCall,
)
from talariad.gateway import anthropic, errors, limits, responses
from talariad.gateway.auth import APIKeys
from talariad.gateway.errors import APIError
from talariad.gateway.instances import InstanceDirectory
from talariad.gateway.metrics import Children, GatewayMetrics
from talariad.gateway.routing import RouterShell
from talariad.router import CallRequest
from talariad.gateway.schemas import ChatCompletionRequest, CompletionRequest, body_field
from talariad.gateway.session import SESSION_FIELDS, session_headers, session_id
from talariad.tools import ToolStream, arguments_json

log = logging.getLogger("talariad.gateway")


class Gateway:
    """Everything a request handler needs; the daemon builds one and the tests can too."""

    def __init__(
        self,
        cfg: TalariaConfig,
        directory: InstanceDirectory,
        routing: RouterShell,
        ready: Callable[[str], bool],
        describe: Callable[[], list[dict]] | None = None,
    ):
        self.cfg, self.directory, self.routing, self.ready = cfg, directory, routing, ready
        self.describe = describe or (
            lambda: [{"name": i.name, "ready": ready(i.name)} for i in cfg.instances]
        )
        """Each instance's state and telemetry age, for /health and /ready."""
        self.api_keys: frozenset[str] | None = None
        """When set, every /v1/ call needs one of these keys."""
        self.metrics = GatewayMetrics()
        self.stored = responses.ResponseStore(cfg.responses.store_max)
        self._dropped_logged: set[str] = set()

    @staticmethod
    def clock() -> float:
        return time.monotonic()

    def served(self, model: str) -> bool:
        """Some instance serves `model` now (run-time unloads and pool moves count)."""
        for i in self.cfg.instances:
            snap = self.directory.snapshot(i.name)
            if model in (snap.models if snap is not None else i.models):
                return True
        return False

    def residency(self, model: str) -> str:
        snaps = [
            s
            for i in self.cfg.instances
            if (s := self.directory.snapshot(i.name)) is not None and model in s.models
        ]
        if any(s and s.active_model == model for s in snaps):
            return "loaded"
        return "parked" if any(s and model in s.opened_models for s in snaps) else "cold"

    def resolve(self, requested: str, api: str) -> ModelConfig:
        """The model serving a requested id (a name or alias; Anthropic calls may fall back to the
        configured default model)."""
        found = self.cfg.resolve_model(requested)
        if found is None and api == "anthropic" and self.cfg.anthropic.default_model:
            found = self.cfg.resolve_model(self.cfg.anthropic.default_model)
        if found is None:
            raise APIError(
                404,
                f"The model {requested!r} does not exist",
                type="not_found_error",
                param="model",
                code="model_not_found",
            )
        return found

    def log_dropped(self, session: str, dropped: list[str]) -> None:
        """Tools that cannot run here were dropped from the prompt: say so once per session."""
        if dropped and session not in self._dropped_logged:
            if (
                len(self._dropped_logged) > 10_000
            ):  # bounded: a long-running daemon sees many sessions
                self._dropped_logged.clear()
            self._dropped_logged.add(session)
            log.info(
                "session %s: dropped hosted tools that cannot run locally: %s",
                session,
                ", ".join(sorted(set(dropped))),
            )


def _call_id() -> str:
    """24 random hex digits (as many as the uuid4 prefix they replace, at a fraction of its cost)."""
    return os.urandom(12).hex()


def _sampling(body, field: str, model_default: float | None) -> float:
    """The client's value; when it sent none, the model's configured default, else the API's."""
    if model_default is None or field in body.model_fields_set:
        return getattr(body, field)
    return model_default


def _estimate_tokens(chars: int) -> int:
    return chars // 4 + 1


async def _first(events: AsyncIterator[StreamEvent]) -> StreamEvent:
    return await anext(events, ErrorEvent(message="instance closed the stream without an answer"))


def _canonical(messages: list[ChatMessage], prompt: str | None, tools: list[dict]) -> str:
    """The prompt as text for estimates and prefix matching (tools first, as templates put them)."""
    if prompt is not None:
        return prompt
    head = "".join(f"<|tools|> {json.dumps(t, sort_keys=True)}\n" for t in tools)
    return head + "".join(
        f"<|{m.role}|> {m.content}{_calls_text(m.tool_calls)}\n" for m in messages
    )


def _calls_text(calls: list[ToolCall]) -> str:
    return "".join(f"<tool_call>{c.name} {arguments_json(c)}</tool_call>" for c in calls)


class _Call:
    """One forwarded call: placement, the internal request, and its completion bookkeeping."""

    def __init__(
        self,
        gw: Gateway,
        body,
        headers,
        messages: list[ChatMessage],
        prompt: str | None = None,
        *,
        api: str = "openai",
        tools: list[dict] | None = None,
        raw: bytes | None = None,
    ):
        """`raw`: the JSON text `body` was parsed from (the request body), when there is one."""
        limits.screen(body, gw.cfg.limits, raw)
        spec = gw.resolve(body.model, api)
        if not gw.served(spec.name):
            raise APIError(
                503,
                f"The model {body.model!r} is not loaded on any instance now",
                type="api_error",
                param="model",
                code="model_not_loaded",
                headers={"Retry-After": "5"},
            )
        self.gw, self.body, self.api, self.model = gw, body, api, spec.name
        self.series = gw.metrics.model(spec.name)
        self.tools = tools or []
        self.parser = spec.tool_parser
        self.text = _canonical(messages, prompt, self.tools)
        asked = body.limit(0)
        clamp = not asked or (api == "anthropic" and gw.cfg.anthropic.clamp_max_tokens)
        # a prompt that alone cannot fit is refused from its size, before anything hashes or
        # tokenizes it; whether max_tokens fits is the instance's to say (it knows the exact count)
        limits.check_context(self.text, 1, spec.max_context, gw.cfg.limits)
        self.id = _call_id()
        self.session = session_id(
            session_headers(headers),
            {k: body_field(body, k) for k in SESSION_FIELDS},
            [(m.role, m.content) for m in messages],
        )
        self.started = gw.clock()
        self.branch, covered = gw.routing.branches.branch_covered(
            self.session, self.model, self.text
        )
        max_tokens = asked or spec.default_max_tokens
        estimate = _estimate_tokens(len(self.text))
        # the router plans with what can fit; the instance, which knows the exact prompt, clamps
        plan = max(1, min(max_tokens, spec.max_context - estimate)) if clamp else max_tokens
        self.info = CallRequest(
            self.id,
            self.branch,
            self.model,
            estimate,
            min(_estimate_tokens(covered) if covered else 0, estimate),
            plan,
        )
        self.req = GenerateRequest(
            call_id=self.id,
            session_id=self.branch,
            model=self.model,
            prompt=prompt,
            messages=messages,
            tools=self.tools,
            max_tokens=max_tokens,
            clamp_max_tokens=clamp,
            temperature=_sampling(body, "temperature", spec.temperature),
            top_p=_sampling(body, "top_p", spec.top_p),
            seed=body.seed,
            stop=body.stop_list(),
            ignore_eos=body_field(body, "ignore_eos", False),
        )
        self.instance = ""
        self.route = ""
        self.first_token_at: float | None = None
        self.answer: list[str] = []
        self.done = True  # nothing to release until placed

    async def place(self) -> None:
        decision = await self.gw.routing.place(self.info, self.gw.clock)
        if decision.instance is None:
            retry = str(max(1, round(decision.retry_after_s or 1)))
            raise APIError(
                429,
                f"no instance can take a {self.body.model!r} call now ({decision.reason})",
                type="rate_limit_exceeded",
                code=decision.kind.value,
                headers={"Retry-After": retry},
            )
        self.instance, self.route, self.done = decision.instance, decision.kind.value, False
        self.series.running.inc()

    def headers(self) -> dict[str, str]:
        # the session id is client text: percent-encode it so any value is a legal header
        return {
            "x-talaria-session-id": quote(self.session, safe="-_.~:@+="),
            "x-talaria-instance": self.instance,
            "x-talaria-route": self.route,
        }

    def events(self) -> AsyncIterator[StreamEvent]:
        return self.gw.directory.generate(self.instance, self.req)

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
        self.gw.routing.prefixes.remember(self.branch, self.model, self.text, "".join(self.answer))
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

    def usage(self, ev: DoneEvent) -> dict:
        u = ev.usage
        return {
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
            "talaria": self.talaria(ev),
        }


def _upstream_error(call: _Call, ev: ErrorEvent) -> APIError:
    call.finish(ev)
    if ev.status < 500:  # the call itself can never be served: retrying would not help
        message = ev.message
        if (
            call.api == "anthropic"
            and ev.code == "context_length_exceeded"
            and ev.prompt_tokens is not None
        ):
            message = anthropic.context_message(
                ev.prompt_tokens, call.req.max_tokens, ev.limit or 0
            )
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


async def _answer(
    call: _Call, first: StreamEvent, rest: AsyncIterator[StreamEvent]
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
        ev = await _first(rest)


async def _collect(
    call: _Call, first: StreamEvent, rest: AsyncIterator[StreamEvent]
) -> tuple[str, Answer]:
    parts = []
    # closed here, not by the loop's finalizer (a task per generator left suspended)
    async with contextlib.aclosing(_answer(call, first, rest)) as items:
        async for item in items:
            if isinstance(item, Answer):
                return "".join(parts), item
            if isinstance(item, ErrorEvent):
                raise _upstream_error(call, item)
            parts.append(item)
    raise _upstream_error(call, ErrorEvent(message="instance closed the stream without an answer"))


def _sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


async def _guarded(call: _Call, rest: AsyncIterator[StreamEvent], lines: AsyncIterator[str]):
    try:
        async for line in lines:
            yield line
    finally:  # a client that disconnects mid-stream still releases its placement
        call.finish(ErrorEvent(message="client disconnected"))
        await rest.aclose()


def _finish_reason(answer: Answer) -> str:
    return "tool_calls" if answer.calls else answer.done.finish_reason


def _openai_calls(calls: list[ToolCall]) -> list[dict]:
    return [
        {
            "id": c.id,
            "type": "function",
            "function": {"name": c.name, "arguments": arguments_json(c)},
        }
        for c in calls
    ]


async def _chat_stream(call: _Call, first: StreamEvent, rest: AsyncIterator[StreamEvent]):
    yield _sse(chat_chunk(call, {"role": "assistant", "content": ""}, None))
    async for item in _answer(call, first, rest):
        if isinstance(item, TextPiece):
            yield _sse(chat_chunk(call, {"content": str(item)}, None))
        elif isinstance(item, Answer):
            for i, c in enumerate(item.calls):
                head = {
                    "index": i,
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": ""},
                }
                yield _sse(chat_chunk(call, {"tool_calls": [head]}, None))
                yield _sse(
                    chat_chunk(
                        call,
                        {
                            "tool_calls": [
                                {"index": i, "function": {"arguments": arguments_json(c)}}
                            ]
                        },
                        None,
                    )
                )
            yield _sse(chat_chunk(call, {}, _finish_reason(item)))
            if call.body.include_usage():
                yield _sse(
                    {**chat_chunk(call, {}, None), "choices": [], "usage": call.usage(item.done)}
                )
        else:
            yield _sse(_upstream_error_body(item))
    yield _sse("[DONE]")


async def _completion_stream(call: _Call, first: StreamEvent, rest: AsyncIterator[StreamEvent]):
    async for item in _answer(call, first, rest):
        if isinstance(item, TextPiece):
            yield _sse(text_chunk(call, {"content": str(item)}, None))
        elif isinstance(item, Answer):
            yield _sse(text_chunk(call, {}, item.done.finish_reason))
            if call.body.include_usage():
                yield _sse(
                    {**text_chunk(call, {}, None), "choices": [], "usage": call.usage(item.done)}
                )
        else:
            yield _sse(_upstream_error_body(item))
    yield _sse("[DONE]")


def _upstream_error_body(ev: ErrorEvent) -> dict:
    return APIError(503, ev.message, type="api_error", code="instance_unavailable").body()


def chat_chunk(call: _Call, delta: dict, finish: str | None) -> dict:
    return {
        "id": f"chatcmpl-{call.id}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": call.body.model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def text_chunk(call: _Call, delta: dict, finish: str | None) -> dict:
    return {
        "id": f"cmpl-{call.id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": call.body.model,
        "choices": [{"index": 0, "text": delta.get("content", ""), "finish_reason": finish}],
    }


async def _respond(call: _Call, stream: Callable, full: Callable) -> Response:
    """Place, forward, and answer as one body or as a stream (`stream` renders the event lines)."""
    await call.place()
    rest = call.events()
    try:
        first = await _first(rest)
        if isinstance(first, ErrorEvent):
            raise _upstream_error(call, first)
        if call.body.stream:
            return _Streamed(
                _guarded(call, rest, stream(call, first, rest)),
                media_type="text/event-stream",
                headers=call.headers(),
            )
        text, answer = await _collect(call, first, rest)
        await rest.aclose()  # over: closed now rather than by the loop's finalizer
    except BaseException:  # cancelled or failed before a stream took over: release the placement
        call.finish(ErrorEvent(message="call aborted"))
        await rest.aclose()
        raise
    return _JSON(full(call, text, answer), headers=call.headers())


class _Streamed(StreamingResponse):
    """StreamingResponse without a task group per stream. Starlette runs the stream and a watch for
    the client's disconnect as two tasks of an anyio task group (a server of ASGI spec < 2.4, such
    as uvicorn, drops the writes of a gone client silently), which costs more than the rest of a
    streamed call's start. Here the stream runs in the request's own task and a bare task watches:
    the client leaving cancels the stream at its next wait, and the response ends as Starlette's
    does (the body iterator's `finally` releases the call and closes the instance hop)."""

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


class _JSON(JSONResponse):
    """JSONResponse's compact UTF-8 JSON, written by pydantic's serializer (several times faster
    than the json module; an answer body is written once per call)."""

    def render(self, content) -> bytes:
        return to_json(content)


def _chat_body(call: _Call, text: str, answer: Answer) -> dict:
    message: dict = {"role": "assistant", "content": text if text or not answer.calls else None}
    if answer.calls:
        message["tool_calls"] = _openai_calls(answer.calls)
    return {
        "id": f"chatcmpl-{call.id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": call.body.model,
        "usage": call.usage(answer.done),
        "choices": [{"index": 0, "message": message, "finish_reason": _finish_reason(answer)}],
    }


def _completion_body(call: _Call, text: str, answer: Answer) -> dict:
    return {
        "id": f"cmpl-{call.id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": call.body.model,
        "usage": call.usage(answer.done),
        "choices": [{"index": 0, "text": text, "finish_reason": answer.done.finish_reason}],
    }


async def _anthropic_stream(call: _Call, first: StreamEvent, rest: AsyncIterator[StreamEvent]):
    prompt = (
        first.prompt_tokens
        if isinstance(first, TokenEvent) and first.prompt_tokens is not None
        else call.info.prompt_tokens
    )
    cached = first.cached_tokens or 0 if isinstance(first, TokenEvent) else 0
    for line in anthropic.start_events(call.id, call.body.model, prompt, cached):
        yield line
    async for item in _answer(call, first, rest):
        if isinstance(item, TextPiece):
            yield anthropic.text_event(str(item))
        elif isinstance(item, Answer):
            for line in anthropic.end_events(item.done, item.calls, call.talaria(item.done)):
                yield line
        else:
            yield anthropic.event(
                "error", {"error": anthropic.error_body(503, item.message)["error"]}
            )


def _message_body(call: _Call, text: str, answer: Answer) -> dict:
    return anthropic.message_body(
        call.id, call.body.model, text, answer.calls, answer.done, call.talaria(answer.done)
    )


class _ResponsesCall(_Call):
    """A /v1/responses call: its conversation (for the response store) and custom tool names."""

    conversation: list[ChatMessage]
    custom: set[str]


def _open_message(ev, call_id: str, msg_id: str) -> tuple:
    """The two events that open the message item and its text part (before its first text, or
    before an empty answer's done events)."""
    return (
        ev(
            "response.output_item.added",
            {"output_index": 0, "item": responses.message_item(call_id, "", "in_progress")},
        ),
        ev(
            "response.content_part.added",
            {
                "item_id": msg_id,
                "output_index": 0,
                "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []},
            },
        ),
    )


async def _responses_stream(
    call: _ResponsesCall, first: StreamEvent, rest: AsyncIterator[StreamEvent]
):
    ev = responses.EventWriter()
    body = call.body
    shell = responses.response_object(call.id, body, "in_progress", [])
    yield ev("response.created", {"response": shell})
    yield ev("response.in_progress", {"response": shell})
    output: list[dict] = []
    msg_id = f"msg_{call.id}"
    text = ""
    async for item in _answer(call, first, rest):
        if isinstance(item, TextPiece):
            if not text:
                for event in _open_message(ev, call.id, msg_id):
                    yield event
            text += item
            yield ev(
                "response.output_text.delta",
                {"item_id": msg_id, "output_index": 0, "content_index": 0, "delta": str(item)},
            )
        elif isinstance(item, ErrorEvent):
            failed = responses.response_object(
                call.id,
                body,
                "failed",
                output,
                error={"code": "server_error", "message": item.message},
            )
            yield ev("response.failed", {"response": failed})
            return
        else:
            if text or not item.calls:
                if not text:
                    for event in _open_message(ev, call.id, msg_id):
                        yield event
                part = {"type": "output_text", "text": text, "annotations": []}
                yield ev(
                    "response.output_text.done",
                    {"item_id": msg_id, "output_index": 0, "content_index": 0, "text": text},
                )
                yield ev(
                    "response.content_part.done",
                    {"item_id": msg_id, "output_index": 0, "content_index": 0, "part": part},
                )
                output.append(responses.message_item(call.id, text))
                yield ev("response.output_item.done", {"output_index": 0, "item": output[-1]})
            for c in item.calls:
                for line in _tool_item_events(ev, c, call.custom, len(output)):
                    yield line
                output.append(responses.tool_item(c, call.custom))
            _store(call, text, item)
            final = responses.response_object(
                call.id,
                body,
                responses.status_of(item.done, item.calls),
                output,
                item.done,
                call.talaria(item.done),
            )
            yield ev(
                "response.completed" if final["status"] == "completed" else "response.incomplete",
                {"response": final},
            )


def _tool_item_events(
    ev: responses.EventWriter, c: ToolCall, custom: set[str], index: int
) -> list[str]:
    done = responses.tool_item(c, custom)
    added = responses.tool_item(c, custom, "in_progress")
    lines = [ev("response.output_item.added", {"output_index": index, "item": added})]
    if done["type"] == "custom_tool_call":
        lines += [
            ev(
                "response.custom_tool_call_input.delta",
                {"item_id": done["id"], "output_index": index, "delta": done["input"]},
            ),
            ev(
                "response.custom_tool_call_input.done",
                {"item_id": done["id"], "output_index": index, "input": done["input"]},
            ),
        ]
    else:
        lines += [
            ev(
                "response.function_call_arguments.delta",
                {"item_id": done["id"], "output_index": index, "delta": done["arguments"]},
            ),
            ev(
                "response.function_call_arguments.done",
                {
                    "item_id": done["id"],
                    "output_index": index,
                    "name": c.name,
                    "arguments": done["arguments"],
                },
            ),
        ]
    return lines + [ev("response.output_item.done", {"output_index": index, "item": done})]


def _store(call: _ResponsesCall, text: str, answer: Answer) -> None:
    if call.body.store is not False:
        reply = ChatMessage(role="assistant", content=text, tool_calls=answer.calls)
        call.gw.stored.put(f"resp_{call.id}", call.conversation + [reply])


def _responses_body(call: _ResponsesCall, text: str, answer: Answer) -> dict:
    _store(call, text, answer)
    output = responses.output_items(call.id, text, answer.calls, call.custom)
    body = responses.response_object(
        call.id,
        call.body,
        responses.status_of(answer.done, answer.calls),
        output,
        answer.done,
        call.talaria(answer.done),
    )
    body["output_text"] = text
    return body


async def _route_call(gw: Gateway, body, request: Request, messages, *args, **kwargs) -> _Call:
    """A call of a route: the request's headers and raw body come with its body and messages."""
    return _Call(gw, body, request.headers, messages, *args, raw=await request.body(), **kwargs)


def _responses_call(
    gw: Gateway, body: responses.ResponsesRequest, headers, raw: bytes | None = None
) -> _ResponsesCall:
    messages, tools = responses.convert(body)
    if body.previous_response_id:
        messages = gw.stored.get(body.previous_response_id) + messages
    if body.tool_choice == "none":
        tools.defs = []
    call = _ResponsesCall(gw, body, headers, messages, api="responses", tools=tools.defs, raw=raw)
    call.conversation, call.custom = messages, tools.custom
    gw.log_dropped(call.session, tools.dropped)
    return call


class _CountResponses:
    """Count responses by status code (a bare ASGI wrapper: no per-request task or body copy)."""

    def __init__(self, app, counter):
        self.app, self.codes = app, Children(counter)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counted(message):
            if message["type"] == "http.response.start":
                self.codes.get(str(message["status"])).inc()
            await send(message)

        return await self.app(scope, receive, counted)


def build_app(gw: Gateway) -> FastAPI:
    app = fastapi_app(title="Talaria", docs_url=None, redoc_url=None)
    errors.install(app)
    app.add_middleware(_CountResponses, counter=gw.metrics.responses)
    app.add_middleware(limits.BodyLimit, max_bytes=lambda: gw.cfg.limits.max_body_bytes)
    app.add_middleware(APIKeys, keys=lambda: gw.api_keys)
    # routes match in the order they are added: the calls first, the probes after

    @post_json(app, "/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        call = await _route_call(
            gw, body, request, [m.chat() for m in body.messages], tools=body.tool_defs()
        )
        return await _respond(call, _chat_stream, _chat_body)

    @post_json(app, "/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        prompt = body.text()
        call = await _route_call(
            gw, body, request, [ChatMessage(role="user", content=prompt)], prompt
        )
        return await _respond(call, _completion_stream, _completion_body)

    @post_json(app, "/v1/messages")
    async def messages(body: anthropic.MessagesRequest, request: Request) -> Response:
        """Anthropic Messages; `?beta=true`, `anthropic-version` and the API key are accepted and ignored."""
        call = await _route_call(
            gw, body, request, body.chat(), api="anthropic", tools=body.tool_defs()
        )
        gw.log_dropped(call.session, body.dropped_tools())
        return await _respond(call, _anthropic_stream, _message_body)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(body: anthropic.CountTokensRequest, request: Request) -> dict:
        """The exact prompt length (system, messages and tools) as the serving model tokenizes it."""
        spec = gw.resolve(body.model, "anthropic")
        req = GenerateRequest(
            call_id=_call_id(),
            model=spec.name,
            messages=body.chat(),
            tools=body.tool_defs(),
        )
        for inst in gw.cfg.instances:
            if spec.name in inst.models and gw.ready(inst.name):
                count = await gw.directory.count_tokens(inst.name, req)
                if isinstance(count, int):
                    return {"input_tokens": count}
                if isinstance(count, str):
                    raise APIError(400, count, param="messages")
        raise APIError(
            503,
            f"no instance of {spec.name!r} is ready to count tokens",
            type="api_error",
            code="instance_unavailable",
            headers={"Retry-After": "1"},
        )

    @post_json(app, "/v1/responses")
    async def create_response(body: responses.ResponsesRequest, request: Request) -> Response:
        """OpenAI Responses (Codex): one respond path with chat, Responses shapes and events."""
        call = _responses_call(gw, body, request.headers, await request.body())
        return await _respond(call, _responses_stream, _responses_body)

    @app.get("/health")
    async def health() -> JSONResponse:
        """Liveness: answered while the daemon's loop runs (readiness is /ready)."""
        rows = gw.describe()
        return JSONResponse(
            {
                "status": "ok",
                "instances_ready": [r["name"] for r in rows if r["ready"]],
                "instances": rows,
            }
        )

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """Readiness: 200 when every configured model has at least one ready instance."""
        serving = {
            m.name: [i.name for i in gw.cfg.instances if m.name in i.models and gw.ready(i.name)]
            for m in gw.cfg.models
        }
        ok = all(serving.values())
        return JSONResponse(
            {
                "status": "ready" if ok else "not_ready",
                "models": serving,
                "instances": gw.describe(),
            },
            status_code=200 if ok else 503,
        )

    @app.get("/v1/models")
    async def models() -> dict:
        """Every model, with its aliases; exact aliases are listed as models of their own too."""
        data = []
        for m in gw.cfg.models:
            entry = {
                "id": m.name,
                "object": "model",
                "created": 0,
                "owned_by": "talaria",
                "max_model_len": m.max_context,
                "status": gw.residency(m.name),
                "aliases": list(m.aliases),
            }
            data.append(entry)
            data += [
                {**entry, "id": a, "alias_of": m.name, "aliases": []}
                for a in m.aliases
                if not any(c in a for c in "*?[")
            ]
        return {"object": "list", "data": data}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
