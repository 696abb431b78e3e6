"""A tool's canonical text: its JSON with its keys sorted, whatever order the client sent them in
and however often the same tools come (kept by their JSON as sent, `spec._tool_text`)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from talariad.calls import spec
from talariad.calls.spec import canonical_lines

_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
_TOOLS = st.lists(st.dictionaries(st.text(max_size=6), _JSON, min_size=1, max_size=5), max_size=6)


def _sorted_lines(tools: list[dict]) -> list[str]:
    return [f"<|tools|> {json.dumps(t, sort_keys=True)}\n" for t in tools]


@settings(max_examples=200, deadline=None)
@given(tools=_TOOLS, reversed_order=st.booleans())
def test_tools_read_as_their_sorted_json_every_time(tools, reversed_order):
    assert canonical_lines([], tools) == _sorted_lines(tools)
    # the same tools again, their keys in another order: the same text
    again = [dict(reversed(t.items())) if reversed_order else t for t in tools]
    assert canonical_lines([], again) == _sorted_lines(tools)


def test_tools_that_differ_only_in_a_value_type_read_apart():
    # 1, 1.0 and True are equal in Python (a key built from them would be one) but not in JSON
    kinds = [{"name": "t", "limit": v} for v in (1, 1.0, True)]
    assert canonical_lines([], kinds) == _sorted_lines(kinds)
    assert len(set(canonical_lines([], kinds))) == 3


def test_the_kept_tools_are_bounded_in_bytes(monkeypatch):
    kept = spec.ToolTexts(max_bytes=1024)
    monkeypatch.setattr(spec, "TOOL_TEXTS", kept)
    tools = [{"name": f"tool{i}", "parameters": {"type": "object"}} for i in range(20)]
    assert canonical_lines([], tools) == _sorted_lines(tools)
    assert 0 < len(kept) < 20 and 0 < kept.bytes <= 1024
    held = dict(kept._texts)
    huge = {"name": "huge", "description": "x" * 2048}  # past the bound alone: read, not kept
    assert canonical_lines([], [huge]) == _sorted_lines([huge])
    assert kept._texts == held  # and what was kept stays


def test_a_tool_its_encoder_refuses_still_reads():
    lone = {"name": "t", "description": "\ud800"}  # a lone surrogate: pydantic cannot encode it
    assert canonical_lines([], [lone]) == _sorted_lines([lone])
