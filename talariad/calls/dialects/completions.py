"""OpenAI Completions (`POST /v1/completions`): one prompt, rendered as it is (the answer is the
gateway's: `gateway/dialects/completions.py`)."""

from __future__ import annotations

from pydantic import field_validator

from talariad.calls.schemas import SamplingBody
from talariad.calls.spec import CallSpec, body_spec
from talariad.wire.messages import ChatMessage


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
    return body_spec("openai", body, [ChatMessage(role="user", content=prompt)], prompt=prompt)
