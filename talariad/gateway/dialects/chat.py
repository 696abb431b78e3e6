"""OpenAI Chat Completions (`POST /v1/chat/completions`): the answer as one `chat.completion` or
as `chat.completion.chunk` events (the body and its `CallSpec`: `calls/dialects/chat.py`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from talariad.calls.errors import APIError
from talariad.gateway.call import Answer, Call, TextPiece, answer, sse
from talariad.tools import arguments_json
from talariad.wire.messages import DoneEvent, ErrorEvent, StreamEvent, ToolCall


def usage(call: Call, done: DoneEvent) -> dict:
    """OpenAI's usage object, with the cached tokens and the `talaria` extension."""
    u = done.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "talaria": call.talaria(done),
    }


def error_event(ev: ErrorEvent) -> dict:
    """An error after the stream started: OpenAI's error body as the last event."""
    return APIError(503, ev.message, type="api_error", code="instance_unavailable").body()


def finish_reason(end: Answer) -> str:
    return "tool_calls" if end.calls else end.done.finish_reason


def tool_calls(calls: list[ToolCall]) -> list[dict]:
    return [
        {
            "id": c.id,
            "type": "function",
            "function": {"name": c.name, "arguments": arguments_json(c)},
        }
        for c in calls
    ]


def chunk(call: Call, delta: dict, finish: str | None) -> dict:
    return {
        "id": f"chatcmpl-{call.id}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": call.spec.requested,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _tool_call_chunks(call: Call, calls: list[ToolCall]) -> list[str]:
    lines = []
    for i, c in enumerate(calls):
        head = {"index": i, "id": c.id, "type": "function"}
        head["function"] = {"name": c.name, "arguments": ""}
        args = {"index": i, "function": {"arguments": arguments_json(c)}}
        lines.append(sse(chunk(call, {"tool_calls": [head]}, None)))
        lines.append(sse(chunk(call, {"tool_calls": [args]}, None)))
    return lines


async def stream(call: Call, first: StreamEvent, rest: AsyncIterator[StreamEvent]):
    yield sse(chunk(call, {"role": "assistant", "content": ""}, None))
    async for item in answer(call, first, rest):
        if isinstance(item, TextPiece):
            yield sse(chunk(call, {"content": str(item)}, None))
        elif isinstance(item, Answer):
            for line in _tool_call_chunks(call, item.calls):
                yield line
            yield sse(chunk(call, {}, finish_reason(item)))
            if call.spec.include_usage:
                yield sse({**chunk(call, {}, None), "choices": [], "usage": usage(call, item.done)})
        else:
            yield sse(error_event(item))
    yield sse("[DONE]")


def body(call: Call, text: str, end: Answer) -> dict:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text if text or not end.calls else None,
    }
    if end.calls:
        message["tool_calls"] = tool_calls(end.calls)
    return {
        "id": f"chatcmpl-{call.id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": call.spec.requested,
        "usage": usage(call, end.done),
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(end)}],
    }
