"""The Anthropic Messages surface, driven by the official `anthropic` client against a real daemon."""

from __future__ import annotations

import anthropic
import httpx
import pytest

pytestmark = pytest.mark.e2e


def _client(d) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=d.endpoint, api_key="unused", max_retries=0, timeout=30)


MSGS = [{"role": "user", "content": "Run the tests."}]


def test_messages_non_streaming(daemon):
    r = _client(daemon).messages.create(
        model="tiny-code",
        max_tokens=7,
        system="You are a coding agent.",
        messages=MSGS,
        metadata={"user_id": "user_x_account_y_session_abc"},
    )
    assert r.type == "message" and r.role == "assistant" and r.stop_reason == "max_tokens"
    assert len(r.content[0].text.split()) == 7
    assert (
        r.usage.output_tokens == 7
        and r.usage.input_tokens > 0
        and r.usage.cache_read_input_tokens == 0
    )


def test_messages_second_turn_reads_cache(daemon):
    client = _client(daemon)
    headers = {"x-claude-code-session-id": "cc-1"}
    first = client.messages.create(
        model="tiny-chat", max_tokens=5, messages=MSGS, extra_headers=headers
    )
    turn2 = MSGS + [
        {"role": "assistant", "content": first.content[0].text},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "3 passed"}],
        },
    ]
    second = client.messages.create(
        model="tiny-chat", max_tokens=5, messages=turn2, extra_headers=headers
    )
    assert second.usage.cache_read_input_tokens > 0


def test_messages_streaming_events(daemon):
    with _client(daemon).messages.stream(model="tiny-chat", max_tokens=4, messages=MSGS) as stream:
        kinds = [ev.type for ev in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and "message_delta" in kinds
    assert len(final.content[0].text.split()) == 4 and final.usage.output_tokens == 4


@pytest.mark.parametrize(
    "body, status, kind",
    [
        ({"model": "tiny-chat", "messages": MSGS}, 400, "invalid_request_error"),
        ({"model": "ghost", "max_tokens": 5, "messages": MSGS}, 404, "not_found_error"),
    ],
)
def test_messages_errors_use_anthropic_shape(daemon, body, status, kind):
    r = httpx.post(f"{daemon.endpoint}/v1/messages?beta=true", json=body, timeout=10)
    assert r.status_code == status
    assert (
        r.json()["type"] == "error"
        and r.json()["error"]["type"] == kind
        and r.json()["error"]["message"]
    )
