"""The front path's transport: TCP_NODELAY on served sockets, and the framed unix-socket call stream
between gateway and instance over a real sim worker."""

from __future__ import annotations

import asyncio
import pathlib
import socket
import tempfile

import pytest

from talariad import httpserver
from talariad.config import load_config
from talariad.engine import stream
from talariad.engine.build import build_worker
from talariad.engine.messages import ChatMessage, DoneEvent, ErrorEvent, GenerateRequest, TokenEvent

ROOT = pathlib.Path(__file__).resolve().parents[2]


async def test_accepted_connections_have_nodelay():
    sock = httpserver.bind("127.0.0.1", 0)
    seen: list[int] = []

    class Probe(asyncio.Protocol):
        def connection_made(self, transport):
            seen.append(
                transport.get_extra_info("socket").getsockopt(
                    socket.IPPROTO_TCP, socket.TCP_NODELAY
                )
            )

    server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
    try:
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
    finally:
        server.close()
    assert seen and seen[0] != 0  # without it Nagle delays each small kept-alive response ~40 ms


@pytest.fixture
async def served():
    cfg = load_config(ROOT / "etc" / "talaria.yaml")
    cfg = cfg.model_copy(
        update={"instances": [i.model_copy(update={"executor": "sim"}) for i in cfg.instances]}
    )
    worker = build_worker(cfg, next(i for i in cfg.instances if i.pool == "cold"))
    loop = asyncio.create_task(worker.run())
    with tempfile.TemporaryDirectory(prefix="tl-") as d:  # short: unix socket paths are limited
        path = str(pathlib.Path(d) / "calls.sock")
        server = await stream.serve(worker, path)
        client = stream.StreamClient()
        try:
            yield worker, path, client, server
        finally:
            await client.aclose()
            server.close()
            loop.cancel()


def _req(call_id: str, max_tokens: int = 3) -> GenerateRequest:
    return GenerateRequest(
        call_id=call_id,
        session_id="s",
        model="tiny-code",
        max_tokens=max_tokens,
        messages=[ChatMessage(role="user", content="hello there")],
    )


async def _all(client, path, req):
    return [ev async for ev in client.generate(path, req)]


async def test_a_call_streams_tokens_then_done_and_the_connection_is_reused(served):
    worker, path, client, _ = served
    events = await _all(client, path, _req("c1"))
    assert [type(e) for e in events] == [TokenEvent] * 3 + [DoneEvent]
    assert events[-1].usage.completion_tokens == 3
    (conn,) = client.idle[path]
    second = await _all(client, path, _req("c2"))
    assert (
        isinstance(second[-1], DoneEvent) and second[-1].usage.cached_tokens > 0
    )  # same session's prefix
    assert client.idle[path] == [conn]  # one kept-alive connection served both calls


async def test_a_gateway_that_leaves_mid_call_cancels_it_in_the_instance(served):
    worker, path, client, _ = served
    events = client.generate(path, _req("long", max_tokens=2000))
    assert isinstance(await anext(events), TokenEvent)
    await events.aclose()
    for _ in range(300):
        if not worker.calls:
            break
        await asyncio.sleep(0.01)
    assert worker.calls == {} and worker.queues == {}
    assert client.idle.get(path, []) == []  # a connection closed mid-call is not reused


async def test_a_malformed_request_frame_gets_a_400_error_event(served):
    _, path, _, _ = served
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(stream.frame(b'{"call_id": 1}'))
    ev = stream.parse_event(await stream.read_frame(reader))
    assert isinstance(ev, ErrorEvent) and ev.status == 400 and "call_id" in ev.message
    assert await stream.read_frame(reader) is None  # and the connection is closed
    writer.close()


async def test_a_stale_kept_alive_connection_is_replaced_transparently(served):
    _, path, client, _ = served
    mine, far = socket.socketpair()
    stale = await asyncio.open_unix_connection(sock=mine)
    far.close()  # what an instance restart does to a connection the gateway kept idle
    client.idle[path] = [stale]
    events = await _all(client, path, _req("c1"))
    assert isinstance(events[-1], DoneEvent) and events[-1].usage.completion_tokens == 3
    assert client.idle[path] and client.idle[path][0] is not stale
