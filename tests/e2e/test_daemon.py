"""End to end: `talariad run` as a subprocess, called with the official openai client and talaria-ctl.

The tests share one daemon and run in file order; the last one stops it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import openai
import psutil
import pytest

from tests.support.daemon import stop_daemon

pytestmark = pytest.mark.e2e

CHAT = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the failing test."},
]


def _client(d) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{d.endpoint}/v1", api_key="unused", max_retries=0, timeout=30)


def test_ready_is_notified(daemon):
    assert "READY=1" in daemon.notifications()


def test_chat_completion_and_usage(daemon):
    r = _client(daemon).chat.completions.create(
        model="tiny-code", messages=CHAT, max_tokens=12, extra_headers={"x-session-id": "s-plain"}
    )
    assert r.object == "chat.completion" and r.model == "tiny-code"
    assert (
        r.choices[0].message.role == "assistant" and len(r.choices[0].message.content.split()) == 12
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_continuation_reuses_prefix(daemon):
    client = _client(daemon)
    first = client.chat.completions.create(
        model="tiny-chat", messages=CHAT, max_tokens=6, extra_headers={"x-session-id": "s-cont"}
    )
    turn2 = CHAT + [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "The test passes now."},
    ]
    second = client.chat.completions.create(
        model="tiny-chat", messages=turn2, max_tokens=6, extra_headers={"x-session-id": "s-cont"}
    )
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens <= cached < second.usage.prompt_tokens
    # the return came back within τ = 1 s: the router's soft reservation sent it to the same instance
    talaria_first, talaria_second = (
        first.usage.model_extra["talaria"],
        second.usage.model_extra["talaria"],
    )
    assert (
        talaria_second["route"] == "lease_hit"
        and talaria_second["instance"] == talaria_first["instance"]
    )
    assert talaria_second["kv_source"] == "device"


def test_streaming_chat(daemon):
    stream = _client(daemon).chat.completions.create(
        model="tiny-chat",
        messages=CHAT,
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 5
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= 0


def test_same_call_same_answer(daemon):
    client = _client(daemon)
    a = client.chat.completions.create(model="tiny-chat", messages=CHAT, max_tokens=8, seed=7)
    b = client.chat.completions.create(model="tiny-chat", messages=CHAT, max_tokens=8, seed=7)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_models_lists_every_configured_model(daemon):
    ids = {m.id for m in _client(daemon).models.list()}
    assert ids == {"tiny-chat", "tiny-code", "tiny-agent"}


@pytest.mark.parametrize(
    "body, status, param, code",
    [
        ({"model": "nope", "messages": CHAT}, 404, "model", "model_not_found"),
        ({"model": "tiny-chat"}, 400, "messages", "missing_parameter"),
        ({"model": "tiny-chat", "messages": []}, 400, "messages", "invalid_value"),
        (
            {"model": "tiny-chat", "messages": CHAT, "max_tokens": -3},
            400,
            "max_tokens",
            "invalid_value",
        ),
        (
            {"model": "tiny-chat", "messages": [{"role": "wizard", "content": "x"}]},
            400,
            "messages.0.role",
            "invalid_value",
        ),
        ({"model": "tiny-chat", "messages": CHAT, "n": 2}, 400, "n", "invalid_value"),
    ],
)
def test_client_errors_use_openai_shape(daemon, body, status, param, code):
    r = httpx.post(f"{daemon.endpoint}/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and err["code"] == code and err["message"]


def test_client_controlled_session_ids_are_safe_everywhere(daemon):
    """Non-ASCII, control characters and Rich markup in a session id: a legal response header,
    and the ctl tables print it as text."""
    for user in ("日本", "x\ny", "[/]bad"):
        r = httpx.post(
            f"{daemon.endpoint}/v1/chat/completions",
            timeout=30,
            json={"model": "tiny-chat", "messages": CHAT, "max_tokens": 2, "user": user},
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["talaria"]["session_id"] == user
        with httpx.stream(
            "POST",
            f"{daemon.endpoint}/v1/chat/completions",
            timeout=30,
            json={
                "model": "tiny-chat",
                "messages": CHAT,
                "max_tokens": 2,
                "user": user,
                "stream": True,
            },
        ) as s:
            assert s.status_code == 200 and "[DONE]" in s.read().decode()
    listed = _ctl(daemon, "session", "list")
    assert listed.returncode == 0 and "[/]bad" in listed.stdout, listed.stderr


@pytest.mark.parametrize(
    "body, param, code",
    [
        ({"max_tokens": 10**9}, "max_tokens", "context_length_exceeded"),
        ({"seed": 10**30}, "seed", "invalid_value"),
    ],
)
def test_calls_that_can_never_be_served_are_400(daemon, body, param, code):
    r = httpx.post(
        f"{daemon.endpoint}/v1/chat/completions",
        timeout=30,
        json={"model": "tiny-chat", "messages": CHAT, **body},
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["code"] == code


def test_malformed_json_is_400(daemon):
    r = httpx.post(
        f"{daemon.endpoint}/v1/chat/completions",
        content=b'{"model": "tiny-chat", "messa',
        headers={"content-type": "application/json"},
        timeout=10,
    )
    assert r.status_code == 400
    assert (
        r.json()["error"]["type"] == "invalid_request_error"
        and "JSON" in r.json()["error"]["message"]
    )


def test_openai_client_raises_not_found(daemon):
    with pytest.raises(openai.NotFoundError):
        _client(daemon).chat.completions.create(model="nope", messages=CHAT)


def _ctl(d, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "talaria_ctl.main", "--socket", d.socket_path, *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_ctl_status_json(daemon):
    r = _ctl(daemon, "status", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["http_endpoint"] == daemon.endpoint
    inst = {i["name"]: i for i in data["instances"]}
    assert inst["hot0"]["pool"] == "hot" and inst["hot0"]["models"] == ["tiny-chat"]
    assert inst["cold0"]["pool"] == "cold" and inst["cold0"]["models"] == ["tiny-chat", "tiny-code"]
    assert all(i["state"] == "ready" and i["healthy"] and i["pid"] > 0 for i in inst.values())


def test_ctl_explains_calls_and_lists_sessions(daemon):
    r = _client(daemon).chat.completions.create(
        model="tiny-code", messages=CHAT, max_tokens=2, extra_headers={"x-session-id": "s-explain"}
    )
    served_by = r.usage.model_extra["talaria"]["instance"]
    explained = _ctl(daemon, "call", "explain", r.id, "--json")
    assert explained.returncode == 0, explained.stderr
    d = json.loads(explained.stdout)
    assert d["instance"] == served_by and d["kind"] in ("cost", "replica_open", "lease_hit")
    assert {c["instance"] for c in d["candidates"]} <= {"hot0", "cold0"}
    assert all(c["total_s"] >= 0 for c in d["candidates"])
    sessions = json.loads(_ctl(daemon, "session", "list", "--json").stdout)
    row = next(s for s in sessions if s["session_id"].split("~")[0] == "s-explain")
    assert row["instance"] == served_by and row["model"] == "tiny-code" and int(row["kv_len"]) > 0
    assert isinstance(json.loads(_ctl(daemon, "lease", "list", "--json").stdout), list)
    recent = json.loads(_ctl(daemon, "call", "recent", "--limit", "3", "--json").stdout)
    assert recent[0]["call_id"] == r.id.removeprefix("chatcmpl-")


def test_ctl_memory_of_a_sim_instance_says_unmanaged(daemon):
    r = _ctl(daemon, "instance", "memory", "cold0", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["managed"] is False
    process = json.loads(r.stdout)["process"]  # asked of the instance apart from its layout
    pids = {
        i["name"]: i["pid"]
        for i in json.loads(_ctl(daemon, "status", "--json").stdout)["instances"]
    }
    assert (
        process["pid"] == pids["cold0"] and process["rss_bytes"] > 0 and process["open_files"] > 0
    )
    missing = _ctl(daemon, "instance", "memory", "ghost")
    assert missing.returncode == 3 and "ghost" in missing.stderr


def test_ctl_unknown_call_is_refused(daemon):
    r = _ctl(daemon, "call", "explain", "chatcmpl-nope")
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1 and "nope" in r.stderr


def test_ctl_human_table(daemon):
    r = _ctl(daemon, "status")
    assert r.returncode == 0 and "hot0" in r.stdout and "cold0" in r.stdout


def test_ctl_unreachable_socket_is_one_line_exit_1(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "talaria_ctl.main",
            "--socket",
            str(tmp_path / "none.sock"),
            "status",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


async def test_tui_shows_instances(daemon):
    from textual.widgets import DataTable

    from talaria_tui.app import Dashboard
    from talariad.admin.client import AdminClient

    _client(daemon).chat.completions.create(model="tiny-chat", messages=CHAT, max_tokens=1)
    _client(daemon).chat.completions.create(
        model="tiny-code", messages=CHAT, max_tokens=1
    )  # a round on cold0
    app = Dashboard(AdminClient(daemon.socket_path), interval_s=0.2)
    async with app.run_test(size=(140, 30)) as pilot:
        table, decisions = (
            app.query_one("#instances", DataTable),
            app.query_one("#decisions", DataTable),
        )
        rounds, switches = (
            app.query_one("#rounds", DataTable),
            app.query_one("#switches", DataTable),
        )
        for _ in range(200):
            await pilot.pause(0.1)
            if (
                table.row_count == 3
                and decisions.row_count >= 1
                and rounds.row_count
                and switches.row_count
            ):
                break
        assert table.row_count == 3  # hot0, cold0 and the agents' agent0
        assert str(table.get_row("hot0")[1]) == "hot" and str(table.get_row("cold0")[1]) == "cold"
        assert decisions.row_count >= 1
        assert str(rounds.get_row_at(0)[0]) == "cold0" and str(switches.get_row_at(0)[0]) == "cold0"


def _ready(daemon) -> bool:
    return httpx.get(daemon.endpoint + "/ready", timeout=5).status_code == 200


def test_supervisor_restarts_a_crashed_instance(daemon):
    victim = next(p for p in daemon.children() if "cold0" in " ".join(p.cmdline()))
    victim.kill()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        inst = {
            i["name"]: i for i in json.loads(_ctl(daemon, "status", "--json").stdout)["instances"]
        }
        if (
            inst["cold0"]["restarts"] == 1
            and inst["cold0"]["state"] == "ready"
            and inst["cold0"]["pid"] != victim.pid
            and _ready(daemon)  # the gateway takes its calls again once it has read its telemetry
        ):
            break
        time.sleep(0.3)
    assert inst["cold0"]["restarts"] == 1 and inst["cold0"]["state"] == "ready"
    r = _client(daemon).chat.completions.create(model="tiny-code", messages=CHAT, max_tokens=3)
    assert r.usage.completion_tokens == 3


def test_sigterm_stops_every_child(daemon):
    children = daemon.children()
    assert len(children) >= 2
    started = time.monotonic()
    rc = stop_daemon(daemon)
    assert rc == 0 and time.monotonic() - started < 10
    gone, alive = psutil.wait_procs(children, timeout=5)
    assert alive == []
    assert "STOPPING=1" in daemon.notifications()
