"""Bad input is a 400 in the API's own error shape on every endpoint, count_tokens included, never
a 5xx or a status a client would retry (issue 28, defects 2 and 4). In-process: the gateway over
sim workers, with the instance hop's serialization kept (a request the hop cannot encode fails
there as it does over the socket)."""

from __future__ import annotations

import json

import pytest

CHAT = [{"role": "user", "content": "hi"}]
RAW_SURROGATE = b"a\xed\xa0\x80b"  # U+D800 encoded as if it were a character: not UTF-8
BODIES = {
    "/v1/chat/completions": b'{"model": "tiny-chat", "max_tokens": 2, "messages": '
    b'[{"role": "user", "content": "%s"}]}',
    "/v1/completions": b'{"model": "tiny-chat", "max_tokens": 2, "prompt": "%s"}',
    "/v1/messages": b'{"model": "tiny-chat", "max_tokens": 2, "messages": '
    b'[{"role": "user", "content": "%s"}]}',
    "/v1/messages/count_tokens": b'{"model": "tiny-chat", "messages": '
    b'[{"role": "user", "content": "%s"}]}',
    "/v1/responses": b'{"model": "tiny-chat", "max_output_tokens": 2, "input": "%s"}',
}


async def _post(hop_client, path: str, body: bytes | dict, content_type: str = "application/json"):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await hop_client.post(path, content=content, headers={"content-type": content_type})


def refused(r, path: str) -> dict:
    """`r` is a 400 in the error shape of `path`'s API, with nothing that invites a retry."""
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert "retry-after" not in r.headers
    body = r.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    else:
        assert body["error"]["type"] == "invalid_request_error"
    return body["error"]


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8"])
@pytest.mark.parametrize("path", list(BODIES))
async def test_raw_surrogate_bytes_are_400_on_every_api(hop_client, path, content_type):
    error = refused(await _post(hop_client, path, BODIES[path] % RAW_SURROGATE, content_type), path)
    assert "UTF-8" in error["message"]


@pytest.mark.parametrize("path", list(BODIES))
async def test_escaped_lone_surrogates_are_400_on_every_api(hop_client, path):
    refused(await _post(hop_client, path, BODIES[path] % b"a\\udc80b"), path)


@pytest.mark.parametrize("path", list(BODIES))
async def test_deeply_nested_bodies_are_400_on_every_api(hop_client, path):
    body = BODIES[path] % b"hi"
    deep = body[:-1] + b', "extra": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    error = refused(await _post(hop_client, path, deep), path)
    assert "nest" in error["message"]


def _user_id(value: str) -> dict:
    return {"model": "tiny-chat", "max_tokens": 2, "messages": CHAT, "metadata": {"user_id": value}}


@pytest.mark.parametrize(
    "user_id",
    [
        json.dumps({"session_id": "s\ud800"}),  # JSON escapes it: valid text, invalid once parsed
        '{"session_id": "s", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
    ],
    ids=["lone-surrogate", "deep"],
)
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/chat/completions"])
async def test_bad_json_inside_metadata_user_id_names_no_session(hop_client, path, user_id):
    """A `user_id` that is not strict JSON carries no session, as any other non-JSON one: the call
    is served with the session of its prompt."""
    r = await _post(hop_client, path, _user_id(user_id))
    assert r.status_code == 200, r.text[:300]
    assert r.headers["x-talaria-session-id"].startswith("anon-")


@pytest.mark.parametrize(
    "arguments",
    [json.dumps({"a": "\ud800"}), '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"],
    ids=["lone-surrogate", "deep"],
)
async def test_bad_json_inside_tool_call_arguments_is_kept_as_text(hop_client, arguments):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    body = {
        "model": "tiny-chat",
        "max_tokens": 2,
        "messages": CHAT + [{"role": "assistant", "tool_calls": [call]}],
    }
    r = await _post(hop_client, "/v1/chat/completions", body)
    assert r.status_code in (200, 400), r.text[:300]
    if r.status_code == 400:  # the deep one's text is too long for tiny-chat's context
        assert refused(r, "/v1/chat/completions")["code"] == "context_length_exceeded"


@pytest.mark.parametrize("messages", [5, 1.5, True, "text", {"role": "user"}])
@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"model": "tiny-chat", "max_tokens": 2, "prompt": "hi"}),
        ("/v1/responses", {"model": "tiny-chat", "max_output_tokens": 2, "input": "hi"}),
    ],
)
async def test_a_messages_field_of_any_type_is_never_a_5xx(hop_client, path, body, messages):
    r = await _post(hop_client, path, {**body, "messages": messages})
    assert r.status_code in (200, 400), r.text[:300]
    if r.status_code == 400:
        refused(r, path)


async def test_count_tokens_refuses_a_prompt_that_cannot_fit_without_tokenizing_it(hop_client):
    # tiny-chat's context is 8192 tokens: 1 MB of text cannot fit whatever the tokenizer
    body = {"model": "tiny-chat", "messages": [{"role": "user", "content": "word " * 200_000}]}
    error = refused(await _post(hop_client, "/v1/messages/count_tokens", body), "/v1/messages")
    assert "context" in error["message"] and hop_client.counted == []


async def test_count_tokens_applies_the_string_and_message_limits(hop_client):
    body = {"model": "tiny-chat", "messages": CHAT * 10_001}
    refused(await _post(hop_client, "/v1/messages/count_tokens", body), "/v1/messages")
    assert hop_client.counted == []


async def test_count_tokens_still_counts_a_good_prompt(hop_client):
    body = {"model": "tiny-chat", "messages": CHAT}
    r = await _post(hop_client, "/v1/messages/count_tokens", body)
    assert r.status_code == 200 and r.json()["input_tokens"] > 0 and hop_client.counted
