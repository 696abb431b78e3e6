"""End to end on the embedded default (`etc/talaria.yaml`): `talariad run` with the built-in torch
engine on the CPU, called with the official openai client."""

from __future__ import annotations

import httpx
import openai
import pytest
import yaml

from tests.support.daemon import ROOT, start_daemon, stop_daemon

pytestmark = pytest.mark.e2e

CHAT = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the failing test."},
]


def test_default_config_runs_the_torch_engine():
    cfg = yaml.safe_load((ROOT / "etc" / "talaria.yaml").read_text())
    pools = {i["pool"]: i for i in cfg["instances"] if i["models"] != ["tiny-agent"]}
    serving = [
        i for i in cfg["instances"] if i["models"] != ["tiny-agent"]
    ]  # the agents' sim instance aside
    assert {i["executor"] for i in serving} == {"torch"}
    assert len(pools["hot"]["models"]) == 1 and len(pools["cold"]["models"]) >= 2


@pytest.fixture(scope="module")
def torch_daemon(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("talariad-torch"))
    yield d
    assert stop_daemon(d) == 0
    d.notify.close()


def _client(d) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{d.endpoint}/v1", api_key="unused", max_retries=0, timeout=30)


@pytest.mark.parametrize("model", ["tiny-chat", "tiny-code"])
def test_continuation_reuses_real_kv(torch_daemon, model):
    client, session = _client(torch_daemon), {"x-session-id": f"torch-{model}"}
    first = client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=6, extra_headers=session
    )
    answer = first.choices[0].message.content
    assert isinstance(answer, str) and first.usage.completion_tokens >= 1
    assert first.choices[0].finish_reason in ("stop", "length")
    assert first.usage.model_extra["talaria"]["kv_source"] == "none"
    turn2 = CHAT + [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "It passes now."},
    ]
    second = client.chat.completions.create(
        model=model, messages=turn2, max_tokens=6, extra_headers=session
    )
    assert 0 < second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens
    assert second.usage.model_extra["talaria"]["kv_source"] in ("device", "host")


