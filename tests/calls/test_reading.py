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
from talariad.calls.reading import _DIALECTS, BodyReader, _light
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


@st.composite
def responses_item(draw, i: int) -> dict:
    kind = draw(
        st.sampled_from(
            ["message", "message", "call", "output", "custom", "custom_output", "reasoning", "more"]
        )
    )
    text = draw(TEXT)
    if kind == "message":
        role = draw(st.sampled_from(["user", "assistant", "developer"]))
        parts = [{"type": "input_text" if role != "assistant" else "output_text", "text": text}]
        return {"type": "message", "role": role, "content": draw(st.sampled_from([text, parts]))}
    if kind == "call":
        args = draw(st.sampled_from(["{}", '{"a": 1}', "not json", ""]))
        return {"type": "function_call", "call_id": f"c{i}", "name": "shell", "arguments": args}
    if kind == "output":
        return {"type": "function_call_output", "call_id": f"c{i - 1}", "output": text}
    if kind == "custom":
        return {
            "type": "custom_tool_call",
            "call_id": f"p{i}",
            "name": "apply_patch",
            "input": text,
        }
    if kind == "custom_output":
        return {"type": "custom_tool_call_output", "call_id": f"p{i - 1}", "output": text}
    if kind == "more":  # tools added mid-conversation: such a conversation is read whole
        tool = {"type": "function", "name": f"extra{i}", "parameters": {"type": "object"}}
        return {"type": "additional_tools", "tools": [tool]}
    return {"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}


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


def _responses_body(items: list[dict], extra: dict, first: bool) -> dict:
    start = [{"type": "message", "role": "user", "content": SYSTEM}]
    body = {"model": "m", "input": [*start, *items]}
    if first:  # Codex sends its instructions before its input
        body = {"model": "m", "instructions": SYSTEM, "input": body["input"]}
    return {**body, **extra}


RESPONSES_EXTRAS = st.fixed_dictionaries(
    {},
    optional={
        "tools": st.just(
            [
                {"type": "function", "name": "shell", "parameters": {"type": "object"}},
                {"type": "custom", "name": "apply_patch"},
                {"type": "web_search"},
            ]
        ),
        "tool_choice": st.sampled_from(["auto", "none"]),
        "prompt_cache_key": st.sampled_from(["k1", "k2"]),
        "stream": st.booleans(),
    },
)
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
    # as text: a NaN a body may carry is no NaN's equal
    assert repr((spec.session_fields, spec.tools)) == repr((full.session_fields, full.tools))
    assert spec.messages == full.messages
    fields = ("api", "prompt", "temperature", "top_p", "seed", "stop", "ignore_eos")
    assert [getattr(spec, f) for f in fields] == [getattr(full, f) for f in fields]
    assert spec.include_usage == full.include_usage
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


CONVERSATIONS = {  # path: (a turn, the body of the turns, the body's other fields)
    "/v1/chat/completions": (chat_turn, _chat_body, EXTRAS),
    "/v1/messages": (anthropic_turn, _anthropic_body, ANTHROPIC_EXTRAS),
    "/v1/responses": (responses_item, _responses_body, RESPONSES_EXTRAS),
}


@pytest.mark.parametrize("path", CONVERSATIONS)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_the_cheap_read_of_a_conversation_is_the_whole_read(path, data):
    reader, branches = BodyReader(min_bytes=SMALL), (PrefixBranches(4), PrefixBranches(4))
    for raw in _conversation(data.draw, *CONVERSATIONS[path]):
        _same(path, raw, reader, branches)


def test_a_responses_fork_to_no_turn_at_all_gets_the_whole_reads_400():
    reader = BodyReader(min_bytes=SMALL)
    thought = {"type": "reasoning", "summary": [], "encrypted_content": "A" * SMALL}
    first = {"model": "m", "input": [thought, {"role": "user", "content": "hi"}]}
    reader.read("/v1/responses", json.dumps(first).encode())
    fork = json.dumps({"model": "m", "input": [thought, {"type": "reasoning", "summary": []}]})
    with pytest.raises(APIError) as whole:
        routes.parse("/v1/responses", fork.encode())
    with pytest.raises(APIError) as cheap:
        reader.read("/v1/responses", fork.encode())
    assert (cheap.value.status, cheap.value.message) == (whole.value.status, whole.value.message)


def test_a_responses_return_reads_only_its_new_items():
    reader = BodyReader()
    items: list[dict] = [{"type": "message", "role": "user", "content": SYSTEM * 40}]
    for i in range(5):
        call = {"type": "function_call", "call_id": f"c{i}", "name": "shell", "arguments": "{}"}
        items += [call, {"type": "function_call_output", "call_id": f"c{i}", "output": "ok"}]
        body = {"model": "m", "instructions": SYSTEM, "input": items}
        reader.read("/v1/responses", json.dumps(body).encode())
    assert reader.continued == 4


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


# --- a new body, read once without the dialect's message models (`reading._light`) ---------

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 3),
    st.floats(-1, 3, allow_nan=False),
    TEXT,
    st.just("0.5"),
    st.just([]),
    st.just({}),
    st.just([1]),
    st.just(["x"]),
)
"""Values of a kind a field may or may not take (the dialect coerces some, refuses others)."""


