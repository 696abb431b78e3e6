"""The OpenAI Responses endpoint (`POST /v1/responses`): answers as `message`, `function_call` and
`custom_tool_call` output items, streamed as Responses events, and kept for
`previous_response_id` (the body and its `CallSpec`: `calls/dialects/responses.py`). A tool of a
namespace is answered by its name with the namespace in a field of its own, a tool of Codex's
default namespace (`functions`) by its bare name.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

from talariad.calls.dialects.responses import ResponsesRequest, ResponseTools, Turn
from talariad.gateway.call import Answer, Call, TextPiece, answer
from talariad.tools import arguments_json
from talariad.wire.messages import ChatMessage, DoneEvent, ErrorEvent, StreamEvent, ToolCall


def output_items(
    call_id: str, text: str, calls: list[ToolCall], tools: ResponseTools
) -> list[dict]:
    items = [message_item(call_id, text)] if text or not calls else []
    return items + [tool_item(c, tools) for c in calls]


def message_item(call_id: str, text: str, status: str = "completed") -> dict:
    return {
        "id": f"msg_{call_id}",
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}]
        if status == "completed"
        else [],
    }


def tool_item(call: ToolCall, tools: ResponseTools, status: str = "completed") -> dict:
    """The output item of a tool call. A tool of a namespace is answered by its own name and
    the namespace in a field of its own, as Codex reads it back (`ToolName::new(namespace,
    name)` in openai/codex codex-rs/core/src/tools/router.rs, `build_tool_call`); a tool of the
    default namespace by its bare name."""
    done = status == "completed"
    namespace, name = tools.namespaced.get(call.name, (None, call.name))
    if call.name in tools.custom:
        value = (
            call.arguments.get("input", "") if isinstance(call.arguments, dict) else call.arguments
        )
        item = {
            "id": f"ctc_{call.id}",
            "type": "custom_tool_call",
            "status": status,
            "call_id": call.id,
            "name": name,
            "input": str(value) if done else "",
        }
    else:
        item = {
            "id": f"fc_{call.id}",
            "type": "function_call",
            "status": status,
            "call_id": call.id,
            "name": name,
            "arguments": arguments_json(call) if done else "",
        }
    if namespace:
        item["namespace"] = namespace
    return item


def usage(done: DoneEvent, talaria: dict) -> dict:
    u = done.usage
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "talaria": talaria,
    }


def response_object(
    call_id: str,
    body: ResponsesRequest,
    status: str,
    output: list[dict],
    done: DoneEvent | None = None,
    talaria: dict | None = None,
    error: dict | None = None,
) -> dict:
    incomplete = status == "incomplete"
    return {
        "id": f"resp_{call_id}",
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": body.model,
        "output": output,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "parallel_tool_calls": bool(getattr(body, "parallel_tool_calls", True)),
        "previous_response_id": body.previous_response_id,
        "store": body.store is not False,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "tool_choice": body.tool_choice or "auto",
        "tools": body.tools or [],
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "metadata": body.metadata or {},
        "reasoning": None,
        "usage": usage(done, talaria or {}) if done is not None else None,
    }


def status_of(done: DoneEvent, calls: list[ToolCall]) -> str:
    return "incomplete" if done.finish_reason == "length" and not calls else "completed"


class EventWriter:
    """Responses SSE events, numbered in order."""

    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, name: str, data: dict) -> str:
        line = f"event: {name}\ndata: {json.dumps({'type': name, 'sequence_number': self.seq, **data})}\n\n"
        self.seq += 1
        return line


def new_id() -> str:
    return uuid.uuid4().hex[:24]


# ---- the call: stream, body ----------------------------------------------------------------------


def _open_message(ev, call_id: str, msg_id: str) -> tuple:
    """The two events that open the message item and its text part (before its first text, or
    before an empty answer's done events)."""
    return (
        ev(
            "response.output_item.added",
            {"output_index": 0, "item": message_item(call_id, "", "in_progress")},
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


async def stream(turn: Turn, call: Call, first: StreamEvent, rest: AsyncIterator[StreamEvent]):
    ev = EventWriter()
    body = turn.body
    shell = response_object(call.id, body, "in_progress", [])
    yield ev("response.created", {"response": shell})
    yield ev("response.in_progress", {"response": shell})
    output: list[dict] = []
    msg_id = f"msg_{call.id}"
    text = ""
    async for item in answer(call, first, rest):
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
            failed = response_object(
                call.id,
                body,
                "failed",
                output,
                error={"code": "server_error", "message": item.message},
            )
            yield ev("response.failed", {"response": failed})
            return
        else:
            for line in _end_events(ev, turn, call, item, text):
                yield line


def _end_events(ev: EventWriter, turn: Turn, call: Call, end: Answer, text: str) -> list[str]:
    """The events that close an answer: its message item (unless it is only tool calls), one
    item per tool call, and the final response."""
    msg_id, lines, output = f"msg_{call.id}", [], []
    if text or not end.calls:
        if not text:
            lines += _open_message(ev, call.id, msg_id)
        part = {"type": "output_text", "text": text, "annotations": []}
        where = {"item_id": msg_id, "output_index": 0, "content_index": 0}
        lines.append(ev("response.output_text.done", {**where, "text": text}))
        lines.append(ev("response.content_part.done", {**where, "part": part}))
        output.append(message_item(call.id, text))
        lines.append(ev("response.output_item.done", {"output_index": 0, "item": output[-1]}))
    for c in end.calls:
        lines += _tool_item_events(ev, c, turn.tools, len(output))
        output.append(tool_item(c, turn.tools))
    _store(turn, call, text, end)
    status = status_of(end.done, end.calls)
    final = response_object(call.id, turn.body, status, output, end.done, call.talaria(end.done))
    done = "response.completed" if final["status"] == "completed" else "response.incomplete"
    return lines + [ev(done, {"response": final})]


def _tool_item_events(ev: EventWriter, c: ToolCall, tools: ResponseTools, index: int) -> list[str]:
    done = tool_item(c, tools)
    added = tool_item(c, tools, "in_progress")
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
                    "name": done["name"],
                    "arguments": done["arguments"],
                },
            ),
        ]
    return lines + [ev("response.output_item.done", {"output_index": index, "item": done})]


def _store(turn: Turn, call: Call, text: str, end: Answer) -> None:
    if turn.body.store is not False:
        reply = ChatMessage(role="assistant", content=text, tool_calls=end.calls)
        call.gw.stored.put(f"resp_{call.id}", turn.conversation + [reply])


def body(turn: Turn, call: Call, text: str, end: Answer) -> dict:
    _store(turn, call, text, end)
    output = output_items(call.id, text, end.calls, turn.tools)
    out = response_object(
        call.id,
        turn.body,
        status_of(end.done, end.calls),
        output,
        end.done,
        call.talaria(end.done),
    )
    out["output_text"] = text
    return out
