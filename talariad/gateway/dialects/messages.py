"""The Anthropic Messages endpoint (`POST /v1/messages`), the surface Claude Code speaks.

Bodies are translated to the same internal call as chat completions; answers and errors come
back in Anthropic's shapes (named SSE events, `tool_use` blocks, `cache_read_input_tokens`,
`{"type": "error"}`). Accepted and not acted on: `thinking` (no reasoning tokens are produced),
`context_management`, `output_config` (the format is not enforced), `cache_control` on any block
(prefix reuse is automatic), `top_k`, `metadata` (except the session in `user_id`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import Field

from talariad.gateway import limits
from talariad.gateway.call import Answer, Call, CallSpec, TextPiece, answer, canonical, make_call_id
from talariad.gateway.errors import anthropic_error_body as error_body
from talariad.gateway.schemas import OpenBody, body_field, sent
from talariad.gateway.session import SESSION_FIELDS
from talariad.tools import arguments_json, function_tool
from talariad.wire.messages import (
    ChatMessage,
    DoneEvent,
    GenerateRequest,
    StreamEvent,
    TokenEvent,
    ToolCall,
)


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
        system = (
            self.system
            if isinstance(self.system, str)
            else "".join(b.flat() for b in self.system or [])
        )
        out = [ChatMessage(role="system", content=system)] if system else []
        names: dict[str, str] = {}
        for m in self.messages:
            out += m.chat(names)
        return out

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


def context_message(prompt: int, max_tokens: int, limit: int) -> str:
    """Anthropic's wording of a call that does not fit, which Claude Code acts on: a prompt alone
    over the limit asks for compaction, prompt plus output a smaller `max_tokens`."""
    if prompt >= limit:
        return f"prompt is too long: {prompt} tokens > {limit} maximum"
    return (
        f"input length and `max_tokens` exceed context limit: {prompt} + {max_tokens} > {limit}, "
        f"decrease input length or `max_tokens` and try again"
    )


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


# ---- the call: spec, stream, body ----------------------------------------------------------------


def spec(body: MessagesRequest) -> CallSpec:
    return CallSpec(
        api="anthropic",
        requested=body.model,
        messages=body.chat(),
        tools=body.tool_defs(),
        max_tokens=body.max_tokens,
        temperature=sent(body, "temperature"),
        top_p=sent(body, "top_p"),
        seed=body.seed,
        stop=body.stop_list(),
        ignore_eos=body_field(body, "ignore_eos", False),
        stream=body.stream,
        session_fields={k: body_field(body, k) for k in SESSION_FIELDS},
        context_error=context_message,
    )


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
