"""Fuzzed requests for the five generation APIs: well-formed bodies with wrong types, junk, huge
and negative numbers, deep nesting or lone surrogates put at any field, some with their bytes
mangled. Shared by the suite's bounded fuzz and `bench/fuzz.py`."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
)
RETRYABLE = (429, 503)

_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
_BLOCKS = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}]},
]
_ANTHROPIC = {
    "system": [{"type": "text", "text": "s"}],
    "messages": _BLOCKS,
    "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "auto"},
    "metadata": {"user_id": '{"session_id": "s1"}'},
}
TEMPLATES = {
    "/v1/chat/completions": {
        "max_tokens": 2,
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": None, "tool_calls": [_CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "stream": False,
        "stream_options": {"include_usage": True},
        "metadata": {"user_id": "user_a_session_s1"},
        "temperature": 0.5,
        "stop": ["\n\n"],
        "seed": 1,
    },
    "/v1/completions": {"max_tokens": 2, "prompt": "def f(", "stop": ["\n"], "user": "u"},
    "/v1/messages": {"max_tokens": 2, "stream": False, "stop_sequences": ["x"], **_ANTHROPIC},
    "/v1/messages/count_tokens": _ANTHROPIC,
    "/v1/responses": {
        "max_output_tokens": 2,
        "instructions": "i",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "r"},
        ],
        "tools": [
            {"type": "function", "name": "f", "parameters": {"type": "object"}},
            {"type": "namespace", "name": "ns", "tools": [{"type": "custom", "name": "g"}]},
        ],
        "store": False,
        "stream": False,
    },
}
"""A well-formed body of each API, less its model; the fuzz replaces any of its values."""

_DEEP = "\x00deep%d\x00"  # a marker replaced by that many nested brackets once the body is dumped
_TEXT = st.lists(
    st.characters() | st.sampled_from(["\ud800", "\udfff", "\x00", "\\u", "<|user|>", "\u202e"]),
    max_size=8,
).map("".join)
_NUMBER = (
    st.integers(-(2**70), 2**70)
    | st.sampled_from([0, -1, 2**31, 2**63, -(2**63) - 1, 10**400])
    | st.floats(allow_nan=False)
)
_SCALAR = st.none() | st.booleans() | _NUMBER | _TEXT
_JUNK = st.recursive(
    _SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=6,
) | st.integers(150, 3000).map(lambda n: _DEEP % n)
_JSON_TEXT = _JUNK.map(lambda v: json.dumps(v, ensure_ascii=False))  # JSON inside a string field
_MODELS = st.sampled_from(["tiny-chat", "tiny-code", "claude-x", "gpt-x", "nope", ""])
_BYTES = st.sampled_from([b"\xff", b"\xed\xa0\x80", b"\xc0\xaf", b"\x00", b"\\ud800", b"{", b"]"])


def _paths(value, prefix=()) -> Iterator[tuple]:
    """Every place in a JSON-like value, as a tuple of keys and indexes."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return
    for key, inner in items:
        yield (*prefix, key)
        yield from _paths(inner, (*prefix, key))


def _put(body, path: tuple, value) -> None:
    """Set the value at `path`, unless an earlier junk value replaced a container on the way."""
    try:
        for key in path[:-1]:
            body = body[key]
        body[path[-1]] = value
    except (KeyError, IndexError, TypeError):
        pass


@st.composite
def _body(draw, path: str) -> dict:
    body = json.loads(json.dumps({"model": draw(_MODELS), **TEMPLATES[path]}))
    places = list(_paths(body)) + [(name,) for name in ("n", "logprobs", "messages", "input")]
    for place in draw(st.lists(st.sampled_from(places), max_size=3, unique=True)):
        with_text = place[-1] in ("user_id", "arguments")
        _put(body, place, draw(_JSON_TEXT if with_text and draw(st.booleans()) else _JUNK))
    return body


def _dump(body: dict, ascii_only: bool) -> bytes:
    # ensure_ascii=False writes a lone surrogate as the bytes that would encode it (not UTF-8)
    raw = json.dumps(body, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    marker = re.escape(json.dumps(_DEEP, ensure_ascii=ascii_only)).replace("%d", "(\\d+)")
    deep = lambda m: b"[" * int(m.group(1)) + b"]" * int(m.group(1))  # noqa: E731
    return re.sub(marker.encode(), deep, raw)


@st.composite
def requests(draw) -> tuple[str, str | None, bytes]:
    """(path, content type, body bytes) of one fuzzed request."""
    path = draw(st.sampled_from(PATHS))
    kind = draw(st.sampled_from(["application/json"] * 6 + ["application/json; charset=utf-8"]))
    if draw(st.integers(0, 9)) == 0:  # raw bytes, nothing like JSON
        return path, kind, draw(st.binary(max_size=64))
    raw = _dump(draw(_body(path)), draw(st.booleans()))
    mangle = draw(st.sampled_from(["none"] * 6 + ["insert", "truncate"]))
    at = draw(st.integers(0, len(raw)))
    if mangle == "insert":
        raw = raw[:at] + draw(_BYTES) + raw[at:]
    elif mangle == "truncate":
        raw = raw[:at]
    return path, kind, raw


def cases(count: int, seed_value: int | None = None) -> list[tuple[str, str | None, bytes]]:
    """`count` fuzzed requests, the same ones for the same seed (None: the suite's fixed draw)."""
    drawn: list[tuple[str, str | None, bytes]] = []

    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        derandomize=seed_value is None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(requests())
    def draw(case):
        drawn.append(case)

    (draw if seed_value is None else seed(seed_value)(draw))()
    return drawn[:count]


def acceptable(status: int, headers) -> bool:
    """No server error, and nothing that tells a client to retry what it sent (bad input)."""
    return status < 500 and status not in RETRYABLE and "retry-after" not in headers
