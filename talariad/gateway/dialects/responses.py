"""The OpenAI Responses endpoint (`POST /v1/responses`), the surface the Codex CLI speaks.

`input` items become the same internal messages as chat (`developer` is a system turn, tool-call
items and their `*_output` items are assistant tool calls and `tool` messages); function,
namespace and custom tools go into the prompt, hosted tools are dropped. Answers come back as
`message`, `function_call` and `custom_tool_call` output items, streamed as Responses events; a
tool of a namespace is answered by its name with the namespace in a field of its own, a tool of
Codex's default namespace (`functions`) by its bare name.
The full item and tool mapping: docs/internals.md.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from talariad.gateway.call import Answer, Call, CallSpec, TextPiece, answer
from talariad.gateway.errors import APIError
from talariad.gateway.schemas import body_field, parse_arguments, sent
from talariad.gateway.session import SESSION_FIELDS
from talariad.gateway.store import ResponseStore
from talariad.tools import arguments_json, function_tool
from talariad.wire.messages import ChatMessage, DoneEvent, ErrorEvent, StreamEvent, ToolCall

log = logging.getLogger("talariad.gateway")

CUSTOM_INPUT = {
    "type": "object",
    "required": ["input"],
    "properties": {"input": {"type": "string", "description": "the tool's free-form input"}},
}
"""Parameters a custom (free-form) tool is rendered with: its whole input as one string."""


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]] = Field(min_length=1)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    prompt_cache_key: str | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)

    def limit(self, default: int) -> int:
        return self.max_output_tokens or default

    def stop_list(self) -> list[str]:
        return []

    def include_usage(self) -> bool:
        return True


DEFAULT_NAMESPACE = "functions"
"""The namespace Codex puts its own client tools in (`exec`, `apply_patch`, `update_plan`): they
are top-level tools, so they are rendered and answered by their bare names."""


def rendered_name(namespace: str | None, name: str) -> str:
    """The name a tool has in the prompt: `namespace.name`, or the bare name outside a namespace
    and in the default one."""
    return f"{namespace}.{name}" if namespace and namespace != DEFAULT_NAMESPACE else name


class ResponseTools:
    """The request's tools as rendered, which names are custom (free-form) ones, and the
    (namespace, name) each namespaced rendered name answers with."""

    def __init__(self) -> None:
        self.defs: list[dict] = []
        self.custom: set[str] = set()
        self.namespaced: dict[str, tuple[str, str]] = {}
        self.dropped: list[str] = []

    def add(self, tool: Any, where: str, namespace: str | None = None) -> None:
        if not isinstance(tool, dict):
            raise APIError(
                400, f"invalid parameter {where!r}: a tool must be an object", param=where
            )
        kind = tool.get("type")
        if kind == "namespace":
            self._name(tool, where)
            inner_ns = rendered_name(namespace, tool["name"]) if namespace else tool["name"]
            for j, inner in enumerate(_list(tool, "tools", where)):
                self.add(inner, f"{where}.tools.{j}", inner_ns)
        elif kind == "function":
            fn = (
                tool.get("function") if isinstance(tool.get("function"), dict) else tool
            )  # chat-style nesting too
            self._name(fn, where)
            name = self._rendered(namespace, fn["name"])
            self.defs.append(function_tool(name, fn.get("description"), fn.get("parameters")))
        elif kind == "custom":
            self._name(tool, where)
            name = self._rendered(namespace, tool["name"])
            self.custom.add(name)
            self.defs.append(function_tool(name, tool.get("description"), CUSTOM_INPUT))
        else:  # hosted tools (web_search, file_search, ...) run at OpenAI, not here
            self.dropped.append(str(kind))

    def _rendered(self, namespace: str | None, name: str) -> str:
        rendered = rendered_name(namespace, name)
        if rendered != name:
            self.namespaced[rendered] = (namespace or "", name)
        return rendered

    @staticmethod
    def _name(tool: dict, where: str) -> None:
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise APIError(
                400,
                f"missing required parameter: '{where}.name'",
                param=f"{where}.name",
                code="missing_parameter",
            )


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"]
            for p in content
            if isinstance(p, dict)
            and p.get("type") in ("input_text", "output_text", "text")
            and isinstance(p.get("text"), str)
        )
    return ""


def _assistant(out: list[ChatMessage]) -> ChatMessage:
    """The assistant turn a tool call belongs to (the last one, or a new one)."""
    if not out or out[-1].role != "assistant":
        out.append(ChatMessage(role="assistant", content=""))
    return out[-1]


def convert(body: ResponsesRequest) -> tuple[list[ChatMessage], ResponseTools]:
    """The request's conversation as internal messages, and its tools."""
    tools = ResponseTools()
    for i, t in enumerate(body.tools or []):
        tools.add(t, f"tools.{i}")
    out = [ChatMessage(role="system", content=body.instructions)] if body.instructions else []
    if isinstance(body.input, str):
        return out + [ChatMessage(role="user", content=body.input)], tools
    names: dict[str, str] = {}
    for i, item in enumerate(body.input):
        _item(item, f"input.{i}", out, tools, names)
    if not out:
        raise APIError(400, "invalid parameter 'input': no message to answer", param="input")
    return out, tools


