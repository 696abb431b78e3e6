"""OpenAI Chat Completions (`POST /v1/chat/completions`): the body and its `CallSpec` (the answer
is the gateway's: `gateway/dialects/chat.py`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from talariad.calls.schemas import ChatTool, Message, SamplingBody
from talariad.calls.spec import CallSpec, body_spec
from talariad.tools import function_tool
from talariad.wire.messages import ChatMessage


class ChatCompletionRequest(SamplingBody):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[ChatTool] | None = None
    tool_choice: str | dict[str, Any] | None = None

    def limit(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default

    def tool_defs(self) -> list[dict]:
        if self.tool_choice == "none":
            return []
        return [
            function_tool(t.function.name, t.function.description, t.function.parameters)
            for t in self.tools or []
            if t.type == "function" and t.function is not None
        ]


def spec(body: ChatCompletionRequest) -> CallSpec:
    return spec_of(body, [m.chat() for m in body.messages])


def spec_of(body: ChatCompletionRequest, messages: list[ChatMessage]) -> CallSpec:
    """The spec of `body` with its messages converted (`calls.reading` converts a conversation's
    new messages only)."""
    return body_spec("openai", body, messages, tools=body.tool_defs())
