"""The Anthropic Messages endpoint (`POST /v1/messages`), the surface Claude Code speaks: the body
and its `CallSpec` (the answer, in Anthropic's shapes: `gateway/dialects/messages.py`).

Bodies are translated to the same internal call as chat completions. Accepted and not acted on:
`thinking` (no reasoning tokens are produced), `context_management`, `output_config` (the format
is not enforced), `cache_control` on any block (prefix reuse is automatic), `top_k`, `metadata`
(except the session in `user_id`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from talariad.calls.schemas import OpenBody
from talariad.calls.spec import CallSpec, body_spec
from talariad.tools import function_tool
from talariad.wire.messages import ChatMessage, ToolCall


class ContentBlock(OpenBody):
    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None
    content: str | list[dict] | None = None

    def flat(self) -> str:
        """The text of a text or tool_result block (other blocks carry none the model reads as text)."""
        if self.type == "text":
            return self.text or ""
        if self.type == "tool_result":
            if isinstance(self.content, list):
                return "".join(
                    c["text"]
                    for c in self.content
                    if isinstance(c, dict) and isinstance(c.get("text"), str)
                )
            return self.content or ""
        return ""


class AnthropicMessage(OpenBody):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]

    def chat(self, tool_names: dict[str, str]) -> list[ChatMessage]:
        """One or more internal messages: tool results become `tool` messages before the user's text."""
        if isinstance(self.content, str):
            return [ChatMessage(role=self.role, content=self.content)]
        blocks = self.content
        out = [
            ChatMessage(
                role="tool",
                content=b.flat(),
                tool_call_id=b.tool_use_id,
                name=tool_names.get(b.tool_use_id or ""),
            )
            for b in blocks
            if b.type == "tool_result"
        ]
        text = "".join(b.flat() for b in blocks if b.type == "text")
        calls = [
            ToolCall(
                id=b.id or "",
                name=b.name or "",
                arguments=b.input if isinstance(b.input, (dict, str)) else {},
            )
            for b in blocks
            if b.type == "tool_use"
        ]
        for c in calls:
            tool_names[c.id] = c.name
        if text or calls or not out:
            out.append(ChatMessage(role=self.role, content=text, tool_calls=calls))
        return out


class Tool(OpenBody):
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class MessagesRequest(OpenBody):
    model: str = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[ContentBlock] | None = None
    temperature: float = Field(default=1.0, ge=0, le=1)
    top_p: float = Field(default=1.0, gt=0, le=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    tools: list[Tool] | None = None
    tool_choice: dict[str, Any] | None = None

    def chat(self) -> list[ChatMessage]:
        out = self.system_messages()
        names: dict[str, str] = {}
        for m in self.messages:
            out += m.chat(names)
        return out

    def system_messages(self) -> list[ChatMessage]:
        """The `system` field as the conversation's leading system turn (none when empty)."""
        system = (
            self.system
            if isinstance(self.system, str)
            else "".join(b.flat() for b in self.system or [])
        )
        return [ChatMessage(role="system", content=system)] if system else []

    def tool_defs(self) -> list[dict]:
        """Client tools in the template form; server tools (no input schema) cannot run here."""
        if (self.tool_choice or {}).get("type") == "none":
            return []
        return [
            function_tool(t.name, t.description, t.input_schema)
            for t in self.tools or []
            if t.input_schema is not None
        ]

    def dropped_tools(self) -> list[str]:
        """Server tools (web search and the like) left out of the prompt."""
        return [t.type or t.name for t in self.tools or [] if t.input_schema is None]

    def limit(self, default: int) -> int:
        return self.max_tokens

    def stop_list(self) -> list[str]:
        return list(self.stop_sequences or [])

    def include_usage(self) -> bool:
        return True


class CountTokensRequest(MessagesRequest):
    max_tokens: int = Field(default=1, ge=1)


def context_message(prompt: int, max_tokens: int, limit: int) -> str:
    """Anthropic's wording of a call that does not fit, which Claude Code acts on: a prompt alone
    over the limit asks for compaction, prompt plus output a smaller `max_tokens`."""
    if prompt >= limit:
        return f"prompt is too long: {prompt} tokens > {limit} maximum"
    return (
        f"input length and `max_tokens` exceed context limit: {prompt} + {max_tokens} > {limit}, "
        f"decrease input length or `max_tokens` and try again"
    )


def spec(body: MessagesRequest) -> CallSpec:
    return spec_of(body, body.chat())


def spec_of(body: MessagesRequest, messages: list[ChatMessage]) -> CallSpec:
    """The spec of `body` with its messages converted (`calls.reading` converts a conversation's
    new messages only)."""
    tools = body.tool_defs()
    return body_spec("anthropic", body, messages, tools=tools, context_error=context_message)
