"""One tool layer for the three APIs (Anthropic Messages, OpenAI chat, OpenAI Responses).

Tool definitions travel to the instance in the chat-template form (`{"type": "function",
"function": {name, description, parameters}}`, what Hugging Face templates accept as `tools`);
the model's text comes back through a per-family parser (`models[].tool_parser`) that splits it
into plain text and `ToolCall`s. `ToolStream` does the same on a stream: text before a tool-call
marker flows through at once; from the marker on it is held and parsed when the call ends.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Protocol

from talariad.types import ToolCall


def function_tool(name: str, description: str | None, parameters: Any) -> dict[str, Any]:
    """A tool definition in the chat-template form."""
    schema = parameters if isinstance(parameters, dict) else {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": name, "description": description or "", "parameters": schema},
    }


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def call_from_json(obj: Any) -> ToolCall | None:
    """`{"name": ..., "arguments" | "parameters": ...}` as a ToolCall; None if it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            pass
    if not isinstance(args, (dict, str)):
        return None
    return ToolCall(id=new_call_id(), name=obj["name"], arguments=args)


def arguments_json(call: ToolCall) -> str:
    """The arguments as the JSON text OpenAI and Anthropic stream (a free-form input stays as is)."""
    return call.arguments if isinstance(call.arguments, str) else _encode(call.arguments)


_encode = json.JSONEncoder(ensure_ascii=False).encode
"""`json.dumps(..., ensure_ascii=False)` without a new encoder a call (the canonical text writes
every tool call of a conversation: a tenth of a new agent body's read)."""


class ToolParser(Protocol):
    def parse(self, text: str) -> tuple[str, list[ToolCall]] | None:
        """The text outside tool calls and the calls; None when `text` holds no well-formed call."""

    def holds(self, text: str) -> tuple[int, bool] | None:
        """Where a tool call may begin in streamed `text` (held from there on) and whether it surely
        does (everything after is held then, unseen); None: nothing to hold."""


class HermesParser:
    """Qwen / Hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number of them."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    _CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)

    def parse(self, text: str) -> tuple[str, list[ToolCall]] | None:
        if self.OPEN not in text:
            return None
        calls = []
        for m in self._CALL.finditer(text):
            try:
                call = call_from_json(json.loads(m.group(1)))
            except ValueError:
                return None
            if call is None:
                return None
            calls.append(call)
        rest = self._CALL.sub("", text).strip()
        return rest, calls

    def holds(self, text: str) -> tuple[int, bool] | None:
        at = text.find(self.OPEN)
        if at >= 0:
            return at, True
        # a partial marker at the end may still become one
        return next(
            (
                (len(text) - n, False)
                for n in range(len(self.OPEN) - 1, 0, -1)
                if text.endswith(self.OPEN[:n])
            ),
            None,
        )


class Llama3JsonParser:
    """Llama 3 JSON tool calls: the whole answer is `{"name": ..., "parameters": {...}}` (several
    separated by `;`), optionally after `<|python_tag|>`."""

    TAG = "<|python_tag|>"

    def parse(self, text: str) -> tuple[str, list[ToolCall]] | None:
        body = text.strip().removeprefix(self.TAG).strip()
        if not body.startswith("{"):
            return None
        calls = []
        decoder = json.JSONDecoder()
        pos = 0
        while pos < len(body):
            try:
                obj, end = decoder.raw_decode(body, pos)
            except ValueError:
                return None
            call = call_from_json(obj)
            if call is None:
                return None
            calls.append(call)
            pos = end
            while pos < len(body) and body[pos] in " \t\r\n;":
                pos += 1
        return "", calls

    def holds(self, text: str) -> tuple[int, bool] | None:
        head = text.lstrip()
        if not head:
            return (0, False) if text else None
        if head.startswith("{") or head.startswith(self.TAG):
            return 0, True
        return (0, False) if self.TAG.startswith(head) else None


PARSERS: dict[str, ToolParser] = {"hermes": HermesParser(), "llama3_json": Llama3JsonParser()}


def parse(parser: str, text: str) -> tuple[str, list[ToolCall]]:
    """Split a finished answer into text and tool calls (text unchanged when it holds none)."""
    found = PARSERS[parser].parse(text)
    return (text, []) if found is None else found


class ToolStream:
    """A streamed answer split into text to emit now and the tool calls found at the end."""

    def __init__(self, parser: str, enabled: bool) -> None:
        self.parser, self.enabled = PARSERS[parser], enabled
        self.text = ""
        self.emitted = 0
        self.calling = False
        """A tool call has surely begun: the rest is held for `finish` without looking at it again."""

    def push(self, piece: str) -> str:
        self.text += piece
        if not self.enabled:
            return self._take(len(self.text))
        if self.calling:
            return ""
        held = self.parser.holds(self.text[self.emitted :])
        if held is None:
            return self._take(len(self.text))
        self.calling = held[1]
        return self._take(self.emitted + held[0])

    def finish(self) -> tuple[str, list[ToolCall]]:
        """What is left to emit as text, and the tool calls (held text that parses as none is text)."""
        rest = self.text[self.emitted :]
        if self.enabled and rest:
            found = self.parser.parse(rest)
            if found is not None:
                self.emitted = len(self.text)
                return found
        return self._take(len(self.text)), []

    def _take(self, end: int) -> str:
        piece = self.text[self.emitted : end]
        self.emitted = max(self.emitted, end)
        return piece
