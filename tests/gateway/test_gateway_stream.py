"""The gateway's streamed answers: a client that leaves mid-stream ends the stream (its body's
`finally` runs, the response returns normally), without a task group per stream."""

from __future__ import annotations

import asyncio

import pytest

from talariad.gateway.call import Streamed

SCOPE = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}}


class _Client:
    """An ASGI receive/send pair: `receive` answers `http.disconnect` once `leave()` is called
    (or, as uvicorn does, once the response is complete)."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self._gone = asyncio.Event()

    def leave(self) -> None:
        self._gone.set()

    async def receive(self) -> dict:
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.leave()


async def test_a_client_that_leaves_mid_stream_ends_it_and_the_response_returns():
    client, closed, blocked = _Client(), asyncio.Event(), asyncio.Event()

    async def body():
        try:
            yield "data: one\n\n"
            blocked.set()
            await asyncio.Event().wait()  # the instance's next token, which never comes
            yield "data: never\n\n"
        finally:
            closed.set()

    call = asyncio.create_task(Streamed(body())(SCOPE, client.receive, client.send))
    await blocked.wait()
    client.leave()
    await asyncio.wait_for(call, 5)  # returns normally: no CancelledError escapes
    assert closed.is_set() and not call.cancelled()
    assert [m.get("body") for m in client.sent[1:]] == [b"data: one\n\n"]


async def test_a_stream_that_ends_leaves_no_watch_behind():
    client = _Client()

    async def body():
        yield "data: one\n\n"
        yield "data: [DONE]\n\n"

    before = asyncio.all_tasks()
    await Streamed(body())(SCOPE, client.receive, client.send)
    await asyncio.sleep(0)
    assert asyncio.all_tasks() == before
    assert client.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert asyncio.current_task().cancelling() == 0


async def test_a_cancellation_from_elsewhere_still_cancels_the_stream():
    client, blocked = _Client(), asyncio.Event()

    async def body():
        yield "data: one\n\n"
        blocked.set()
        await asyncio.Event().wait()
        yield "data: never\n\n"

    call = asyncio.create_task(Streamed(body())(SCOPE, client.receive, client.send))
    await blocked.wait()
    call.cancel()  # the server stopping, not the client leaving
    with pytest.raises(asyncio.CancelledError):
        await call
