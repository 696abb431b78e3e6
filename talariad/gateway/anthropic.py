"""The Anthropic Messages endpoint (`POST /v1/messages`), the surface Claude Code speaks.

Bodies are translated to the same internal call as chat completions; answers and errors come
back in Anthropic's shapes (named SSE events, `cache_read_input_tokens`, `{"type": "error"}`).
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from talariad.engine.messages import DoneEvent, TokenEvent

STOP_REASONS = {"length": "max_tokens", "stop": "end_turn"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error"}


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Block(_Open):
    type: str
    text: str | None = None
    name: str | None = None
    input: Any = None
    content: str | list[dict] | None = None

    def flat(self) -> str:
        if self.type == "text":
            return self.text or ""
        if self.type == "tool_use":
            return f"[tool_use {self.name}: {json.dumps(self.input)}]"
        if self.type == "tool_result":
            if isinstance(self.content, list):
                return "".join(c.get("text", "") for c in self.content if isinstance(c, dict))
            return self.content or ""
        return ""


class AnthropicMessage(_Open):
    role: Literal["user", "assistant"]
    content: str | list[Block]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(b.flat() for b in self.content)


class MessagesRequest(_Open):
    model: str = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[Block] | None = None
    temperature: float = Field(default=1.0, ge=0, le=1)
    top_p: float = Field(default=1.0, gt=0, le=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)

    def chat(self) -> list[tuple[str, str]]:
        system = self.system if isinstance(self.system, str) else "".join(b.flat() for b in self.system or [])
        head = [("system", system)] if system else []
        return head + [(m.role, m.text()) for m in self.messages]

    def limit(self, default: int) -> int:
        return self.max_tokens

    def stop_list(self) -> list[str]:
        return list(self.stop_sequences or [])

    def include_usage(self) -> bool:
        return True


def usage(done: DoneEvent) -> dict:
    u = done.usage
    return {"input_tokens": u.prompt_tokens - u.cached_tokens, "output_tokens": u.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": u.cached_tokens}


def message_body(call_id: str, model: str, text: str, done: DoneEvent) -> dict:
    return {"id": f"msg_{call_id}", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}], "stop_reason": STOP_REASONS[done.finish_reason],
            "stop_sequence": None, "usage": usage(done)}


def event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n"


def error_body(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def start_events(call_id: str, model: str, estimated_input: int) -> list[str]:
    message = {"id": f"msg_{call_id}", "type": "message", "role": "assistant", "model": model, "content": [],
               "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": estimated_input, "output_tokens": 0}}
    return [event("message_start", {"message": message}),
            event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
            event("ping", {})]


def token_event(ev: TokenEvent) -> str:
    return event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": ev.text}})


def end_events(done: DoneEvent) -> list[str]:
    return [event("content_block_stop", {"index": 0}),
            event("message_delta", {"delta": {"stop_reason": STOP_REASONS[done.finish_reason], "stop_sequence": None},
                                    "usage": usage(done)}),
            event("message_stop", {})]


def created() -> int:
    return int(time.time())
