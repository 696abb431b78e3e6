"""One route table: the picker parses the call paths with it, the gateway serves them from it,
and a body either refuses gets the same error from both."""

from __future__ import annotations

import json

import pytest

from talariad.calls import routes
from talariad.calls.errors import APIError, error_body
from tests.support.scripted import local_gateway

CHAT = {"model": "tiny-agent", "messages": [{"role": "user", "content": "hi"}]}


def test_only_a_call_path_parses_into_a_spec():
    raw = json.dumps(CHAT).encode()
    assert routes.parse("/v1/models", raw) is None
    assert routes.parse("/v1/messages/count_tokens", raw) is None
    spec = routes.parse("/v1/chat/completions?beta=true", raw)  # the query string aside
    assert spec is not None and spec.requested == "tiny-agent" and spec.api == "openai"


def test_the_picker_reads_a_responses_call_without_its_stored_conversation():
    raw = json.dumps({"model": "m", "input": "next", "previous_response_id": "resp_1"}).encode()
    spec = routes.parse("/v1/responses", raw)
    assert spec is not None and [m.content for m in spec.messages] == ["next"]


async def test_the_gateway_serves_each_call_path_with_its_body_model():
    async with local_gateway() as client:
        paths = (await client.get("/openapi.json")).json()["paths"]
    bodies = {
        path: ops["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        for path, ops in paths.items()
        if "post" in ops and path != "/v1/messages/count_tokens"  # no call: no CallSpec
    }
    assert bodies == {
        path: f"#/components/schemas/{route.body.__name__}" for path, route in routes.ROUTES.items()
    }


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/v1/chat/completions", b"{not json"),
        ("/v1/chat/completions", b'{"model": "m"}'),
        ("/v1/chat/completions", b'{"model": "m", "messages": [], "n": 2}'),
        ("/v1/completions", b'{"model": "m", "prompt": ["a", "b"]}'),
        ("/v1/responses", b"[1, 2]"),
        ("/v1/responses", b'{"model": "m", "input": [{"type": "message", "role": "tool"}]}'),
        ("/v1/messages", b'{"model": "m", "messages": "nope"}'),
        ("/v1/messages", b'{"model": "m", "max_tokens": 1, "messages": [{"role": "x"}]}'),
    ],
)
async def test_a_refused_body_gets_the_same_error_from_the_picker_and_the_gateway(path, raw):
    with pytest.raises(APIError) as refused:
        routes.parse(path, raw)
    async with local_gateway() as client:
        r = await client.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == refused.value.status == 400
    assert r.json() == error_body(path, refused.value)
