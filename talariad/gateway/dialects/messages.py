"""The Anthropic Messages endpoint (`POST /v1/messages`): answers and errors in Anthropic's shapes
(named SSE events, `tool_use` blocks, `cache_read_input_tokens`, `{"type": "error"}`), and
count_tokens (the body and its `CallSpec`: `calls/dialects/messages.py`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from talariad.calls.dialects.messages import CountTokensRequest
from talariad.calls.errors import anthropic_error_body as error_body
from talariad.calls.spec import canonical, make_call_id
from talariad.gateway import limits
from talariad.gateway.call import Answer, Call, TextPiece, answer
from talariad.tools import arguments_json
from talariad.wire.messages import DoneEvent, GenerateRequest, StreamEvent, TokenEvent, ToolCall


def stop_reason(done: DoneEvent, calls: list[ToolCall]) -> str:
    if calls:
        return "tool_use"
    if done.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if done.stop_sequence is not None else "end_turn"


def usage(done: DoneEvent, talaria: dict | None = None) -> dict:
    u = done.usage
    out = {
        "input_tokens": u.prompt_tokens - u.cached_tokens,
        "output_tokens": u.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
    }
    return {**out, "talaria": talaria} if talaria is not None else out


def tool_use_block(call: ToolCall) -> dict:
    return {
        "type": "tool_use",
        "id": call.id,
        "name": call.name,
        "input": call.arguments if isinstance(call.arguments, dict) else {"input": call.arguments},
    }


def message_body(
    call_id: str, model: str, text: str, calls: list[ToolCall], done: DoneEvent, talaria: dict
) -> dict:
    content = ([{"type": "text", "text": text}] if text or not calls else []) + [
        tool_use_block(c) for c in calls
    ]
    return {
        "id": f"msg_{call_id}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(done, calls),
        "stop_sequence": done.stop_sequence,
        "usage": usage(done, talaria),
    }


def event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n"


def start_events(call_id: str, model: str, input_tokens: int, cached_tokens: int) -> list[str]:
    message = {
        "id": f"msg_{call_id}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": input_tokens - cached_tokens,
            "output_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached_tokens,
        },
    }
    return [
        event("message_start", {"message": message}),
        event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        event("ping", {}),
    ]


def text_event(text: str) -> str:
    return event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": text}})


def tool_events(index: int, call: ToolCall) -> list[str]:
    return [
        event(
            "content_block_start",
            {"index": index, "content_block": {**tool_use_block(call), "input": {}}},
        ),
        event(
            "content_block_delta",
            {
                "index": index,
                "delta": {
                    "type": "input_json_delta",
                    "partial_json": arguments_json(call)
                    if isinstance(call.arguments, dict)
                    else json.dumps({"input": call.arguments}),
                },
            },
        ),
        event("content_block_stop", {"index": index}),
    ]


def end_events(done: DoneEvent, calls: list[ToolCall], talaria: dict) -> list[str]:
    lines = [event("content_block_stop", {"index": 0})]
    for i, c in enumerate(calls, start=1):
        lines += tool_events(i, c)
    return lines + [
        event(
            "message_delta",
            {
                "delta": {
                    "stop_reason": stop_reason(done, calls),
                    "stop_sequence": done.stop_sequence,
                },
                "usage": usage(done, talaria),
            },
        ),
        event("message_stop", {}),
    ]


# ---- the call: stream, body, count_tokens --------------------------------------------------------


async def stream(call: Call, first: StreamEvent, rest: AsyncIterator[StreamEvent]):
    tokened = isinstance(first, TokenEvent)
    exact = tokened and first.prompt_tokens is not None
    prompt = first.prompt_tokens if exact else call.info.prompt_tokens
    cached = first.cached_tokens or 0 if tokened else 0
    for line in start_events(call.id, call.spec.requested, prompt, cached):
        yield line
    async for item in answer(call, first, rest):
        if isinstance(item, TextPiece):
            yield text_event(str(item))
        elif isinstance(item, Answer):
            for line in end_events(item.done, item.calls, call.talaria(item.done)):
                yield line
        else:
            yield event("error", {"error": error_body(503, item.message)["error"]})


def body(call: Call, text: str, end: Answer) -> dict:
    return message_body(
        call.id, call.spec.requested, text, end.calls, end.done, call.talaria(end.done)
    )


def count_request(gw, body: CountTokensRequest, raw: bytes) -> GenerateRequest:
    """A count_tokens call, screened by the limits of a generation call: a prompt that cannot fit
    the model is refused from its size, never tokenized."""
    limits.screen(body, gw.cfg.limits, raw)
    model = gw.resolve(body.model, "anthropic")
    messages, tools = body.chat(), body.tool_defs()
    limits.check_context(canonical(messages, None, tools), 1, model.max_context, gw.cfg.limits)
    return GenerateRequest(call_id=make_call_id(), model=model.name, messages=messages, tools=tools)