def _maybe(draw, good, junk=JUNK):
    """Mostly a well-formed value, now and then any value (or none)."""
    return draw(good) if draw(st.integers(0, 4)) else draw(junk)


@st.composite
def odd_chat_turn(draw, i: int) -> dict:
    turn = dict(draw(chat_turn(i)))
    for key, good in (
        ("role", st.sampled_from(["user", "developer", "function", "tool", "robot"])),
        ("name", st.sampled_from(["run", None])),
        ("tool_call_id", st.sampled_from([f"c{i}", None])),
    ):
        if draw(st.integers(0, 5)) == 0:
            turn[key] = _maybe(draw, good)
    if draw(st.integers(0, 3)) == 0:
        kinds = st.sampled_from(["text", "input_text", "image"])
        part = {"type": _maybe(draw, kinds), "text": draw(st.one_of(TEXT, JUNK))}
        part = {k: v for k, v in part.items() if draw(st.integers(0, 3))}
        turn["content"] = [part, {"type": "text", "text": "and"}]
    if draw(st.integers(0, 7)) == 0:
        function = {"name": _maybe(draw, st.just("run")), "arguments": _maybe(draw, TEXT)}
        call = {"id": _maybe(draw, st.just("c")), "function": function}
        turn["tool_calls"] = [call] if draw(st.booleans()) else _maybe(draw, st.just([call]))
    return turn


@st.composite
def odd_anthropic_turn(draw, i: int) -> dict:
    turn = dict(draw(anthropic_turn(i)))
    if draw(st.integers(0, 5)) == 0:
        turn["role"] = _maybe(draw, st.sampled_from(["user", "assistant", "system", "tool"]))
    if draw(st.booleans()):
        block = {
            "type": _maybe(draw, st.sampled_from(["text", "tool_use", "tool_result", "image"])),
            "text": _maybe(draw, TEXT),
            "id": _maybe(draw, st.just(f"t{i}")),
            "name": _maybe(draw, st.just("Bash")),
            "input": draw(JUNK),
            "tool_use_id": _maybe(draw, st.just(f"t{i - 1}")),
            "content": _maybe(
                draw, st.sampled_from(["out", [{"text": "out"}], [{"text": 3}], ["out"]])
            ),
        }
        block = {k: v for k, v in block.items() if draw(st.integers(0, 3))}
        turn["content"] = [block] if draw(st.integers(0, 5)) else _maybe(draw, TEXT)
    return turn


ODD_FIELDS = {
    "temperature": JUNK,
    "max_tokens": JUNK,
    "stream": JUNK,
    "stop": JUNK,
    "user": JUNK,
    "metadata": st.one_of(JUNK, st.just({"user_id": "u_session_s1"})),
    "seed": JUNK,
    "n": JUNK,
    "system": JUNK,
    "tools": st.one_of(
        JUNK,
        st.just([{"type": "function", "function": {"name": "run"}}]),
        st.just([{"name": "Bash", "input_schema": {"type": "object"}}]),
    ),
    "model": JUNK,
}


def _fields(draw, extras) -> dict:
    """A body's fields but its messages: mostly well-formed, now and then one of any value."""
    fields = draw(extras)
    if draw(st.integers(0, 3)) == 0:
        key = draw(st.sampled_from(sorted(ODD_FIELDS)))
        fields[key] = draw(ODD_FIELDS[key])
    return fields


