"""A box's snapshot stream as the poller reads it (`epp.boxstream`): its bytes however they are
split reach the callback as whole frames in order, and each way a stream ends tells the poller
what to do next."""

from __future__ import annotations

import asyncio

import pytest

from talariad.epp.boxstream import BoxStream, NotAStream, StreamEnded
from talariad.wire.box import STREAM_TYPE

HEAD = (
    f"HTTP/1.1 200 OK\r\ncontent-type: {STREAM_TYPE}\r\ntransfer-encoding: chunked\r\n\r\n"
).encode()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Transport:
    """What the stream writes and whether it closed."""

    def __init__(self) -> None:
        self.written, self.closed = b"", False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True


def _feed(pieces: list[bytes], on_frame=None) -> tuple[BoxStream, list[bytes], _Transport]:
    """A stream fed `pieces` as reads; its frames, and its transport."""
    frames: list[bytes] = []

    async def go() -> tuple[BoxStream, _Transport]:
        stream = BoxStream(
            b"GET / HTTP/1.1\r\n\r\n", on_frame or (lambda f: frames.append(f) or True)
        )
        transport = _Transport()
        stream.connection_made(transport)
        for piece in pieces:
            stream.data_received(piece)
        return stream, transport

    stream, transport = asyncio.run(go())
    return stream, frames, transport


def test_frames_split_anyhow_reach_the_callback_whole_and_in_order():
    body = _chunk(b'{"version":1}\n0.25\n') + _chunk(b'{"version"') + _chunk(b":2}\n")
    body += _chunk(b"0.5\n") + b"0\r\n\r\n"
    whole = HEAD + body
    for pieces in (
        [whole],
        [whole[i : i + 1] for i in range(len(whole))],
        [whole[:50], whole[50:]],
    ):
        stream, frames, transport = _feed(pieces)
        assert frames == [b'{"version":1}', b"0.25", b'{"version":2}', b"0.5"]
        assert stream.ended.result() is None and transport.closed  # the box ended it
        assert transport.written == b"GET / HTTP/1.1\r\n\r\n"


def test_a_reply_that_is_no_stream_is_told_apart():
    old = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    stream, frames, transport = _feed([old])
    why = stream.ended.result()
    assert isinstance(why, NotAStream) and why.status == 200 and transport.closed and not frames
    denied = b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n"
    assert _feed([denied])[0].ended.result().status == 401
    unchunked = HEAD.replace(b"transfer-encoding: chunked", b"content-length: 9")
    assert isinstance(_feed([unchunked])[0].ended.result(), ValueError)


def test_a_frame_the_callback_refuses_or_cannot_read_ends_the_stream():
    seen: list[bytes] = []
    pieces = [HEAD + _chunk(b"1\n") + _chunk(b"2\n3\n")]
    stream, _, transport = _feed(pieces, lambda f: seen.append(f) or f != b"2")
    assert seen == [b"1", b"2"] and isinstance(stream.ended.result(), StreamEnded)
    assert transport.closed

    def unreadable(frame: bytes) -> bool:
        raise ValueError(f"not a frame: {frame!r}")

    stream, _, transport = _feed(pieces, unreadable)
    assert isinstance(stream.ended.result(), ValueError) and transport.closed


@pytest.mark.parametrize("cut", [b"zz\r\n", b"5\r\nab"])
def test_a_connection_lost_mid_stream_ends_it_with_the_error(cut):
    frames: list[bytes] = []

    async def go() -> BoxStream:
        stream = BoxStream(b"", lambda f: frames.append(f) or True)
        stream.connection_made(_Transport())
        stream.data_received(HEAD + cut)
        stream.connection_lost(None)
        return stream

    why = asyncio.run(go()).ended.result()
    assert isinstance(why, ValueError if cut.startswith(b"zz") else ConnectionResetError)
    assert not frames
