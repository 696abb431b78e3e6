"""The poller's HTTP/1.1 connection (`epp.boxconn`) against a scripted server on a loopback
port: kept alive across GETs, opened again once when the box closed it meanwhile, every way a
body's length is given, and each failure as the poller tells them apart."""

from __future__ import annotations

import asyncio
import socket

import pytest

from talariad.epp.boxconn import BoxConnection, BoxUnreachable
from tests.support.loopback import LoopbackServer


class Scripted(LoopbackServer):
    """A server answering each request with the next of `replies` (bytes, b"": nothing; None:
    close the connection without answering), counting its connections and keeping the
    requests."""

    def __init__(self, replies: list[bytes | None]) -> None:
        self.replies, self.connections, self.requests = list(replies), 0, []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.replies:
                self.requests.append(await reader.readuntil(b"\r\n\r\n"))
                reply = self.replies.pop(0)
                if reply is None:
                    break
                if not reply:  # no answer: wait for the client to give up
                    await reader.read()
                    break
                writer.write(reply)
                await writer.drain()
                sized = any(h in reply for h in (b"content-length", b" 304 ", b"chunked"))
                if b"connection: close" in reply.lower() or not sized:
                    break  # the body runs to the connection's end
        except asyncio.IncompleteReadError:
            pass
        writer.close()


def _ok(body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n{head}\r\n".encode() + body


NOT_MODIFIED = b'HTTP/1.1 304 Not Modified\r\netag: "e"\r\nx-talaria-age-s: 0.25\r\n\r\n'


def _run(replies, steps):
    async def go():
        server = Scripted(replies)
        async with server as endpoint:
            conn = BoxConnection(endpoint, {"authorization": "Bearer t"})
            out = [await step(conn) for step in steps]
            conn.close()
        return server, out

    return asyncio.run(go())


def _get(params=None, headers=None, timeout_s=5.0):
    return lambda conn: conn.get("/pool/snapshot", params or {}, headers, timeout_s)


def test_gets_share_one_kept_connection_and_send_their_headers():
    server, (a, b, c) = _run(
        [_ok(b'{"a":1}'), NOT_MODIFIED, _ok(b"x")],
        [
            _get({"since": "5"}),
            _get({"since": "5", "wait": "0.5"}, {"if-none-match": '"e"'}),
            _get(),
        ],
    )
    assert server.connections == 1
    assert (a.status, a.body, b.status, b.body, c.body) == (200, b'{"a":1}', 304, b"", b"x")
    assert b.headers["x-talaria-age-s"] == "0.25"
    first, second = server.requests[0].decode(), server.requests[1].decode()
    assert first.startswith("GET /pool/snapshot?since=5 HTTP/1.1\r\n")
    assert "authorization: Bearer t\r\n" in first and "host: 127.0.0.1:" in first
    assert 'if-none-match: "e"\r\n' in second and "wait=0.5" in second


def test_a_connection_the_box_closed_is_opened_again_once():
    server, (a, b) = _run([_ok(b"1"), None, _ok(b"2")], [_get(), _get()])
    assert (a.body, b.body, server.connections) == (b"1", b"2", 2)


def test_chunked_and_to_the_end_bodies():
    chunked = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n"
    )
    to_end = b"HTTP/1.1 200 OK\r\n\r\nall of it"
    server, (a, b, c) = _run([chunked, to_end, _ok(b"z")], [_get(), _get(), _get()])
    assert (a.body, b.body, c.body) == (b"abcde", b"all of it", b"z")
    assert server.connections == 2  # a body to the connection's end ends the connection


def test_failures_as_the_poller_tells_them_apart():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(BoxUnreachable):
        asyncio.run(BoxConnection(closed, {}).get("/", {}, None, 5.0))
    with pytest.raises(ValueError, match="not an HTTP/1.1 response"):
        _run([b"SSH-2.0-OpenSSH\r\n\r\n"], [_get()])
    with pytest.raises(ValueError, match="inside its body"):
        _run([b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\nconnection: close\r\n\r\nabc"], [_get()])
    with pytest.raises(ConnectionResetError):  # a new connection closed before any reply
        _run([None], [_get()])


def test_a_reply_past_the_timeout_closes_the_connection():
    async def go():
        server = Scripted([b""])  # reads the request, writes nothing
        async with server as endpoint:
            conn = BoxConnection(endpoint, {})
            with pytest.raises(TimeoutError):
                await conn.get("/", {}, None, 0.2)
            assert conn._writer is None

    asyncio.run(go())
