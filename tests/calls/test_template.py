"""One `<|role|> content` format: the sim executor's template and the canonical text agree on a
conversation without tools (each writes tools and tool calls its own way)."""

from talariad.calls.spec import canonical
from talariad.engine.executors.sim import render_request
from talariad.wire.messages import ChatMessage, GenerateRequest, ToolCall

CONVO = [
    ChatMessage(role="system", content="You are terse."),
    ChatMessage(role="user", content="héllo\nthere"),
    ChatMessage(role="assistant", content="hi"),
    ChatMessage(role="user", content="again"),
]


def test_the_sim_template_is_the_canonical_text_and_the_open_assistant_turn():
    req = GenerateRequest(call_id="c", model="m", messages=CONVO)
    assert render_request(req) == canonical(CONVO, None, []) + "<|assistant|>"
    assert canonical(CONVO[:1], None, []) == "<|system|> You are terse.\n"


def test_tool_calls_are_written_compactly_and_any_arguments_are_written():
    call = ToolCall(id="c", name="run", arguments={"cmd": "ls é"})
    odd = ToolCall(id="d", name="run", arguments={"cmd": "\ud800"})  # pydantic cannot encode it
    text = canonical([ChatMessage(role="assistant", content="", tool_calls=[call, odd])], None, [])
    assert text == '<|assistant|> <tool_call>run {"cmd":"ls é"}</tool_call>' + (
        '<tool_call>run {"cmd": "\ud800"}</tool_call>\n'
    )
