"""The parts of OpenAI request bodies the dialects share (unknown fields are allowed, as OpenAI
clients send many)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import from_json

from talariad.wire.messages import ChatMessage, ToolCall


class OpenBody(BaseModel):
    """A request body part that keeps fields we do not model (clients send many we ignore)."""

    model_config = ConfigDict(extra="allow")


def sent(body: BaseModel, name: str) -> Any:
    """A declared field's value when the client sent it, else None (its default does not count)."""
    return getattr(body, name) if name in body.model_fields_set else None


def body_field(body: BaseModel, name: str, default: Any = None) -> Any:
    """A request body's field `name`, declared or extra, else `default`: what `getattr(body, name,
    default)` gives, without pydantic's attribute fallback, which raises and catches an
    AttributeError for each absent name (several per call at the edge)."""
    value = body.__dict__.get(name, _ABSENT)
    if value is _ABSENT:
        extra = body.__pydantic_extra__
        return extra.get(name, default) if extra else default
    return value


_ABSENT = object()


class ContentPart(OpenBody):
    type: str
    text: str | None = None


class FunctionCall(OpenBody):
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] = ""


class MessageToolCall(OpenBody):
    id: str = ""
    type: str = "function"
    function: FunctionCall


class Message(OpenBody):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text or "" for p in self.content if p.type in ("text", "input_text"))
        return self.content or ""

    def chat(self) -> ChatMessage:
        role = {"developer": "system", "function": "tool"}.get(self.role, self.role)
        calls = [
            ToolCall(id=c.id, name=c.function.name, arguments=parse_arguments(c.function.arguments))
            for c in self.tool_calls or []
        ]
        return ChatMessage(
            role=role,
            content=self.text(),
            tool_calls=calls,
            tool_call_id=self.tool_call_id,
            name=self.name if role == "tool" else None,
        )


def parse_json(text: str) -> Any:
    """JSON text found inside a request body, decoded as strictly as the body itself (pydantic's
    parser: no lone surrogate, nesting bounded); ValueError when it is not such JSON."""
    try:
        return from_json(text)
    except TypeError as err:  # text that cannot be encoded (a lone surrogate character)
        raise ValueError(str(err)) from None


def parse_arguments(arguments: str | dict[str, Any]) -> dict[str, Any] | str:
    """Tool-call arguments as the template wants them: a JSON object, or the text when it is not one."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = parse_json(arguments) if arguments else {}
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


class FunctionDef(OpenBody):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ChatTool(OpenBody):
    type: str = "function"
    function: FunctionDef | None = None


class StreamOptions(OpenBody):
    include_usage: bool = False


class SamplingBody(OpenBody):
    """What chat and completions bodies share: the model, sampling and streaming fields."""

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=1, description="only n=1 is supported")
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    prompt_cache_key: str | None = None
    ignore_eos: bool = False
    """vLLM's extension: generate `max_tokens` whatever the model's end of turn (replays use it)."""
    metadata: dict[str, Any] | None = None

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)
