"""OpenAI Completions (`POST /v1/completions`): one prompt, rendered as it is; the answer as one
`text_completion` or as its events."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from pydantic import field_validator

from talariad.gateway.call import Answer, Call, CallSpec, TextPiece, answer, sse
from talariad.gateway.dialects.chat import error_event, openai_spec, usage
from talariad.gateway.schemas import SamplingBody
from talariad.wire.messages import ChatMessage, StreamEvent


class CompletionRequest(SamplingBody):
    prompt: str | list[str]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and len(v) != 1:
            raise ValueError("exactly one prompt is supported")
        return v

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def limit(self, default: int) -> int:
        return self.max_tokens or default


def spec(body: CompletionRequest) -> CallSpec:
    prompt = body.text()
    return openai_spec(body, [ChatMessage(role="user", content=prompt)], prompt)


def chunk(call: Call, delta: dict, finish: str | None) -> dict:
    return {
        "id": f"cmpl-{call.id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": call.spec.requested,
        "choices": [{"index": 0, "text": delta.get("content", ""), "finish_reason": finish}],
    }


async def stream(call: Call, first: StreamEvent, rest: AsyncIterator[StreamEvent]):
    async for item in answer(call, first, rest):
        if isinstance(item, TextPiece):
            yield sse(chunk(call, {"content": str(item)}, None))
        elif isinstance(item, Answer):
            yield sse(chunk(call, {}, item.done.finish_reason))
            if call.spec.include_usage:
                yield sse({**chunk(call, {}, None), "choices": [], "usage": usage(call, item.done)})
        else:
            yield sse(error_event(item))
    yield sse("[DONE]")


def body(call: Call, text: str, end: Answer) -> dict:
    return {
        "id": f"cmpl-{call.id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": call.spec.requested,
        "usage": usage(call, end.done),
        "choices": [{"index": 0, "text": text, "finish_reason": end.done.finish_reason}],
    }