def test_streamed_tokens_equal_the_whole_answer(torch_daemon):
    client = _client(torch_daemon)
    whole = client.chat.completions.create(model="tiny-code", messages=CHAT, max_tokens=8, seed=3)
    stream = client.chat.completions.create(
        model="tiny-code",
        messages=CHAT,
        max_tokens=8,
        seed=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content  # greedy: the same real tokens both times
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_raw_completion(torch_daemon):
    r = httpx.post(
        f"{torch_daemon.endpoint}/v1/completions",
        timeout=30,
        json={"model": "tiny-chat", "prompt": "def main():\n    return", "max_tokens": 4},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert (
        isinstance(body["choices"][0]["text"], str) and 1 <= body["usage"]["completion_tokens"] <= 4
    )


def test_ctl_shows_the_cold_instances_memory_layout_and_switches(torch_daemon):
    import json
    import subprocess
    import sys

    _client(torch_daemon).chat.completions.create(model="tiny-code", messages=CHAT, max_tokens=2)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "talaria_ctl.main",
            "--socket",
            torch_daemon.socket_path,
            "instance",
            "memory",
            "cold0",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["managed"] and int(data["capacity_bytes"]) > 0
    regions = [row["region"] for row in data["layout"]]
    assert regions[:2] == ["weights", "kv_pool"] and regions[-1] == "runtime"
    ends = [
        (int(row.get("offset", 0)), int(row["size"]))
        for row in data["layout"]
        if not row["region"].startswith("staged")
    ]
    assert all(
        a + n <= b for (a, n), (b, _) in zip(ends, ends[1:], strict=False)
    )  # regions in order, never overlapping
    assert any(w["to_model"] == "tiny-code" and len(w["phase_ms"]) == 5 for w in data["switches"])


def test_a_switch_has_one_total_in_instance_memory_and_instance_rounds(torch_daemon):
    """The total of a switch is the wall time the round paid for it (its phases are the memory
    substrate's part of that), whether `instance memory` or `instance rounds` shows it."""
    client = _client(torch_daemon)
    for model in ("tiny-code", "tiny-chat", "tiny-code"):  # cold0 switches between its models
        client.chat.completions.create(model=model, messages=CHAT, max_tokens=1)
    memory = _ctl_json(torch_daemon, "instance", "memory", "cold0")["switches"]
    rounds = _ctl_json(torch_daemon, "instance", "rounds", "cold0")["switches"]
    pairs = [
        (m, r)
        for m in memory
        for r in rounds
        if (m["to_model"], m["phase_ms"]) == (r["to_model"], [p["ms"] for p in r["phases"]])
    ]
    assert pairs, (memory, rounds)
    for m, r in pairs:
        assert m["total_ms"] == r["total_ms"], (m, r)
        assert m["total_ms"] >= sum(m["phase_ms"]) * (1 - 1e-9)


def test_tools_render_through_the_template_and_count_tokens_is_exact(torch_daemon):
    """Anthropic body with tools, a mid-conversation system turn and a tool result on the real engine:
    count_tokens agrees with what the call used, and the tools are in the prompt."""
    tool = {
        "name": "read",
        "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
    body = {
        "model": "tiny-code",
        "max_tokens": 3,
        "system": "You are a coding agent.",
        "tools": [tool],
        "messages": [
            {"role": "user", "content": "Open a.py"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a.py"}}
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x = 1"}],
            },
            {"role": "system", "content": "Be brief."},
        ],
    }
    url = torch_daemon.endpoint
    counted = httpx.post(f"{url}/v1/messages/count_tokens", json=body, timeout=30).json()[
        "input_tokens"
    ]
    bare = httpx.post(
        f"{url}/v1/messages/count_tokens", json={**body, "tools": []}, timeout=30
    ).json()
    r = httpx.post(f"{url}/v1/messages", json=body, timeout=60)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert (
        usage["input_tokens"] + usage["cache_read_input_tokens"] == counted > bare["input_tokens"]
    )


def _ctl_json(d, *args):
    import json
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "talaria_ctl.main", "--socket", d.socket_path, *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_unload_frees_the_models_region_and_load_brings_it_back(torch_daemon):
    import time

    client = _client(torch_daemon)
    client.chat.completions.create(model="tiny-code", messages=CHAT, max_tokens=2)
    rounds = _ctl_json(torch_daemon, "instance", "rounds", "cold0")
    named = [w for w in rounds["switches"] if w["phases"]]
    assert named and [p["name"] for p in named[-1]["phases"]] == [
        "save/teardown",
        "open weights",
        "KV shell",
        "runtime and graphs",
        "publish",
    ]
    assert all(isinstance(w["staged_bytes"], int) and w["staged_bytes"] >= 0 for w in named)

    def owners() -> set[str]:
        return {
            row["owner"] for row in _ctl_json(torch_daemon, "instance", "memory", "cold0")["layout"]
        }

    assert "tiny-code" in owners()
    _ctl_json(torch_daemon, "model", "unload", "tiny-code", "--on", "cold0", "--force")
    deadline = time.monotonic() + 20  # the idle instance switches away; staging skips the model
    while "tiny-code" in owners() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "tiny-code" not in owners()
    r = httpx.post(
        f"{torch_daemon.endpoint}/v1/chat/completions",
        timeout=30,
        json={"model": "tiny-code", "messages": CHAT, "max_tokens": 2},
    )
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_loaded"
    _ctl_json(torch_daemon, "model", "load", "tiny-code", "--on", "cold0")
    out = client.chat.completions.create(model="tiny-code", messages=CHAT, max_tokens=2)
    assert out.usage.model_extra["talaria"]["instance"] == "cold0"
    assert "tiny-code" in owners()


def test_metrics_carry_hbm_and_host_kv_per_instance(torch_daemon):
    import time

    from prometheus_client.parser import text_string_to_metric_families

    _client(torch_daemon).chat.completions.create(
        model="tiny-chat",
        messages=CHAT,
        max_tokens=2,
        extra_headers={"x-session-id": "torch-metrics"},
    )
    time.sleep(1.5)  # the daemon reads memory layouts once a second
    text = httpx.get(f"{torch_daemon.endpoint}/metrics", timeout=10).text
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    hbm = {
        (s.labels["instance"], s.labels["region"]): s.value
        for s in samples
        if s.name == "talaria_hbm_bytes"
    }
    assert (
        hbm[("cold0", "weights")] > 0
        and hbm[("cold0", "kv_pool")] > 0
        and hbm[("hot0", "runtime")] > 0
    )
    host = {s.labels["instance"]: s.value for s in samples if s.name == "talaria_host_kv_bytes"}
    assert set(host) == {"hot0", "cold0"} and max(host.values()) > 0
