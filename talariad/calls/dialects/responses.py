"""The OpenAI Responses endpoint (`POST /v1/responses`), the surface the Codex CLI speaks: the
body and its `CallSpec` (the answer, as Responses items and events: `gateway/dialects/responses.py`).

`input` items become the same internal messages as chat (`developer` is a system turn, tool-call
items and their `*_output` items are assistant tool calls and `tool` messages); function,
namespace and custom tools go into the prompt, hosted tools are dropped; a tool of a namespace is
rendered as `namespace.name`, a tool of Codex's default namespace (`functions`) by its bare name.
The full item and tool mapping: docs/internals.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from talariad.calls.errors import APIError
from talariad.calls.schemas import parse_arguments
from talariad.calls.spec import CallSpec, body_spec
from talariad.calls.store import ResponseStore
from talariad.tools import function_tool
from talariad.wire.messages import ChatMessage, ToolCall

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


def convert(
    body: ResponsesRequest, read: ItemsRead | None = None
) -> tuple[list[ChatMessage], ResponseTools]:
    """The request's conversation as internal messages, and its tools; `read`, when given, is
    told how the items were converted (`calls.reading` continues the conversation from it)."""
    tools = ResponseTools()
    for i, t in enumerate(body.tools or []):
        tools.add(t, f"tools.{i}")
    out = [ChatMessage(role="system", content=body.instructions)] if body.instructions else []
    if isinstance(body.input, str):
        return out + [ChatMessage(role="user", content=body.input)], tools
    names: dict[str, str] = {} if read is None else read.names
    if read is not None:
        read.lead = len(out)
    for i, item in enumerate(body.input):
        _item(item, f"input.{i}", out, tools, names)
        if read is not None:
            read.counts.append(len(out))
            read.tools_changed = read.tools_changed or item.get("type") == "additional_tools"
    if not out:
        raise APIError(400, "invalid parameter 'input': no message to answer", param="input")
    return out, tools


@dataclass(slots=True)
class ItemsRead:
    """How `convert` read a body's input items: the messages before them (the instructions'
    turn), the messages converted up to each item (those included), the tool calls named so far
    (call id -> rendered name), and whether an item changed the tools (`additional_tools`)."""

    lead: int = 0
    counts: list[int] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)
    tools_changed: bool = False


def convert_item(item: dict, out: list[ChatMessage], names: dict[str, str]) -> bool:
    """One more input item converted onto `out` as `convert` converts it (a tool call joins the
    assistant turn `out` ends with); False, and nothing converted, for an item that changes the
    tools. Raises the APIError `convert` would."""
    if item.get("type") == "additional_tools":
        return False
    _item(item, "input", out, ResponseTools(), names)
    return True


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


@dataclass(slots=True)
class Turn:
    """What rendering a Responses answer needs beyond the call: the body, the conversation the
    store keeps, and the request's tools (which are custom, which are in a namespace)."""

    body: ResponsesRequest
    conversation: list[ChatMessage]
    tools: ResponseTools


def spec(
    body: ResponsesRequest, stored: ResponseStore, read: ItemsRead | None = None
) -> tuple[CallSpec, Turn]:
    messages, tools = convert(body, read)
    if body.previous_response_id:
        messages = stored.get(body.previous_response_id) + messages
    if body.tool_choice == "none":
        tools.defs = []
    call = body_spec("responses", body, messages, tools=tools.defs)
    return call, Turn(body, messages, tools)
