"""Requests shaped like Claude Code's, against a real daemon (sim executors) and, for tool calls,
the in-process gateway over a scripted executor (a random-weight model cannot emit a tool call).

The bodies are written here from the Anthropic Messages API reference; no vendor prompt text.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import anthropic
import httpx
import openai
import pytest

from tests.support.scripted import local_gateway

pytestmark = pytest.mark.e2e

SESSION = "5b1e6a0c-cc00-4e1f-9a55-000000000017"


def _tools(n: int = 24) -> list[dict]:
    return [
        {
            "name": f"Tool{i}",
            "description": f"Tool number {i}: does step {i} of a build.",
            "input_schema": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "n": {"type": "integer"}},
                "required": ["path"],
            },
        }
        for i in range(n)
    ]


def _body(**over) -> dict:
    body = {
        "model": "claude-opus-4-8",
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {"type": "text", "text": "You are a careful coding assistant."},
            {
                "type": "text",
                "text": "Work in the repository the user names.",
                "cache_control": {"type": "ephemeral"},
            },
            {
                "type": "text",
                "text": "Prefer small patches.",
                "cache_control": {"type": "ephemeral"},
            },
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "<system-reminder>Files may change.</system-reminder>",
                    },
                    {
                        "type": "text",
                        "text": "Find why the build fails.",
                        "cache_control": {"type": "ephemeral"},
                    },
                ],
            },
            {"role": "system", "content": "Available helpers: linter, formatter."},
        ],
        "tools": _tools(),
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "metadata": {
            "user_id": json.dumps({"device_id": "d0", "account_uuid": "", "session_id": SESSION})
        },
    }
    return {**body, **over}


HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,context-management-2025-06-27",
    "x-api-key": "dummy",
    "x-app": "cli",
}


def _events(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def _post(d, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(
        f"{d.endpoint}{path}", json=body, headers={**HEADERS, **(headers or {})}, timeout=60
    )


def test_claude_code_shaped_stream_is_answered_and_ends_its_turn(daemon):
    r = _post(daemon, "/v1/messages?beta=true", _body())
    assert r.status_code == 200, r.text
    events = _events(r.text)
    names = [n for n, _ in events]
    assert (
        names[0] == "message_start"
        and names[-1] == "message_stop"
        and "content_block_delta" in names
    )
    start = events[0][1]["message"]
    assert start["model"] == "claude-opus-4-8"  # the id the client asked for, served by an alias
    assert {"cache_creation_input_tokens", "cache_read_input_tokens"} <= set(start["usage"])
    delta = next(d for n, d in events if n == "message_delta")
    assert delta["delta"]["stop_reason"] == "end_turn"  # the sim ends its turn well before 32000
    assert 0 < delta["usage"]["output_tokens"] < 32000
    assert delta["usage"]["talaria"]["session_id"] == SESSION  # from the JSON metadata.user_id
    # message_start reports the exact prompt length: count_tokens of the same body agrees
    counted = _post(daemon, "/v1/messages/count_tokens", _body(stream=False)).json()["input_tokens"]
    assert start["usage"]["input_tokens"] + start["usage"]["cache_read_input_tokens"] == counted


def test_non_streaming_with_thinking_enabled_and_a_known_alias(daemon):
    body = _body(
        stream=False,
        thinking={"type": "enabled", "budget_tokens": 2048},
        model="claude-haiku-4-5-20251001",
    )
    r = _post(daemon, "/v1/messages", body)
    assert r.status_code == 200, r.text
    msg = r.json()
    assert msg["model"] == "claude-haiku-4-5-20251001" and msg["content"][0]["type"] == "text"
    assert msg["stop_reason"] == "end_turn" and msg["stop_sequence"] is None
    assert msg["usage"]["talaria"]["model"] == "tiny-agent"


def test_count_tokens_counts_system_messages_and_tools(daemon):
    full = _post(daemon, "/v1/messages/count_tokens", _body(stream=False)).json()["input_tokens"]
    fewer = _post(daemon, "/v1/messages/count_tokens", _body(stream=False, tools=_tools(3))).json()[
        "input_tokens"
    ]
    bare = _post(
        daemon, "/v1/messages/count_tokens", _body(stream=False, tools=None, system=None)
    ).json()
    assert full > fewer > bare["input_tokens"] > 0


def test_models_lists_ids_and_describes_glob_aliases_apart(daemon):
    data = httpx.get(f"{daemon.endpoint}/v1/models", timeout=10).json()["data"]
    agent = next(m for m in data if m["id"] == "tiny-agent")
    assert agent["aliases"] == [] and agent["alias_patterns"] == ["claude-*", "gpt-*"]
    assert not [m["id"] for m in data if any(c in m["id"] for c in "*?[")]


@pytest.mark.parametrize("model_id", ["tiny-agent", "claude-opus-4-8", "gpt-5.1-codex"])
def test_a_model_id_resolves_as_a_call_would(daemon, model_id):
    r = httpx.get(f"{daemon.endpoint}/v1/models/{model_id}", timeout=10)
    assert r.status_code == 200, r.text
    m = r.json()
    assert m["id"] == model_id and m["object"] == "model" and m["max_model_len"] > 0
    assert m.get("alias_of", m["id"]) == "tiny-agent"


def test_an_unknown_model_id_is_a_404(daemon):
    r = httpx.get(f"{daemon.endpoint}/v1/models/llama-99", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_a_side_call_does_not_evict_the_main_prefix(daemon):
    """Main turn 1, a title-like side call with another system prompt, main turn 2."""
    hdr = {"x-claude-code-session-id": "branch-test-1"}
    turn1 = _body(stream=False, max_tokens=40)
    one = _post(daemon, "/v1/messages", turn1, hdr).json()
    side = _body(
        stream=False,
        max_tokens=10,
        tools=None,
        system="Write a five word title for this conversation.",
        messages=[{"role": "user", "content": "Find why the build fails."}],
    )
    two_side = _post(daemon, "/v1/messages", side, hdr).json()
    turn2 = _body(
        stream=False,
        max_tokens=40,
        messages=turn1["messages"]
        + [
            {"role": "assistant", "content": one["content"][0]["text"]},
            {"role": "user", "content": "Now fix it."},
        ],
    )
    two = _post(daemon, "/v1/messages", turn2, hdr).json()
    prompt1 = one["usage"]["input_tokens"] + one["usage"]["cache_read_input_tokens"]
    assert two_side["usage"]["talaria"]["branch"] != one["usage"]["talaria"]["branch"]
    assert two["usage"]["talaria"]["branch"] == one["usage"]["talaria"]["branch"]
    assert two["usage"]["cache_read_input_tokens"] >= prompt1


def test_context_errors_use_anthropic_wording(daemon):
    long = {"role": "user", "content": "word " * 9000}
    r = _post(
        daemon, "/v1/messages", _body(stream=False, model="tiny-code", tools=None, messages=[long])
    )
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert re.fullmatch(
        r"prompt is too long: \d+ tokens > 8192 maximum", r.json()["error"]["message"]
    )
    # the default config clamps an output limit that does not fit instead of refusing the call
    ok = _post(daemon, "/v1/messages", _body(stream=False, model="tiny-code", max_tokens=32000))
    assert ok.status_code == 200 and ok.json()["usage"]["output_tokens"] <= 8192


def test_unknown_non_claude_model_is_404_in_anthropic_shape(daemon):
    r = _post(daemon, "/v1/messages", _body(stream=False, model="llama-99"))
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


async def test_max_tokens_over_the_context_uses_anthropics_retry_wording():
    async with local_gateway(overrides={"anthropic": {"clamp_max_tokens": False}}) as client:
        r = await client.post(
            "/v1/messages", json=_body(stream=False, model="tiny-code", tools=None)
        )
    assert r.status_code == 400
    assert re.fullmatch(
        r"input length and `max_tokens` exceed context limit: \d+ \+ 32000 > 8192, "
        r"decrease input length or `max_tokens` and try again",
        r.json()["error"]["message"],
    )


SCRIPT = 'I will read it.<tool_call>\n{"name": "Tool3", "arguments": {"path": "src/main.py", "n": 2}}\n</tool_call>'


def _sdk(client) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url="http://talaria", api_key="dummy", http_client=client, max_retries=0
    )


async def test_tool_use_stream_shape_from_a_scripted_model():
    async with local_gateway(SCRIPT) as client:
        r = await client.post("/v1/messages", json=_body(), headers=HEADERS)
        events = _events(r.text)
        keep = ("model", "max_tokens", "system", "messages", "tools", "metadata")
        extra = {
            k: v
            for k, v in _body().items()
            if k in ("thinking", "context_management", "output_config")
        }
        async with _sdk(client).messages.stream(
            **{k: _body()[k] for k in keep}, extra_body=extra
        ) as stream:
            final = await stream.get_final_message()
    starts = [d for n, d in events if n == "content_block_start"]
    assert [s["content_block"]["type"] for s in starts] == ["text", "tool_use"]
    tool = starts[1]["content_block"]
    assert tool["name"] == "Tool3" and tool["id"] and tool["input"] == {}
    partial = "".join(
        d["delta"]["partial_json"]
        for n, d in events
        if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"
    )
    assert json.loads(partial) == {"path": "src/main.py", "n": 2}
    text = "".join(
        d["delta"]["text"] for n, d in events if n == "content_block_delta" and d["index"] == 0
    )
    assert text == "I will read it."  # the tool-call markup never reaches the client as text
    assert next(d for n, d in events if n == "message_delta")["delta"]["stop_reason"] == "tool_use"
    assert final.stop_reason == "tool_use" and final.content[1].type == "tool_use"
    assert final.content[1].input == {"path": "src/main.py", "n": 2}


async def test_tool_result_renders_back_into_the_prompt():
    async with local_gateway(SCRIPT) as client:
        first = (
            await client.post("/v1/messages", json=_body(stream=False), headers=HEADERS)
        ).json()
        use = first["content"][1]
        assert first["stop_reason"] == "tool_use" and use["type"] == "tool_use"
        follow = _body(
            stream=False,
            messages=_body()["messages"]
            + [
                {"role": "assistant", "content": first["content"]},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": use["id"],
                            "content": "def main(): return 1",
                        }
                    ],
                },
            ],
        )
        counted = await client.post("/v1/messages/count_tokens", json=follow, headers=HEADERS)
        second = (await client.post("/v1/messages", json=follow, headers=HEADERS)).json()
    assert counted.status_code == 200 and second["type"] == "message"
    prompt2 = second["usage"]["input_tokens"] + second["usage"]["cache_read_input_tokens"]
    assert prompt2 == counted.json()["input_tokens"]
    assert second["usage"]["cache_read_input_tokens"] > 0  # the same session's prefix served it


async def test_openai_chat_tool_calls_stream_and_body():
    tools = [
        {
            "type": "function",
            "function": {
                "name": "Tool3",
                "description": "reads a file",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    msgs = [{"role": "user", "content": "Read src/main.py"}]
    async with local_gateway(SCRIPT) as client:
        sdk = openai.AsyncOpenAI(
            base_url="http://talaria/v1", api_key="x", http_client=client, max_retries=0
        )
        body = await sdk.chat.completions.create(model="tiny-agent", messages=msgs, tools=tools)
        chunks = [
            c
            async for c in await sdk.chat.completions.create(
                model="tiny-agent", messages=msgs, tools=tools, stream=True
            )
        ]
        follow = msgs + [
            body.choices[0].message.model_dump(exclude_none=True),
            {
                "role": "tool",
                "tool_call_id": body.choices[0].message.tool_calls[0].id,
                "content": "x = 1",
            },
        ]
        again = await sdk.chat.completions.create(model="tiny-agent", messages=follow, tools=tools)
    choice = body.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "I will read it."
    call = choice.message.tool_calls[0]
    assert call.function.name == "Tool3" and json.loads(call.function.arguments) == {
        "path": "src/main.py",
        "n": 2,
    }
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or []) if c.choices]
    assert deltas[0].id and deltas[0].function.name == "Tool3"
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == {
        "path": "src/main.py",
        "n": 2,
    }
    assert [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ] == ["tool_calls"]
    assert again.usage.prompt_tokens_details.cached_tokens > 0


CLAUDE = os.environ.get("TALARIA_CLAUDE_BIN") or shutil.which("claude")


@pytest.mark.skipif(
    CLAUDE is None,
    reason="the Claude Code CLI is not installed (CI never downloads it; set TALARIA_CLAUDE_BIN)",
)
def test_real_claude_code_says_hello(daemon, tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "ANTHROPIC_BASE_URL": daemon.endpoint,
        "ANTHROPIC_API_KEY": "dummy",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "127.0.0.1",
    }
    out = subprocess.run(
        [CLAUDE, "-p", "say hello", "--output-format", "json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["is_error"] is False


def test_a_fired_stop_sequence_is_reported_with_the_sequence(daemon):
    body = _body(stream=False, tools=None, max_tokens=400, stop_sequences=["zzz-never", " the "])
    msg = _post(daemon, "/v1/messages", body).json()
    assert msg["stop_reason"] == "stop_sequence" and msg["stop_sequence"] == " the "
    assert " the " not in msg["content"][0]["text"]
