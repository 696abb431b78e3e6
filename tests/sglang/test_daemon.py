"""`talariad run` with a hot and a cold `executor: sglang` instance, both on fake SGLang servers."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from talariad.replay.client import ReplayOptions, replay
from talariad.replay.scale import load_trace, scale_trace
from tests.support.daemon import start_daemon, stop_daemon
from tests.support.sglang import check_safe_sequence, fake_command, read_log

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, model_dir):
    tmp = tmp_path_factory.mktemp("sglang-daemon")
    logs = {"hot": tmp / "hot.jsonl", "cold": tmp / "cold.jsonl"}
    models = [{"name": n, "path": str(model_dir), "max_context": 4096} for n in ("mh", "m1", "m2")]
    base = {
        "models": models,
        "instances": [
            {
                "name": "hot0",
                "pool": "hot",
                "executor": "sglang",
                "devices": [0, 1, 2, 3],
                "models": ["mh"],
                "sglang": {
                    "launch_command": fake_command(logs["hot"]),
                    "mem_fraction_static": 0.85,
                },
            },
            {
                "name": "cold0",
                "pool": "cold",
                "executor": "sglang",
                "devices": [4, 5, 6, 7],
                "models": ["m1", "m2"],
                "sglang": {"launch_command": fake_command(logs["cold"]), "max_total_tokens": 65536},
            },
        ],
        "policy": {"tau_s": 0.2},
    }
    d = start_daemon(tmp, base=base)
    yield d, logs
    stop_daemon(d)
    d.notify.close()


def _chat(endpoint: str, model: str, stream: bool, session: str):
    body = {
        "model": model,
        "max_tokens": 5,
        "stream": stream,
        "messages": [{"role": "user", "content": f"fix the failing test in {model}"}],
    }
    return httpx.post(
        f"{endpoint}/v1/chat/completions", json=body, headers={"x-session-id": session}, timeout=60
    )


@pytest.mark.parametrize("model", ["mh", "m1", "m2"])
def test_chat_streaming_and_not_on_hot_and_cold(daemon, model):
    d, _ = daemon
    r = _chat(d.endpoint, model, False, f"plain-{model}")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] == 5 and body["choices"][0]["message"]["content"]
    r = _chat(d.endpoint, model, True, f"stream-{model}")
    assert r.status_code == 200
    chunks = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert r.text.rstrip().endswith("data: [DONE]")


def test_replay_across_two_models_on_the_cold_instance(daemon):
    d, logs = daemon
    trace = load_trace("fixed", seed=0, sessions=6)
    sessions = scale_trace(
        trace,
        {m: ("m1", "m2")[i % 2] for i, m in enumerate(trace.models())},
        factor=400,
        output_scale=200,
        gap_cap_s=0.2,
        max_calls=3,
    )
    result = asyncio.run(
        replay(sessions, ReplayOptions(d.endpoint, timeout_s=120, session_tag="rp:"))
    )
    assert result.errors == [] and len(result.run.calls) == sum(len(s) for s in sessions)
    assert {u.instance for u in result.usage} == {"cold0"}
    events = read_log(logs["cold"])
    check_safe_sequence(events)  # also: no call was sent to a released server, no fake died
    switches = [e for e in events if e["event"] == "resume_memory_occupation"]
    assert len(switches) >= 2
    starts = [e["argv"] for e in events if e["event"] == "start"]
    assert all(
        {"--enable-memory-saver", "--enable-weights-cpu-backup", "--enable-metrics"} <= set(a)
        for a in starts
    )
    assert all(
        a[a.index("--tp-size") + 1] == "4" and a[a.index("--base-gpu-id") + 1] == "4"
        for a in starts
    )
    check_safe_sequence(read_log(logs["hot"]))
