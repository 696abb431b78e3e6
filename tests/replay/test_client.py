"""Real-mode replay: the closed-loop client against a real `talariad`, and its error handling."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from rich.console import Console

from talariad.replay.__main__ import main
from talariad.replay.client import ReplayOptions, replay, served_models
from talariad.replay.report import print_report
from talariad.replay.scale import Conversation, ScaledCall, count_tokens, map_models, scale_trace
from talariad.replay.trace import Trace, TraceCall
from tests.support.daemon import start_daemon, stop_daemon

pytestmark = pytest.mark.e2e

# Two sessions on two trace models; prompts of thousands of tokens, scaled down by 50.
TRACE = Trace(
    [
        [
            TraceCall("issue-a", 0, "big-1", 6000, 0, 6, 0.0),
            TraceCall("issue-a", 1, "big-1", 6600, 6006, 5, 0.2),
            TraceCall("issue-a", 2, "big-1", 7000, 6605, 4, 0.1),
        ],
        [
            TraceCall("issue-b", 0, "big-2", 5000, 0, 5, 0.0),
            TraceCall("issue-b", 1, "big-2", 5500, 5005, 6, 0.3),
        ],
    ]
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("talariad"))
    yield d
    stop_daemon(d)
    d.notify.close()


@pytest.fixture(scope="module")
def result(daemon):
    served = asyncio.run(served_models(daemon.endpoint + "/v1"))
    sessions = scale_trace(TRACE, map_models(TRACE.models(), served), factor=50)
    opts = ReplayOptions(daemon.endpoint + "/v1", timeout_s=120, start_interval_s=0.05)
    return asyncio.run(replay(sessions, opts)), served


def test_every_call_is_recorded(result):
    res, served = result
    assert res.errors == []
    assert sorted((c.session_id, c.call_idx) for c in res.run.calls) == [
        ("issue-a", 0),
        ("issue-a", 1),
        ("issue-a", 2),
        ("issue-b", 0),
        ("issue-b", 1),
    ]
    assert sorted(s.session_id for s in res.run.sessions) == ["issue-a", "issue-b"]
    assert {c.model for c in res.run.calls} <= set(served)
    assert all(c.instance for c in res.run.calls)


def test_sessions_carry_their_id(result):
    res, _ = result
    for u in res.usage:
        assert u.sent_session_id.endswith(":" + u.session_id)
        assert u.server_session_id == u.sent_session_id


def test_continuations_reuse_cached_prefix(result):
    res, _ = result
    by_key = {(u.session_id, u.call_idx): u for u in res.usage}
    for (sid, k), u in by_key.items():
        if k > 0:
            prev = by_key[(sid, k - 1)]
            assert u.cached_tokens > 0
            assert u.prompt_tokens > prev.prompt_tokens + prev.completion_tokens - 1
    returning = [c for c in res.run.calls if c.returning]
    assert all(c.same_instance is not None for c in returning)


def test_ttft_is_schedule_aware(result):
    res, _ = result
    calls = {(c.session_id, c.call_idx): c for c in res.run.calls}
    gaps = {(t.session_id, t.call_idx): t.gap_s for t in TRACE.calls()}
    assert calls[("issue-a", 0)].intended_s == 0.0
    assert calls[("issue-b", 0)].intended_s == pytest.approx(0.05)
    for (sid, k), c in calls.items():
        assert 0 <= c.ttft_s and c.first_token_s <= c.done_s
        if k > 0:  # released one gap after the previous response, and TTFT runs from there
            assert c.intended_s == pytest.approx(calls[(sid, k - 1)].done_s + gaps[(sid, k)])
    sessions = {s.session_id: s for s in res.run.sessions}
    assert sessions["issue-a"].end_s == calls[("issue-a", 2)].done_s


def test_report_renders(result):
    res, _ = result
    console = Console(record=True, width=400)  # a real-mode replay prints every column
    print_report([res.run], console, title="real")
    text = console.export_text()
    assert "SCT p50/p95" in text
    row = next(line for line in text.splitlines() if line.startswith("│ real "))
    assert "-" not in row.split("│")[2]  # SCT cell has numbers


def test_cli_run_prints_table_and_json(daemon, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(c.to_json() + "\n" for c in TRACE.calls()))
    out = tmp_path / "out.json"
    rc = main(
        [
            "run",
            "--endpoint",
            daemon.endpoint + "/v1",
            str(trace),
            "--scale",
            "100",
            "--sessions",
            "1",
            "--timeout",
            "60",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    obj = json.loads(out.read_text())
    assert obj["rows"][0]["calls"] == 3 and obj["rows"][0]["sessions"] == 1 and obj["errors"] == []


def test_cli_bad_input_exits_2(daemon, tmp_path, capsys):
    assert main(["run", "--endpoint", daemon.endpoint, str(tmp_path / "missing.jsonl")]) == 2
    assert (
        main(["run", "--endpoint", daemon.endpoint, "fixed", "--model-map", "qwen3-235b=nope"]) == 2
    )
    err = capsys.readouterr().err
    assert "missing.jsonl" in err and "no model 'nope'" in err


# --- HTTP behaviour against a scripted transport --------------------------------------------------


def _sse(*texts: str) -> bytes:
    chunks = [{"choices": [{"delta": {"content": t}}]} for t in texts]
    chunks.append(
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 9,
                "completion_tokens": len(texts),
                "prompt_tokens_details": {"cached_tokens": 0},
                "talaria": {"instance": "i0", "kv_source": "none", "route": "cost"},
            },
        }
    )
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def _one_call(max_tokens: int = 2) -> list[list[ScaledCall]]:
    return [
        [
            ScaledCall("s", 0, "m", "m", 20, 1.0, max_tokens, 0.0),
            ScaledCall("s", 1, "m", "m", 5, 1.0, 2, 0.0),
        ]
    ]


def test_429_is_retried_and_the_wait_counts_in_ttft():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["x-session-id"])
        if len(seen) == 1:
            return httpx.Response(
                429, headers={"Retry-After": "0.2"}, json={"error": {"message": "busy"}}
            )
        return httpx.Response(
            200, content=_sse("a", " b"), headers={"content-type": "text/event-stream"}
        )

    res = asyncio.run(
        replay(
            _one_call(),
            ReplayOptions("http://x/v1", session_tag="t:"),
            httpx.MockTransport(handler),
        )
    )
    assert res.errors == [] and res.retries == 1 and seen == ["t:s"] * 3
    first = min(res.run.calls, key=lambda c: c.call_idx)
    assert first.intended_s == 0.0 and first.ttft_s >= 0.2  # the retry wait is part of the TTFT


def test_errors_are_recorded_and_retries_bounded():
    def handler(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["max_tokens"] == 7:
            return httpx.Response(400, json={"error": {"message": "bad body"}})
        return httpx.Response(
            429, headers={"Retry-After": "0"}, json={"error": {"message": "busy"}}
        )

    res = asyncio.run(
        replay(
            _one_call(7) + [[ScaledCall("u", 0, "m", "m", 3, 1.0, 2, 0.0)]],
            ReplayOptions("http://x", max_retries=2),
            httpx.MockTransport(handler),
        )
    )
    errors = {e.session_id: e for e in res.errors}
    assert errors["s"].status == 400 and "bad body" in errors["s"].message
    assert errors["u"].status == 429 and "3 tries" in errors["u"].message and res.retries == 2
    assert res.run.calls == [] and res.run.sessions == []


def test_total_timeout_cancels_stuck_sessions():
    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(30)
        return httpx.Response(200, content=_sse("x"))

    res = asyncio.run(
        replay(_one_call(), ReplayOptions("http://x", timeout_s=0.3), httpx.MockTransport(handler))
    )
    assert [(e.session_id, e.call_idx, e.status) for e in res.errors] == [("s", 0, None)]
    assert "timeout" in res.errors[0].message


# --- synthesized bodies --------------------------------------------------------------------------


def test_each_prompt_extends_the_previous_prompt_and_answer():
    calls = scale_trace(TRACE, {"big-1": "m1", "big-2": "m2"}, factor=50)[0]
    conv = Conversation("issue-a")
    first = conv.messages(calls[0])
    assert sum(count_tokens(m["content"]) for m in first) == 120
    conv.answered("the answer")
    second = conv.messages(calls[1])
    assert second[:2] == first and second[2] == {"role": "assistant", "content": "the answer"}
    assert count_tokens(second[3]["content"]) == calls[1].new_tokens == round(594 / 50)


def test_partial_reuse_replaces_the_tail():
    conv = Conversation("x")
    conv.messages(ScaledCall("x", 0, "m", "m", 90, 1.0, 1, 0.0))  # system 30, user 60
    conv.answered("one two three four five six seven eight nine ten")
    msgs = conv.messages(ScaledCall("x", 1, "m", "m", 5, 0.4, 1, 0.0))
    assert msgs[0]["role"] == "system" and len(msgs) == 2  # 40% of 100 keeps only the system prompt
    assert count_tokens(msgs[1]["content"]) == 100 - 30 + 5
