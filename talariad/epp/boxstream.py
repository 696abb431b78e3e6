"""One box's snapshot stream (`GET /pool/snapshot?stream=1`, `wire.box.STREAM_TYPE`): a
connection whose one response is the box's frames, each handed to a callback as it arrives, in
the event loop's read of the socket (an asyncio `Protocol`: no task, future or timer a frame).

Why not a poll a change: a busy box changes about four times a second, and each change polled
cost a request written and read on both ends and the await machinery of a stream reader
(measured with `bench/epp_bench.py --part poll`); a frame costs a read and its parse.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from talariad.wire.box import STREAM_TYPE

from .boxconn import MAX_HEAD_BYTES, BoxUnreachable, parse_head

MAX_FRAME_BYTES = (
    64 * 1024 * 1024
)  # a frame past this is no box's (a whole view is ~100 B a prefix)


class NotAStream(ValueError):
    """The box answered the stream's request as a poll (an older daemon: 200 or 304) or with an
    error status."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}, not a snapshot stream")
        self.status = status


class StreamEnded(Exception):
    """The callback asked to end the stream (its frames no longer apply: ask anew)."""


class BoxStream(asyncio.Protocol):
    """The stream's connection: it sends `request`, checks the response is a chunked stream of
    `STREAM_TYPE`, and hands each frame (a line, without its newline) to `on_frame`, which
    returns False to end the stream (`StreamEnded`). `ended` resolves when the stream ends: to
    None when the box ended it, else to the error (a reset, a malformed reply, `NotAStream`,
    `StreamEnded`, what `on_frame` raised). `heard`: when a byte last came (`time.monotonic`)."""

    def __init__(self, request: bytes, on_frame: Callable[[bytes], bool]) -> None:
        self._request, self._on_frame = request, on_frame
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()  # received, not yet parsed
        self._lines = bytearray()  # the body, de-chunked, up to a frame's end
        self._started = False  # the response's head was read
        self.ended: asyncio.Future[BaseException | None] = (
            asyncio.get_running_loop().create_future()
        )
        self.heard = time.monotonic()

    def connection_made(self, transport) -> None:
        self._transport = transport
        transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        self.heard = time.monotonic()
        self._buf += data
        try:
            if not self._started and not self._read_head():
                return
            self._read_chunks()
        except Exception as err:  # noqa: BLE001 (handed to the poller through `ended`)
            self.end(err)

    def eof_received(self) -> bool:
        self.end(ConnectionResetError("the box closed the stream"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.end(exc or ConnectionResetError("the box closed the stream"))

    def end(self, why: BaseException | None) -> None:
        """Close the connection; the stream ends with `why`."""
        if not self.ended.done():
            self.ended.set_result(why)
        if self._transport is not None:
            self._transport.close()

    def _read_head(self) -> bool:
        """Whether the response's head is in and says a stream; raises what it is otherwise."""
        at = self._buf.find(b"\r\n\r\n")
        if at < 0:
            if len(self._buf) > MAX_HEAD_BYTES:
                raise ValueError(f"the box's reply headers exceed {MAX_HEAD_BYTES} bytes")
            return False
        status, headers = parse_head(bytes(self._buf[: at + 4]))
        del self._buf[: at + 4]
        kind = headers.get("content-type", "").partition(";")[0].strip().lower()
        if status != 200 or kind != STREAM_TYPE:
            raise NotAStream(status)
        if "chunked" not in headers.get("transfer-encoding", "").lower():
            raise ValueError("a snapshot stream that is not chunked")
        self._started = True
        return True

    def _read_chunks(self) -> None:
        """Each whole chunk's bytes to the body; each whole line of the body to `on_frame`."""
        buf = self._buf
        while (eol := buf.find(b"\r\n")) >= 0:
            size = int(bytes(buf[:eol]).split(b";")[0], 16)
            if size == 0:  # the box ended the stream (it drains)
                self.end(None)
                return
            end = eol + 2 + size
            if len(buf) < end + 2:
                if end > MAX_FRAME_BYTES:
                    raise ValueError(f"a snapshot frame over {MAX_FRAME_BYTES} bytes")
                return
            self._lines += buf[eol + 2 : end]
            del buf[: end + 2]
            self._frames()
            if self.ended.done():
                return

    def _frames(self) -> None:
        lines = self._lines
        start = 0
        while not self.ended.done() and (nl := lines.find(b"\n", start)) >= 0:
            frame = bytes(lines[start:nl])
            start = nl + 1
            if not self._on_frame(frame):
                self.end(StreamEnded())
                return
        del lines[:start]


async def open_stream(
    host: str, port: int, request: bytes, on_frame: Callable[[bytes], bool], timeout_s: float
) -> BoxStream:
    """The box's stream, its request sent. Raises `BoxUnreachable` (nothing listens there),
    TimeoutError past `timeout_s`."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            _, stream = await loop.create_connection(
                lambda: BoxStream(request, on_frame), host, port
            )
    except OSError as err:
        raise BoxUnreachable(f"{host}:{port}: {err}") from err
    return stream
