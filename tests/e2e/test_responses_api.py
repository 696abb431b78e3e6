"""The OpenAI Responses API (`/v1/responses`) through the official `openai` SDK: a real daemon
(sim executors) for text turns and Codex-shaped bodies, the in-process gateway over a scripted
executor for tool calls. Bodies are written here from the Responses API reference."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import httpx
import openai
import pytest

from tests.support import agents
from tests.support.scripted import local_gateway

pytestmark = pytest.mark.e2e

SESSION = "019a0000-c0de-7000-8000-000000000018"


def _client(d) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{d.endpoint}/v1", api_key="dummy", max_retries=0, timeout=60)


def _input(*extra: dict) -> list[dict]:
    return [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "You edit code."}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "List the files."}],
        },
        *extra,
    ]


def _codex_body(**over) -> dict:
    """A body shaped like the Codex CLI's turn: no output limit, store off, tools in an
    `additional_tools` item (a namespace with a function and a free-form tool) plus a hosted tool."""
    tools = {
        "type": "additional_tools",
        "role": "developer",
        "tools": [
            {
                "type": "namespace",
                "name": "functions",
                "description": "",
                "tools": [
                    {
                        "type": "function",
                        "name": "shell",
                        "description": "Run a command.",
                        "parameters": {
                            "type": "object",
                            "properties": {"cmd": {"type": "string"}},
                            "required": ["cmd"],
                        },
                    },
                    {
                        "type": "custom",
                        "name": "apply_patch",
                        "description": "Apply a patch.",
                        "format": {
                            "type": "grammar",
                            "syntax": "lark",
                            "definition": "start: /.+/",
                        },
                    },
                ],
            },
            {"type": "web_search"},
        ],
    }
    body = {
        "model": "gpt-9-codex",
        "stream": True,
        "store": False,
        "input": [tools, *_input()],
        "prompt_cache_key": SESSION,
        "include": ["reasoning.encrypted_content"],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "low", "context": "all_turns"},
        "text": {"verbosity": "low"},
        "client_metadata": {"session_id": SESSION},
    }
    return {**body, **over}


def _events(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_text_replies_with_usage_and_cached_tokens_on_the_second_turn(daemon):
    client = _client(daemon)
    first = client.responses.create(
        model="tiny-code", input=_input(), max_output_tokens=12, prompt_cache_key="resp-text-1"
    )
    assert first.status in ("completed", "incomplete") and first.output[0].type == "message"
    assert first.output_text and first.usage.output_tokens <= 12 and first.usage.input_tokens > 0
    assert first.usage.output_tokens_details.reasoning_tokens == 0
    turn2 = _input(
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": first.output_text}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "And tests?"}],
        },
    )
    with client.responses.stream(
        model="tiny-code",
        input=turn2,
        max_output_tokens=2000,
        extra_headers={"session-id": "resp-text-1"},
    ) as stream:
        kinds = [ev.type for ev in stream]
        second = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert {
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.output_item.done",
    } <= set(kinds)
    assert (
        kinds[-1] == "response.completed" and second.status == "completed"
    )  # the answer ended its turn
    assert (
        second.usage.input_tokens_details.cached_tokens > 0
    )  # `session-id` named the same session
    assert second.usage.model_extra["talaria"]["session_id"] == "resp-text-1"


def test_codex_shaped_body_is_answered_with_a_completed_stream(daemon):
    r = httpx.post(
        f"{daemon.endpoint}/v1/responses",
        json=_codex_body(),
        timeout=60,
        headers={
            "session-id": SESSION,
            "thread-id": SESSION,
            "x-client-request-id": SESSION,
            "originator": "codex_exec",
            "accept": "text/event-stream",
            "authorization": "Bearer dummy",
            "x-codex-turn-metadata": json.dumps({"turn_id": "t1"}),
        },
    )
    assert r.status_code == 200, r.text
    events = _events(r.text)
    assert events[0][0] == "response.created" and events[-1][0] == "response.completed"
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    final = events[-1][1]["response"]
    assert final["id"].startswith("resp_") and final["model"] == "gpt-9-codex"
    assert final["output"][0]["type"] == "message" and final["output"][0]["content"][0]["text"]
    u = final["usage"]
    assert (
        u["total_tokens"] == u["input_tokens"] + u["output_tokens"]
        and u["talaria"]["session_id"] == SESSION
    )
    # no max_output_tokens: the model's default_max_tokens (4096), not 256, bounds the answer
    assert u["output_tokens"] < 4096


def test_codex_tools_go_into_the_prompt(daemon):
    bare = _codex_body(stream=False, input=_input())
    with_tools = _codex_body(stream=False)
    a = httpx.post(f"{daemon.endpoint}/v1/responses", json=bare, timeout=60).json()
    b = httpx.post(f"{daemon.endpoint}/v1/responses", json=with_tools, timeout=60).json()
    assert (
        b["usage"]["input_tokens"] > a["usage"]["input_tokens"]
    )  # additional_tools folded into the prompt


@pytest.mark.parametrize(
    "body, param, code",
    [
        ({"model": "tiny-code"}, "input", "missing_parameter"),
        ({"model": "ghost", "input": "hi"}, "model", "model_not_found"),
        (
            {"model": "tiny-code", "input": "hi", "previous_response_id": "resp_x"},
            "previous_response_id",
            "previous_response_not_found",
        ),
        ({"model": "tiny-code", "input": [{"content": "no type or role"}]}, "input.0", None),
        (
            {"model": "tiny-code", "input": "hi", "max_output_tokens": 0},
            "max_output_tokens",
            "invalid_value",
        ),
    ],
)
def test_error_shapes(daemon, body, param, code):
    r = httpx.post(f"{daemon.endpoint}/v1/responses", json=body, timeout=10)
    assert r.status_code in (400, 404)
    err = r.json()["error"]
    assert err["message"] and err["param"] == param and err["code"] == code


def test_sdk_raises_on_errors(daemon):
    with pytest.raises(openai.NotFoundError):
        _client(daemon).responses.create(model="ghost", input="hi")


# the default namespace's tools are rendered by their bare names (a model calls `shell`)
CALL = '<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls"}}\n</tool_call>'
CUSTOM = (
    '<tool_call>\n{"name": "apply_patch", "arguments": {"input": "*** Begin Patch"}}\n</tool_call>'
)


async def test_scripted_tool_call_yields_a_function_call_item_and_the_follow_up_reuses_the_prefix():
    async with local_gateway(CALL) as http:
        sdk = openai.AsyncOpenAI(
            base_url="http://talaria/v1", api_key="x", http_client=http, max_retries=0
        )
        body = _codex_body(stream=False)
        first = await sdk.responses.create(
            **{k: body[k] for k in ("model", "input", "store")},
            extra_body={"prompt_cache_key": SESSION, "tool_choice": "auto"},
        )
        call = first.output[0]
        assert call.type == "function_call" and call.name == "shell"
        assert json.loads(call.arguments) == {"cmd": "ls"} and call.call_id
        follow = body["input"] + [
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "a.py\nb.py"},
        ]
        stream = await sdk.responses.create(
            model=body["model"],
            input=follow,
            stream=True,
            store=False,
            extra_body={"prompt_cache_key": SESSION},
        )
        events = [ev async for ev in stream]
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    done = events[-1].response
    assert done.output[0].type == "function_call"
    assert (
        done.usage.input_tokens_details.cached_tokens > 0
    )  # served from the same session's prefix
    assert (
        done.usage.input_tokens > first.usage.input_tokens
    )  # the call and its output were rendered


async def test_scripted_custom_tool_call_is_a_custom_tool_call_item():
    async with local_gateway(CUSTOM) as http:
        r = await http.post("/v1/responses", json=_codex_body(stream=False))
    item = r.json()["output"][0]
    assert item["type"] == "custom_tool_call" and item["name"] == "apply_patch"
    assert "namespace" not in item
    assert item["input"] == "*** Begin Patch"


async def test_previous_response_id_with_a_store():
    async with local_gateway(overrides={"responses": {"store_max": 4}}) as http:
        first = (
            await http.post(
                "/v1/responses",
                json={
                    "model": "tiny-code",
                    "input": "hello",
                    "store": True,
                    "max_output_tokens": 5,
                },
            )
        ).json()
        second = await http.post(
            "/v1/responses",
            json={
                "model": "tiny-code",
                "input": "more",
                "previous_response_id": first["id"],
                "max_output_tokens": 5,
            },
        )
        gone = await http.post(
            "/v1/responses",
            json={"model": "tiny-code", "input": "more", "previous_response_id": "resp_unknown"},
        )
    assert second.status_code == 200
    assert second.json()["usage"]["input_tokens"] > first["usage"]["input_tokens"]
    assert gone.status_code == 400 and gone.json()["error"]["code"] == "previous_response_not_found"


CODEX = os.environ.get("TALARIA_CODEX_BIN") or shutil.which("codex")


@pytest.mark.skipif(
    CODEX is None,
    reason="the Codex CLI is not installed (CI never downloads it; set TALARIA_CODEX_BIN)",
)
def test_real_codex_says_hello(daemon, tmp_path):
    (tmp_path / "config.toml").write_text(
        'model_provider = "talaria"\n\n[model_providers.talaria]\nname = "Talaria"\n'
        f'base_url = "{daemon.endpoint}/v1"\nwire_api = "responses"\nenv_key = "TALARIA_API_KEY"\n'
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "CODEX_HOME": str(tmp_path),
        "TALARIA_API_KEY": "dummy",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "127.0.0.1",
    }
    out = subprocess.run(
        [CODEX, "exec", "--skip-git-repo-check", "say hello"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


EXEC = '<tool_call>\n{"name": "exec", "arguments": {"input": "ls -la"}}\n</tool_call>'
MCP = '<tool_call>\n{"name": "mcp__docs__.search", "arguments": {"q": "greeting"}}\n</tool_call>'


async def test_codex_exec_in_the_default_namespace_is_answered_by_its_bare_name_and_loops():
    """Codex's default model runs everything through the free-form `exec` of the `functions`
    namespace (tests/support/agents.py builds its request shape): the answer must name `exec`
    alone, the shape Codex dispatches, and Codex's next request (the call echoed back with its
    namespace, then its output) continues the same prefix."""
    items = [agents.codex_message("user", "Change Hello to Hi in hello.py.")]
    async with local_gateway(EXEC) as http:
        headers = {"session_id": "codex-exec-loop"}
        for turn in range(3):
            r = await http.post("/v1/responses", json=agents.codex_body(items), headers=headers)
            out = r.json()
            call = out["output"][-1]
            assert call["type"] == "custom_tool_call" and call["name"] == "exec", out["output"]
            assert "namespace" not in call and call["input"] == "ls -la"
            if turn:
                assert out["usage"]["input_tokens_details"]["cached_tokens"] > 0
            items = items + [
                {**call, "namespace": "functions"},
                {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "ok"},
            ]


async def test_a_namespaced_function_is_answered_with_its_namespace_in_a_field():
    async with local_gateway(MCP) as http:
        body = agents.codex_body([agents.codex_message("user", "Find the greeting.")])
        out = (await http.post("/v1/responses", json=body)).json()
        stream = await http.post("/v1/responses", json={**body, "stream": True})
    call = out["output"][-1]
    assert call["type"] == "function_call" and call["name"] == "search"
    assert call["namespace"] == "mcp__docs__" and json.loads(call["arguments"]) == {"q": "greeting"}
    events = [
        json.loads(block.split("data: ", 1)[1])
        for block in stream.text.strip().split("\n\n")
        if "data: " in block
    ]
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert done and done[0]["name"] == "search"
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert added[-1]["namespace"] == "mcp__docs__" and added[-1]["name"] == "search"
