"""The front path's transport: TCP_NODELAY on served sockets, and the framed unix-socket call stream
between gateway and instance over a real sim worker."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import socket
import tempfile

import pytest

from talariad import httpserver
from talariad.config import load_config
from talariad.engine.build import build_worker
from talariad.gateway.instances import InstanceDirectory
from talariad.wire import stream
from talariad.wire.messages import (
    ChatMessage,
    DoneEvent,
    ErrorEvent,
    GenerateRequest,
    Query,
    Telemetry,
    TokenEvent,
)

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
    conn = await stream.StreamClient._open(path)
    conn.write(b'{"call_id": 1}')
    ev = stream.parse_event(await conn.read())
    assert isinstance(ev, ErrorEvent) and ev.status == 400 and "call_id" in ev.message
    assert await conn.read() is None  # and the connection is closed
    conn.close()


async def test_a_stale_kept_alive_connection_is_replaced_transparently(served):
    _, path, client, _ = served
    mine, far = socket.socketpair()
    _, stale = await asyncio.get_running_loop().create_unix_connection(
        stream.FrameConnection, sock=mine
    )
    client.idle[path] = [stale]
    far.close()  # what an instance restart does to a connection the gateway kept idle
    events = await _all(client, path, _req("c1"))
    assert isinstance(events[-1], DoneEvent) and events[-1].usage.completion_tokens == 3
    assert client.idle[path] and client.idle[path][0] is not stale


class _Transport:
    """What FrameConnection needs of a transport, recording what is written."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def _conn() -> tuple[stream.FrameConnection, _Transport]:
    conn, transport = stream.FrameConnection(), _Transport()
    conn.connection_made(transport)
    return conn, transport


async def test_frames_are_cut_from_reads_whatever_their_boundaries():
    payloads = [b"one", b"", b"x" * 70_000, b"last"]
    wire = b"".join(stream.frame(p) for p in payloads)
    for step in (1, 3, 4, 5, 4096, len(wire)):
        conn, _ = _conn()
        for at in range(0, len(wire), step):
            conn.data_received(wire[at : at + step])
        conn.eof_received()
        assert [await conn.read() for _ in payloads] == payloads
        assert await conn.read() is None  # a clean EOF between frames


async def test_a_reader_waits_for_a_frame_and_wakes_on_it():
    conn, _ = _conn()
    waiting = asyncio.create_task(conn.read())
    await asyncio.sleep(0)
    assert not waiting.done()
    data = stream.frame(b"hello")
    conn.data_received(data[:6])
    await asyncio.sleep(0)
    assert not waiting.done()  # half a frame is not a frame
    conn.data_received(data[6:])
    assert await waiting == b"hello"


async def test_eof_inside_a_frame_and_an_oversized_frame_are_connection_errors():
    conn, _ = _conn()
    conn.data_received(stream.frame(b"cut short")[:7])
    conn.connection_lost(None)
    with pytest.raises(ConnectionError):
        await conn.read()
    conn, transport = _conn()
    conn.data_received((stream.MAX_FRAME + 1).to_bytes(4, "big"))
    with pytest.raises(ConnectionError):
        await conn.read()
    assert transport.closed


async def test_frames_sent_in_one_loop_step_leave_as_one_write():
    conn, transport = _conn()
    conn.send(b"token")
    conn.send(b"done")
    assert transport.written == []
    await asyncio.sleep(0)
    assert transport.written == [stream.frame(b"token") + stream.frame(b"done")]


async def test_a_failed_hop_is_an_error_event_naming_the_instance(served):
    _, path, client, _ = served
    missing = str(pathlib.Path(path).with_name("gone.sock"))
    (ev,) = [e async for e in client.generate(missing, _req("c1"), "cold0")]
    assert isinstance(ev, ErrorEvent) and ev.message.startswith("instance cold0 failed:")
    with pytest.raises(OSError):  # without a name the caller sees the error itself
        await anext(client.generate(missing, _req("c2")))
    mine, far = socket.socketpair()
    _, dying = await asyncio.get_running_loop().create_unix_connection(
        stream.FrameConnection, sock=mine
    )
    far.sendall(stream.frame(b"not json"))  # a garbled first frame
    client.idle[path] = [dying]
    (ev,) = [e async for e in client.generate(path, _req("c3"), "cold0")]
    assert isinstance(ev, ErrorEvent) and "cold0" in ev.message
    far.close()


