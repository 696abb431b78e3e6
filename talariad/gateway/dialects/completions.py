"""OpenAI Completions (`POST /v1/completions`): the answer as one `text_completion` or as its
events (the body and its `CallSpec`: `calls/dialects/completions.py`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from talariad.gateway.call import Answer, Call, TextPiece, answer, sse
from talariad.gateway.dialects.chat import error_event, usage
from talariad.wire.messages import StreamEvent


def chunk(call: Call, delta: dict, finish: str | None) -> dict:
    return {
        "id": f"cmpl-{call.id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": call.spec.requested,
        "choices": [{"index": 0, "text": delta.get("content", ""), "finish_reason": finish}],
    }


async def stream(call: Call, first: StreamEvent, rest: AsyncIterator[StreamEvent]):
    async for item in answer(call, first, rest):
        if isinstance(item, TextPiece):
            yield sse(chunk(call, {"content": str(item)}, None))
        elif isinstance(item, Answer):
            yield sse(chunk(call, {}, item.done.finish_reason))
            if call.spec.include_usage:
                yield sse({**chunk(call, {}, None), "choices": [], "usage": usage(call, item.done)})
        else:
            yield sse(error_event(item))
    yield sse("[DONE]")


def body(call: Call, text: str, end: Answer) -> dict:
    return {
        "id": f"cmpl-{call.id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": call.spec.requested,
        "usage": usage(call, end.done),
        "choices": [{"index": 0, "text": text, "finish_reason": end.done.finish_reason}],
    }