def _agree_or_refuse(path: str, raw: bytes) -> None:
    """A new body's cheap read is the whole read, or both refuse it with the same 400."""
    try:
        routes.parse(path, raw)
    except APIError as whole:
        with pytest.raises(APIError) as cheap:
            BodyReader(min_bytes=SMALL).read(path, raw)
        assert (cheap.value.status, cheap.value.message) == (whole.status, whole.message)
        return
    _same(path, raw, BodyReader(min_bytes=SMALL), (PrefixBranches(4), PrefixBranches(4)))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_new_chat_body_of_odd_fields_is_read_as_the_whole_read_reads_it(data):
    draw = data.draw
    turns = draw(st.lists(odd_chat_turn(0), min_size=0, max_size=4))
    body = _chat_body(turns, _fields(draw, EXTRAS), draw(st.booleans()))
    _agree_or_refuse("/v1/chat/completions", json.dumps(body).encode())


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_new_messages_body_of_odd_fields_is_read_as_the_whole_read_reads_it(data):
    draw = data.draw
    turns = draw(st.lists(odd_anthropic_turn(1), min_size=0, max_size=4))
    body = _anthropic_body(turns, _fields(draw, ANTHROPIC_EXTRAS), draw(st.booleans()))
    _agree_or_refuse("/v1/messages", json.dumps(body).encode())


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_a_well_formed_new_body_is_read_without_the_message_models(data):
    """The bodies agents send take the cheap path (the tests above would pass without it)."""
    path, turn, body_of, extras = data.draw(
        st.sampled_from(
            [
                ("/v1/chat/completions", chat_turn, _chat_body, EXTRAS),
                ("/v1/messages", anthropic_turn, _anthropic_body, ANTHROPIC_EXTRAS),
            ]
        )
    )
    turns = data.draw(st.lists(turn(1), max_size=6))
    raw = json.dumps(body_of(turns, data.draw(extras), data.draw(st.booleans()))).encode()
    assert _light(_DIALECTS[path], raw) is not None
    _same(path, raw, BodyReader(min_bytes=SMALL), (PrefixBranches(4), PrefixBranches(4)))


UNUSUAL = [
    b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800 lone"}]}',
    b'{"model": "m", "messages": [{"role": "user", "content": "a"}], "messages": []}',
    b'{"model": "m", "messages": [], "messages": [{"role": "user", "content": "a"}]}',
    b'{"model": "m", "metadata": {"a": ' + b"[" * 250 + b"]" * 250 + b'}, "messages": []}',
    b'{"model": "m", "temperature": "0.5", "messages": [{"role": "user", "content": "a"}]}',
    b'{"model": "m", "max_tokens": 5.0, "messages": [{"role": "user", "content": "a"}]}',
    b'{"model": "m", "stream": "true", "messages": [{"role": "user", "content": "a"}]}',
    b'{"model": "m", "metadata": {"a": NaN}, "messages": [{"role": "user", "content": "a"}]}',
    b'{"model": "m", "messages": [{"role": "user", "content": "a"}]} trailing',
    b'\xef\xbb\xbf{"model": "m", "messages": [{"role": "user", "content": "a"}]}',
    b'{"model": "m", "messages": [{"role": "user", "content": "\xff"}]}',
]


@pytest.mark.parametrize("raw", UNUSUAL)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_an_unusual_new_body_is_read_as_the_whole_read_reads_it(raw, path):
    if path == "/v1/messages":
        raw = raw.replace(b'"model": "m"', b'"model": "m", "max_tokens": 9', 1)
    _agree_or_refuse(path, raw + b" " * SMALL)


def test_sessions_of_one_agent_each_continue_their_own_read():
    """Every session of one agent sends the same first bytes (its system prompt): found by the
    session its headers name, each return continues its own session's read, however many
    sessions there are; by the first bytes alone only the latest `PER_LEAD` are kept."""
    sessions = 3 * BodyReader.PER_LEAD
    named, unnamed = BodyReader(), BodyReader()

    def body(i: int, turns: int) -> bytes:
        own = f"#{i} " + "the task, in detail. " * 500  # most of the body: its own
        msgs = [{"role": "system", "content": "You are an agent. " * 20}]
        msgs.append({"role": "user", "content": own})
        msgs += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}] * turns
        return json.dumps({"model": "m", "messages": msgs}).encode()

    for turns in (0, 1):
        for i in range(sessions):
            named.read("/v1/chat/completions", body(i, turns), f"s{i}")
            unnamed.read("/v1/chat/completions", body(i, turns))
    assert named.continued == sessions
    assert unnamed.continued == 0  # each session's read was pushed out before it returned