async def test_an_aborted_call_ends_with_its_error_and_the_connection_serves_the_next(served):
    worker, path, client, _ = served
    events = client.generate(path, _req("long", max_tokens=2000))
    assert isinstance(await anext(events), TokenEvent)
    assert worker.abort_all("shutting down") == 1
    rest = [ev async for ev in events]
    assert isinstance(rest[-1], ErrorEvent) and rest[-1].code == "shutting_down"
    (conn,) = client.idle[path]  # the error ended the call cleanly: the connection is kept
    # at once, while the aborted call may still be stopping: none of its late events leak into
    # the next call's stream on the same connection
    events = await _all(client, path, _req("next"))
    assert [type(e) for e in events] == [TokenEvent] * 3 + [DoneEvent]
    assert events[-1].usage.completion_tokens == 3 and client.idle[path] == [conn]
    for _ in range(300):
        if not worker.calls:
            break
        await asyncio.sleep(0.01)
    assert worker.calls == {} and worker.queues == {}


async def test_reports_are_answered_on_the_call_stream_between_calls(served):
    worker, path, client, _ = served
    await _all(client, path, _req("c1"))
    full = Telemetry.model_validate_json(await client.query(path, Query(query="telemetry")))
    assert full.sessions_base is None and [s.session_id for s in full.sessions] == ["s"]
    since = Query(query="telemetry", since=full.sessions_epoch)
    quiet = Telemetry.model_validate_json(await client.query(path, since))
    assert quiet.sessions_base == full.sessions_epoch and quiet.sessions == []
    rounds = json.loads(await client.query(path, Query(query="rounds", limit=5)))
    assert rounds.keys() == worker.rounds(5).keys() and rounds["instance"] == worker.inst.name
    memory = json.loads(await client.query(path, Query(query="memory")))
    assert memory == json.loads(json.dumps(worker.memory_report()))
    process = json.loads(await client.query(path, Query(query="process")))
    assert process["pid"] == os.getpid() and process["asyncio_tasks"] >= 1  # the worker's loop
    assert process["rss_bytes"] > 0 and process["gc_objects"] > 0
    events = await _all(client, path, _req("c2"))  # the same connection serves the next call
    assert isinstance(events[-1], DoneEvent) and len(client.idle[path]) == 1
    conn = await stream.StreamClient._open(path)
    conn.write(b'{"query":"everything"}')
    ev = stream.parse_event(await conn.read())
    assert isinstance(ev, ErrorEvent) and ev.status == 400 and "query" in ev.message
    assert await conn.read() is None
    conn.close()


async def test_the_directory_polls_an_instance_with_a_socket_on_its_call_stream(served):
    worker, path, _, _ = served
    name, seen, missed, sizes = worker.inst.name, [], [], []
    sockets = {name: path}
    directory = InstanceDirectory(
        lambda: {name: "http://127.0.0.1:9"},  # nothing listens there: HTTP would fail
        0.25,
        on_telemetry=lambda t, now: seen.append(t),
        on_unhealthy=lambda n, now: missed.append(n),
        sockets=lambda: sockets,
        on_payload=lambda n, size: sizes.append(size),
    )
    try:
        await _all(directory.client.streams, path, _req("c1"))
        await directory.poll_once()
        await directory.poll_once()  # the second carries changes since the first: none
        assert [t.sessions_base for t in seen] == [None, seen[0].sessions_epoch]
        assert len(seen[0].sessions) == 1 and seen[1].sessions == [] and sizes[1] < sizes[0]
        assert directory.snapshot(name) is seen[1] and missed == []
        assert (await directory.client.rounds(name, 5))["instance"] == name
        assert (await directory.client.memory(name))["instance"] == name
        assert await directory.client.rounds(name, 10_000) is None  # past the internal API's bound
        sockets[name] = str(pathlib.Path(path).with_name("gone.sock"))
        await directory.poll_once()
        assert missed == [name] and len(seen) == 2
    finally:
        await directory.aclose()
