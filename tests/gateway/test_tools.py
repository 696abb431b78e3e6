"""The shared tool layer on fixed strings: per-family parsers, the streaming splitter, template
rendering of tools, tool calls and tool results, and each API's conversion to internal messages."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talariad.calls.dialects import messages as anthropic
from talariad.calls.dialects import responses
from talariad.calls.dialects.chat import ChatCompletionRequest
from talariad.calls.errors import APIError
from talariad.engine.executors.sim import render_request
from talariad.engine.model.tokenizer import (
    FALLBACK_CHAT_TEMPLATE,
    TextTokenizer,
    _render_fallback,
    build_tiny_tokenizer,
)
from talariad.tools import ToolStream, function_tool, parse
from talariad.wire.messages import ChatMessage, GenerateRequest, ToolCall

HERMES = (
    'Checking.\n<tool_call>\n{"name": "read", "arguments": {"path": "a.py"}}\n</tool_call>\n'
    '<tool_call>{"name": "grep", "arguments": "{\\"q\\": \\"x\\"}"}</tool_call>'
)
LLAMA = '{"name": "read", "parameters": {"path": "a.py"}}; {"name": "ls", "parameters": {}}'


def test_hermes_parser_reads_every_call_and_keeps_the_text():
    text, calls = parse("hermes", HERMES)
    assert text == "Checking."
    assert [(c.name, c.arguments) for c in calls] == [
        ("read", {"path": "a.py"}),
        ("grep", {"q": "x"}),
    ]
    assert len({c.id for c in calls}) == 2


@pytest.mark.parametrize(
    "text",
    [
        "no calls here",
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
    ],
)
def test_hermes_parser_leaves_text_without_a_well_formed_call_alone(text):
    assert parse("hermes", text) == (text, [])


def test_llama3_parser_reads_json_calls_and_ignores_prose():
    text, calls = parse("llama3_json", "<|python_tag|>" + LLAMA)
    assert text == "" and [(c.name, c.arguments) for c in calls] == [
        ("read", {"path": "a.py"}),
        ("ls", {}),
    ]
    assert parse("llama3_json", "The answer is {x}.") == ("The answer is {x}.", [])


def _stream(parser: str, pieces: list[str]) -> tuple[str, list[ToolCall]]:
    s = ToolStream(parser, True)
    out = "".join(s.push(p) for p in pieces)
    rest, calls = s.finish()
    return out + rest, calls


@given(st.lists(st.integers(1, 9), min_size=1, max_size=40))
@settings(max_examples=60, deadline=None, derandomize=True)
def test_tool_stream_splits_like_the_whole_text_parse_however_it_is_chunked(sizes):
    pieces, at = [], 0
    for n in sizes * 20:
        if at >= len(HERMES):
            break
        pieces.append(HERMES[at : at + n])
        at += n
    pieces.append(HERMES[at:])
    text, calls = _stream("hermes", pieces)
    assert text == "Checking.\n" or text.strip() == "Checking."
    assert [c.name for c in calls] == ["read", "grep"]


def test_tool_stream_streams_plain_text_at_once_and_holds_a_partial_marker():
    s = ToolStream("hermes", True)
    assert s.push("Hello ") == "Hello "
    assert s.push("world <tool") == "world "  # may become a marker: held
    assert s.push("box>") == "<toolbox>"  # it did not
    assert s.finish() == ("", [])
    off = ToolStream("hermes", False)  # a call without tools never holds text
    assert off.push("<tool_call>") == "<tool_call>"


TOOLS = [
    function_tool(
        "read", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}}}
    )
]
CONVO = [
    ChatMessage(role="system", content="Be brief."),
    ChatMessage(role="user", content="Open a.py"),
    ChatMessage(
        role="assistant",
        content="",
        tool_calls=[ToolCall(id="c1", name="read", arguments={"path": "a.py"})],
    ),
    ChatMessage(role="tool", content="x = 1", tool_call_id="c1", name="read"),
    ChatMessage(role="system", content="Mid-conversation note."),
]


def test_the_fallback_template_renders_tools_calls_and_results():
    tok = TextTokenizer(build_tiny_tokenizer(), FALLBACK_CHAT_TEMPLATE, {})
    text = tok.render_chat([m.template_dict() for m in CONVO], tools=TOOLS)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(TOOLS[0]) in text
    assert (
        '<tool_call>\n{"name": "read", "arguments": {"path": "a.py"}}\n</tool_call><|im_end|>'
        in text
    )
    assert "<|im_start|>user\n<tool_response>\nx = 1\n</tool_response><|im_end|>" in text
    assert "<|im_start|>system\nMid-conversation note.<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    # the plain-Python fallback (no jinja2) renders the very same text
    assert text == _render_fallback([m.template_dict() for m in CONVO], True, TOOLS)
    assert "# Tools" not in tok.render_chat([m.template_dict() for m in CONVO[:2]])


def test_a_template_that_refuses_the_conversation_is_a_value_error():
    tok = TextTokenizer(build_tiny_tokenizer(), "{{ raise_exception('roles must alternate') }}", {})
    with pytest.raises(ValueError, match="roles must alternate"):
        tok.render_chat([{"role": "user", "content": "x"}])


def test_sim_template_renders_tools_and_calls():
    text = render_request(GenerateRequest(call_id="c", model="m", messages=CONVO, tools=TOOLS))
    assert (
        text.startswith("<|tools|> ")
        and '<tool_call>{"name": "read"' in text
        and "<|tool|> x = 1" in text
    )


def test_anthropic_messages_become_internal_messages():
    body = anthropic.MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 5,
            "system": [
                {"type": "text", "text": "A", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "B"},
            ],
            "messages": [
                {"role": "user", "content": "Open a.py"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm"},
                        {"type": "text", "text": "ok"},
                        {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "x = 1"}],
                        },
                        {"type": "text", "text": "and now?"},
                    ],
                },
                {"role": "system", "content": "late note"},
            ],
            "tools": [
                {"name": "read", "input_schema": {"type": "object"}},
                {"type": "web_search_20250305", "name": "web_search"},
            ],
        }
    )
    msgs = body.chat()
    assert [(m.role, m.content) for m in msgs] == [
        ("system", "AB"),
        ("user", "Open a.py"),
        ("assistant", "ok"),
        ("tool", "x = 1"),
        ("user", "and now?"),
        ("system", "late note"),
    ]
    assert (
        msgs[2].tool_calls[0].name == "read"
        and msgs[3].tool_call_id == "t1"
        and msgs[3].name == "read"
    )
    assert [t["function"]["name"] for t in body.tool_defs()] == [
        "read"
    ]  # the server tool cannot run here


def test_openai_chat_messages_with_tool_calls():
    body = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "read", "arguments": '{"p": 1}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "done"},
            ],
            "tools": [
                {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}
            ],
        }
    )
    msgs = [m.chat() for m in body.messages]
    assert msgs[0].role == "system" and msgs[1].tool_calls[0].arguments == {"p": 1}
    assert msgs[2].role == "tool" and msgs[2].tool_call_id == "c1"
    assert body.tool_defs()[0]["function"]["name"] == "read"
    assert body.model_copy(update={"tool_choice": "none"}).tool_defs() == []


CODEX_INPUT = {
    "model": "m",
    "instructions": "sys",
    "input": [
        {
            "type": "additional_tools",
            "tools": [
                {
                    "type": "namespace",
                    "name": "fs",
                    "tools": [
                        {
                            "type": "function",
                            "name": "read",
                            "parameters": {"type": "object"},
                        },
                        {"type": "custom", "name": "patch", "description": "apply"},
                    ],
                },
                {"type": "web_search"},
            ],
        },
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "rules"}],
        },
        {"role": "user", "content": "go"},
        {"type": "reasoning", "summary": []},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "fs.read",
            "arguments": '{"p": "a"}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": "text"},
        {
            "type": "custom_tool_call",
            "call_id": "c2",
            "name": "fs.patch",
            "input": "*** patch",
        },
        {
            "type": "custom_tool_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "ok"}],
        },
    ],
}
"""A Codex turn: namespaced and custom tools, a hosted tool, reasoning, calls and their outputs."""


def test_responses_input_items_and_tools():
    body = responses.ResponsesRequest.model_validate(CODEX_INPUT)
    msgs, tools = responses.convert(body)
    assert [m.role for m in msgs] == [
        "system",
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    assert msgs[3].tool_calls[0].arguments == {"p": "a"} and msgs[4].name == "fs.read"
    assert msgs[5].tool_calls[0].arguments == {"input": "*** patch"} and msgs[6].content == "ok"
    assert msgs[6].tool_call_id == "c2" and msgs[6].name == "fs.patch"
    assert [t["function"]["name"] for t in tools.defs] == ["fs.read", "fs.patch"]
    assert tools.custom == {"fs.patch"} and tools.dropped == ["web_search"]


def test_responses_items_with_mistakes_are_400s():
    for bad in (
        [{"type": "message", "role": "robot", "content": "x"}],
        [{"type": "function_call", "call_id": "c"}],
        [{"content": "x"}],
    ):
        with pytest.raises(APIError) as err:
            responses.convert(
                responses.ResponsesRequest.model_validate({"model": "m", "input": bad})
            )
        assert err.value.status == 400 and err.value.param.startswith("input.0")


def test_tool_choice_none_leaves_the_tools_out_on_every_api():
    tool = {"name": "read", "input_schema": {"type": "object"}}
    msgs = [{"role": "user", "content": "hi"}]
    body = anthropic.MessagesRequest.model_validate(
        {"model": "m", "max_tokens": 1, "messages": msgs, "tools": [tool]}
    )
    assert len(body.tool_defs()) == 1
    assert body.model_copy(update={"tool_choice": {"type": "none"}}).tool_defs() == []
    assert body.model_copy(update={"tool_choice": {"type": "any"}}).tool_defs() == body.tool_defs()