def _item(
    item: dict, where: str, out: list[ChatMessage], tools: ResponseTools, names: dict[str, str]
) -> None:
    kind = _string(item, "type", where) or ("message" if "role" in item else None)
    if kind == "message":
        role = _string(item, "role", where)
        role = {"developer": "system"}.get(role, role)
        if role not in ("system", "user", "assistant"):
            raise APIError(
                400,
                f"invalid parameter '{where}.role': {item.get('role')!r}",
                param=f"{where}.role",
            )
        out.append(ChatMessage(role=role, content=_text(item.get("content"))))
    elif kind in ("function_call", "custom_tool_call"):
        call_id = _string(item, "call_id", where) or _string(item, "id", where)
        name = _string(item, "name", where)
        if not name:
            raise APIError(
                400,
                f"missing required parameter: '{where}.name'",
                param=f"{where}.name",
                code="missing_parameter",
            )
        name = rendered_name(_string(item, "namespace", where) or None, name)
        names[call_id] = name
        args = (
            parse_arguments(_arguments(item, where))
            if kind == "function_call"
            else {"input": item.get("input", "")}
        )
        _assistant(out).tool_calls.append(ToolCall(id=call_id, name=name, arguments=args))
    elif kind in ("function_call_output", "custom_tool_call_output"):
        call_id = _string(item, "call_id", where)
        out.append(
            ChatMessage(
                role="tool",
                content=_text(item.get("output")),
                tool_call_id=call_id,
                name=names.get(call_id),
            )
        )
    elif kind == "additional_tools":
        for j, t in enumerate(_list(item, "tools", where)):
            tools.add(t, f"{where}.tools.{j}")
    elif kind is None:
        raise APIError(
            400, f"invalid parameter {where!r}: an input item needs a `type`", param=where
        )
    else:  # reasoning and items of hosted tools carry nothing the model reads back
        log.debug("dropped input item of type %s", kind)


def _string(item: dict, key: str, where: str) -> str:
    """`item[key]` when it is a string, "" when absent or null; anything else is the client's 400."""
    value = item.get(key)
    if value is None or isinstance(value, str):
        return value or ""
    raise _wrong_type(f"{where}.{key}", "a string")


def _list(item: dict, key: str, where: str) -> list:
    value = item.get(key)
    if value is None or isinstance(value, list):
        return value or []
    raise _wrong_type(f"{where}.{key}", "an array")


def _arguments(item: dict, where: str) -> str | dict:
    value = item.get("arguments")
    if value is None or isinstance(value, str | dict):
        return value or ""
    raise _wrong_type(f"{where}.arguments", "a string or an object")


def _wrong_type(param: str, expected: str) -> APIError:
    return APIError(
        400, f"invalid parameter {param!r}: must be {expected}", param=param, code="invalid_value"
    )


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


# ---- the call: spec, stream, body ----------------------------------------------------------------


@dataclass(slots=True)
class Turn:
    """What rendering a Responses answer needs beyond the call: the body, the conversation the
    store keeps, and the request's tools (which are custom, which are in a namespace)."""

    body: ResponsesRequest
    conversation: list[ChatMessage]
    tools: ResponseTools


def spec(body: ResponsesRequest, stored: ResponseStore) -> tuple[CallSpec, Turn]:
    messages, tools = convert(body)
    if body.previous_response_id:
        messages = stored.get(body.previous_response_id) + messages
    if body.tool_choice == "none":
        tools.defs = []
    call = CallSpec(
        api="responses",
        requested=body.model,
        messages=messages,
        tools=tools.defs,
        max_tokens=body.limit(0) or None,
        temperature=sent(body, "temperature"),
        top_p=sent(body, "top_p"),
        seed=body.seed,
        ignore_eos=body_field(body, "ignore_eos", False),
        stream=body.stream,
        session_fields={k: body_field(body, k) for k in SESSION_FIELDS},
    )
    return call, Turn(body, messages, tools)


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
