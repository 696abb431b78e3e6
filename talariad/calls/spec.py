"""A call as every API says it (`CallSpec`, which a dialect parses its body into), its prompt as
canonical text, and its plan: session, branch and the router's request, the same at a box's
gateway and at the pool's picker."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic_core import PydanticSerializationError, to_json

from talariad.calls import template
from talariad.calls.branches import PrefixBranches, Prompt, thread_key
from talariad.calls.schemas import body_field, sent
from talariad.calls.session import SESSION_FIELDS, session_headers, session_id, session_turns
from talariad.router import CallRequest
from talariad.tools import arguments_json
from talariad.wire.messages import ChatMessage, ToolCall


@dataclass(slots=True)
class CallSpec:
    """A call as every API says it: what the lifecycle needs from the body, read once."""

    api: str
    """openai | anthropic | responses: which model fallback and error wording apply."""
    requested: str
    """The model id the client sent (answers echo it)."""
    messages: list[ChatMessage]
    prompt: str | None = None
    """/v1/completions: the raw prompt text, rendered as it is."""
    tools: list[dict] = field(default_factory=list)
    max_tokens: int | None = None
    """The client's output limit; None: the model's default."""
    temperature: float | None = None
    """None: the client sent none (the model's configured default applies, else 1.0)."""
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    stream: bool = False
    include_usage: bool = True
    session_fields: Mapping[str, Any] = field(default_factory=dict)
    """Body fields that may name the session (`session.SESSION_FIELDS`)."""
    context_error: Callable[[int, int, int], str] | None = None
    """The dialect's wording for a prompt that does not fit: (prompt, max_tokens, limit)."""


class Body(Protocol):
    """What every API's parsed body answers alike (`calls/dialects/`)."""

    model: str
    seed: int | None
    stream: bool

    def limit(self, default: int) -> int: ...
    def stop_list(self) -> list[str]: ...
    def include_usage(self) -> bool: ...


def body_spec(
    api: str,
    body: Body,
    messages: list[ChatMessage],
    *,
    prompt: str | None = None,
    tools: list[dict] | None = None,
    context_error: Callable[[int, int, int], str] | None = None,
) -> CallSpec:
    """The spec of a parsed body: its dialect reads the messages and tools, the rest every body
    names alike (model, limit, sampling, stream, the fields that may name the session)."""
    return CallSpec(
        api=api,
        requested=body.model,
        messages=messages,
        prompt=prompt,
        tools=[] if tools is None else tools,
        max_tokens=body.limit(0) or None,
        temperature=sent(body, "temperature"),
        top_p=sent(body, "top_p"),
        seed=body.seed,
        stop=body.stop_list(),
        ignore_eos=body_field(body, "ignore_eos", False),
        stream=body.stream,
        include_usage=body.include_usage(),
        session_fields={k: body_field(body, k) for k in SESSION_FIELDS},
        context_error=context_error,
    )


def make_call_id() -> str:
    """24 random hex digits (as many as the uuid4 prefix they replace, at a fraction of its cost)."""
    return os.urandom(12).hex()


RESPONSE_ID_PREFIXES = ("chatcmpl-", "cmpl-", "msg_", "resp_")
"""What each API puts before the call id in the answer's `id` (chat, completions, messages, and
the Responses API's response and its message item)."""

CALL_ID_HEADER = "x-talaria-call-id"
"""The box's answer names its call id here: the picker maps it to its own call's id."""


def bare_call_id(response_id: str) -> str:
    """The call id inside a response id the client saw (`chatcmpl-ID` -> `ID`); others as they are."""
    for prefix in RESPONSE_ID_PREFIXES:
        if response_id.startswith(prefix):
            return response_id[len(prefix) :]
    return response_id


def estimate_tokens(chars: int) -> int:
    return chars // 4 + 1


def canonical(messages: list[ChatMessage], prompt: str | None, tools: list[dict]) -> str:
    """The prompt as text for estimates and prefix matching (tools first, as templates put them)."""
    return canonical_prompt(messages, prompt, tools).text


def canonical_prompt(messages: list[ChatMessage], prompt: str | None, tools: list[dict]) -> Prompt:
    """`canonical`, with where its head (the tools and the leading system turns: what every
    branch of an agent shares) and its first conversation turn end, and a key of that turn."""
    if prompt is not None:
        return Prompt.raw(prompt)
    lines = canonical_lines(messages, tools)
    return prompt_of(
        "".join(lines), messages, lines[len(tools) :], sum(map(len, lines[: len(tools)]))
    )


def canonical_lines(messages: list[ChatMessage], tools: list[dict]) -> list[str]:
    """The canonical text's lines: one per tool, then one per message."""
    return template.lines(messages, tools, _tool_text, _call_text)


def prompt_of(text: str, messages: list[ChatMessage], lines: list[str], tools_len: int) -> Prompt:
    """The `Prompt` of canonical `text` whose tools take its first `tools_len` characters and
    whose messages' lines follow (`lines`: at least those up to the first conversation turn)."""
    at = next((i for i, m in enumerate(messages) if m.role not in _HEAD_ROLES), len(messages))
    head = tools_len + sum(map(len, lines[:at]))
    if at == len(messages):
        return Prompt(text, head, len(text))
    return Prompt(text, head, head + len(lines[at]), _thread(messages[at]))


_HEAD_ROLES = frozenset({"system", "developer"})


def _tool_text(tool: dict) -> str:
    """A tool's canonical text: its JSON with its keys sorted. An agent sends the same tools on
    every call (tens of KB of schemas), and sorting them was most of reading such a body: the
    text is kept by the tool's JSON as sent (`TOOL_TEXTS`)."""
    try:
        sent_as = to_json(tool)  # pydantic's encoder: a quarter of the sorting dump's time
    except PydanticSerializationError:  # a lone surrogate (from no body a dialect takes)
        return json.dumps(tool, sort_keys=True)
    return TOOL_TEXTS.text(sent_as, tool)


class ToolTexts:
    """Tools' canonical text kept by their JSON as sent, at most `max_bytes` of both in all: past
    that, all are let go and kept anew (an agent's tools come back at its next call)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.bytes = max_bytes, 0
        self._texts: dict[bytes, str] = {}

    def __len__(self) -> int:
        return len(self._texts)

    def text(self, sent_as: bytes, tool: dict) -> str:
        text = self._texts.get(sent_as)
        if text is None:
            text = json.dumps(tool, sort_keys=True)
            size = len(sent_as) + len(text)
            if size > self.max_bytes:  # past the bound alone: not kept, and nothing let go
                return text
            if self.bytes + size > self.max_bytes:
                self._texts.clear()
                self.bytes = 0
            self._texts[sent_as] = text
            self.bytes += size
        return text


TOOL_TEXTS = ToolTexts(8 << 20)
"""8 MB: about a hundred agents' tool lists (~40 KB each, kept as sent and sorted)."""


def _call_text(c: ToolCall) -> str:
    args = c.arguments
    if not isinstance(args, str):
        try:  # compact JSON: pydantic's encoder costs a tenth of the stdlib's on a small object
            args = to_json(args).decode()
        except PydanticSerializationError:  # a lone surrogate (from no body a dialect takes)
            args = arguments_json(c)
    return f"<tool_call>{c.name} {args}</tool_call>"


def _thread(m: ChatMessage) -> str:
    """A key of a conversation's first turn, from its length and ends (constant time)."""
    c = m.content
    return thread_key(m.role, len(c), c[:256], c[-256:])


def plan_call(
    call_id: str,
    spec: CallSpec,
    prompt: Prompt,
    headers: Mapping[str, str],
    branches: PrefixBranches,
    model: str,
    max_tokens: int,
    clamp_to: int | None,
    arrived: float | None = None,
) -> tuple[str, str, CallRequest]:
    """A call's session, its branch and the router's request for it, the same at a box's gateway
    and at the pool's picker. Lengths are estimates (4 characters a token of `prompt`); the
    instance counts exactly. `clamp_to`: the model's context, when the output limit is lowered
    to fit it rather than refused (the router then plans with what can fit). `arrived`: when the
    call reached the shell, on its clock (a lease is judged then)."""
    session = session_id(
        session_headers(headers), spec.session_fields, session_turns(spec.messages)
    )
    branch, covered, source = branches.branched(session, model, prompt)
    estimate = estimate_tokens(len(prompt.text))
    plan = max_tokens if clamp_to is None else max(1, min(max_tokens, clamp_to - estimate))
    reused = min(estimate_tokens(covered) if covered else 0, estimate)
    call = CallRequest(
        call_id, branch, model, estimate, reused, plan, arrived_at=arrived, prefix_of=source
    )
    return session, branch, call
