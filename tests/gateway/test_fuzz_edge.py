"""A bounded fuzz of the five generation APIs in-process: fuzzed bodies (wrong types at any field,
junk, huge and negative numbers, deep nesting, lone surrogates, mangled bytes) are never a 5xx
nor a status that invites a retry, and the gateway still serves afterwards. The same requests
at a running daemon, in their thousands: bench/fuzz.py."""

from __future__ import annotations

from tests.support import fuzz

EXAMPLES = 150
"""A few seconds of requests (about thirty per API); a fixed draw, so a failure is the same on every
run. Volume is bench/fuzz.py's."""


async def test_fuzzed_requests_are_never_a_5xx_or_retryable(hop_client):
    for path, kind, content in fuzz.cases(EXAMPLES):
        r = await hop_client.post(path, content=content, headers={"content-type": kind})
        assert fuzz.acceptable(r.status_code, r.headers), (path, content[:300], r.text[:300])
    assert (await hop_client.get("/health")).status_code == 200
    chat = {"model": "tiny-chat", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    r = await hop_client.post("/v1/chat/completions", json=chat)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
