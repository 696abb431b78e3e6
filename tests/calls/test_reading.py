"""The picker's cheap read of a body (`calls.reading`) and the box's whole read (`routes.parse`,
`spec.canonical_prompt`) agree on what a call is: its model, its session, its branch and its
prompt, for a conversation's every call in every dialect; a body the dialect refuses gets the
whole read's 400."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talariad.calls import routes
from talariad.calls.branches import PrefixBranches
from talariad.calls.errors import APIError
from talariad.calls.reading import BodyReader
from talariad.calls.session import session_id
from talariad.calls.spec import canonical_prompt

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
SMALL = 300  # keep bodies this small and up (the reader's floor is lowered to it below)


def _tool_call(i: int, name: str, args: str) -> dict:
    return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": args}}


@st.composite
def chat_turn(draw, i: int) -> dict:
    kind = draw(st.sampled_from(["user", "assistant", "tool", "parts", "system"]))
    text = draw(TEXT)
    if kind == "assistant" and draw(st.booleans()):
        args = draw(st.sampled_from(["{}", '{"a": 1}', "not json", ""]))
        return {"role": "assistant", "content": None, "tool_calls": [_tool_call(i, "run", args)]}
    if kind == "tool":
        return {"role": "tool", "tool_call_id": f"c{i}", "content": text}
    if kind == "parts":
        return {"role": "user", "content": [{"type": "text", "text": text}, {"type": "image"}]}
    return {"role": kind, "content": text}


@st.composite
def anthropic_turn(draw, i: int) -> dict:
    role = draw(st.sampled_from(["user", "assistant"]))
    text = draw(TEXT)
    kind = draw(st.sampled_from(["text", "blocks", "tool_use", "tool_result"]))
    if kind == "text":
        return {"role": role, "content": text}
    if kind == "tool_use":
        use = {"type": "tool_use", "id": f"t{i}", "name": "Bash", "input": {"cmd": text}}
        return {"role": "assistant", "content": [{"type": "text", "text": text}, use]}
    if kind == "tool_result":
        result = {"type": "tool_result", "tool_use_id": f"t{i - 1}", "content": text}
        return {"role": "user", "content": [result, {"type": "text", "text": "go on"}]}
    block = {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}
    return {"role": role, "content": [block]}


SYSTEM = "You are a coding agent working in a repository. " * 8


def _chat_body(turns: list[dict], extra: dict, first: bool) -> dict:
    body = {"model": "m", "messages": [{"role": "system", "content": SYSTEM}, *turns]}
    if first:  # OpenAI's SDK puts the messages first, others after the model
        body = {"messages": body["messages"], "model": "m"}
    return {**body, **extra}


def _anthropic_body(turns: list[dict], extra: dict, first: bool) -> dict:
    msgs = [{"role": "user", "content": SYSTEM}, *turns]
    body = {"model": "m", "max_tokens": 64, "messages": msgs} if first else {"messages": msgs}
    body.update(extra)
    body.setdefault("model", "m")
    body.setdefault("max_tokens", 64)
    return body


EXTRAS = st.fixed_dictionaries(
    {},
    optional={
        "tools": st.just(
            [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]
        ),
        "user": st.sampled_from(["u1", "alice_session_s9"]),
        "temperature": st.sampled_from([0.0, 0.5]),
        "max_tokens": st.integers(1, 99),
    },
)
ANTHROPIC_EXTRAS = st.fixed_dictionaries(
    {},
    optional={
        "system": st.sampled_from(["Be brief.", "Be terse."]),
        "tools": st.just([{"name": "Bash", "input_schema": {"type": "object"}}]),
        "metadata": st.just({"user_id": "x_session_abc"}),
        "stream": st.booleans(),
    },
)


def _full(path: str, raw: bytes):
    spec = routes.parse(path, raw)
    assert spec is not None
    return spec, canonical_prompt(spec.messages, spec.prompt, spec.tools)


def _same(path: str, raw: bytes, reader: BodyReader, branches: tuple[PrefixBranches, ...]):
    """The reader's read of `raw` equals the whole read: model, limit, session, turns, prompt,
    and the branch a picker and a box name from it."""
    spec, prompt = reader.read(path, raw)  # type: ignore[misc]
    full, full_prompt = _full(path, raw)
    assert (spec.requested, spec.max_tokens, spec.stream) == (
        full.requested,
        full.max_tokens,
        full.stream,
    )
    assert spec.session_fields == full.session_fields and spec.tools == full.tools
    assert [(m.role, m.content) for m in spec.messages] == [
        (m.role, m.content) for m in full.messages
    ]
    assert (prompt.text, prompt.head, prompt.first, prompt.thread) == (
        full_prompt.text,
        full_prompt.head,
        full_prompt.first,
        full_prompt.thread,
    )
    turns = [(m.role, m.content) for m in full.messages]
    session = session_id({}, full.session_fields, turns)
    assert session_id({}, spec.session_fields, [(m.role, m.content) for m in spec.messages]) == (
        session
    )
    picker, box = branches
    assert picker.branched(session, "m", prompt) == box.branched(session, "m", full_prompt)


def _conversation(draw, turn, body_of, extras) -> list[bytes]:
    """A conversation's successive bodies: each resends the last with more turns; now and then
    the last turn is rewritten (a cache marker moved), the other fields change, or the
    conversation forks from an earlier point (a sub-agent, a retry)."""
    turns: list[dict] = []
    extra, first = draw(extras), draw(st.booleans())
    out = []
    for i in range(draw(st.integers(1, 8))):
        step = draw(st.sampled_from(["more", "more", "rewrite", "fields", "fork"]))
        if step == "rewrite" and turns:
            turns[-1] = draw(turn(i))
        elif step == "fields":
            extra = draw(extras)
        elif step == "fork" and turns:
            turns = turns[: draw(st.integers(0, len(turns) - 1))]
        turns += draw(st.lists(turn(i), min_size=1, max_size=3))
        indent = draw(st.sampled_from([None, None, 1]))
        out.append(json.dumps(body_of(turns, extra, first), indent=indent).encode())
    return out


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_the_cheap_read_of_a_chat_conversation_is_the_whole_read(data):
    reader, branches = BodyReader(min_bytes=SMALL), (PrefixBranches(4), PrefixBranches(4))
    for raw in _conversation(data.draw, chat_turn, _chat_body, EXTRAS):
        _same("/v1/chat/completions", raw, reader, branches)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_the_cheap_read_of_a_messages_conversation_is_the_whole_read(data):
    reader, branches = BodyReader(min_bytes=SMALL), (PrefixBranches(4), PrefixBranches(4))
    for raw in _conversation(data.draw, anthropic_turn, _anthropic_body, ANTHROPIC_EXTRAS):
        _same("/v1/messages", raw, reader, branches)


@settings(max_examples=50, deadline=None)
@given(st.lists(TEXT.filter(bool), min_size=1, max_size=5), st.booleans())
def test_responses_and_completions_are_read_whole_alike(texts, listed):
    reader, branches = BodyReader(min_bytes=SMALL), (PrefixBranches(4), PrefixBranches(4))
    items = [{"type": "message", "role": "user", "content": t} for t in texts]
    for n in range(1, len(items) + 1):
        body = {"model": "m", "instructions": SYSTEM, "input": items[:n] if listed else texts[0]}
        _same("/v1/responses", json.dumps(body).encode(), reader, branches)
        prompt = SYSTEM + "".join(texts[:n])
        _same(
            "/v1/completions",
            json.dumps({"model": "m", "prompt": prompt}).encode(),
            reader,
            branches,
        )


def test_a_return_reads_only_its_new_messages():
    reader = BodyReader()
    turns = [{"role": "user", "content": SYSTEM * 40}]
    for i in range(5):
        turns += [{"role": "assistant", "content": f"step {i}"}, {"role": "user", "content": "ok"}]
        reader.read("/v1/chat/completions", json.dumps({"model": "m", "messages": turns}).encode())
    assert reader.continued == 4


BAD_TURNS = [
    {"role": "robot", "content": "hi"},
    {"role": "user", "content": 5},
    {"role": "assistant", "tool_calls": [{"function": {"name": ""}}]},
    {"role": "user", "content": [{"text": "no type"}]},
]


@pytest.mark.parametrize("bad", BAD_TURNS)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_a_continued_body_the_dialect_refuses_gets_the_whole_reads_400(bad, path):
    reader = BodyReader(min_bytes=SMALL)
    body = _anthropic_body if path == "/v1/messages" else _chat_body
    good = [{"role": "user", "content": "fix it"}, {"role": "assistant", "content": "done"}]
    reader.read(path, json.dumps(body(good, {}, False)).encode())
    for raw in (
        json.dumps(body([*good, bad], {}, False)).encode(),
        json.dumps(body([*good, bad], {"temperature": 9}, False)).encode(),
        json.dumps(body(good, {}, False)).encode()[:-1] + b', "model": 3}',
        json.dumps(body(good, {}, False)).encode()[:-1] + b', "messages": []}',
        json.dumps(body([*good, {"role": "user", "content": "x"}], {}, False)).encode() + b"]",
    ):
        with pytest.raises(APIError) as whole:
            routes.parse(path, raw)
        with pytest.raises(APIError) as cheap:
            reader.read(path, raw)
        assert (cheap.value.status, cheap.value.message) == (
            whole.value.status,
            whole.value.message,
        )
