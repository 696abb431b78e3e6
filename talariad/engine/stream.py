"""The gateway → instance call stream: length-prefixed JSON frames over a unix socket.

A connection carries one call at a time: the gateway sends one `GenerateRequest` frame, the
instance answers with event frames (`TokenEvent`… then one `DoneEvent` or `ErrorEvent`), and the
connection is ready for the next call. A gateway that goes away mid-call closes the connection; the
instance sees the EOF and cancels the call, as it does when an HTTP client disconnects.

Why not the internal HTTP API for this hop: on loopback TCP an HTTP client and server (httpx,
uvicorn, FastAPI) cost more than a millisecond of CPU per call in Python; this costs a tenth of
that (bench/front_bench.py). Both ends are one `asyncio.Protocol` (`FrameConnection`) rather than
streams: frames are cut out of each read as it arrives, so a call's token and done frames, which
usually come in one read, cost one wake-up. The frames are JSON written by pydantic's serializer,
so the event schema stays the one in `engine/messages.py`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import struct
from collections.abc import AsyncIterator

from typing import Annotated

from pydantic import Field, TypeAdapter, ValidationError

from talariad.engine.messages import ErrorEvent, GenerateRequest, StreamEvent, TokenEvent

log = logging.getLogger("talariad.stream")

_EVENT = TypeAdapter(Annotated[StreamEvent, Field(discriminator="type")])
_HEADER = struct.Struct("!I")
MAX_FRAME = 64 << 20  # a request frame carries the whole prompt; refuse anything absurd


def frame(payload: bytes) -> bytes:
    return _HEADER.pack(len(payload)) + payload


def parse_event(payload: bytes) -> StreamEvent:
    return _EVENT.validate_json(payload)


class Wakeup:
    """One waiter at a time, woken by `set` (no lock or waiter list: each end of a stream has
    a single consumer, and an `asyncio.Event` per call costs more)."""

    __slots__ = ("_future",)

    def __init__(self) -> None:
        self._future: asyncio.Future | None = None

    async def wait(self) -> None:
        self._future = asyncio.get_running_loop().create_future()
        try:
            await self._future
        finally:
            self._future = None

    def set(self) -> None:
        if self._future is not None and not self._future.done():
            self._future.set_result(None)


class FrameConnection(asyncio.Protocol):
    """One end of a call-stream connection: `read` the next frame, `send` frames.

    Frames written within one event-loop step leave as one send (`send`): a call's last token and
    its done event usually come together, and each send wakes the other end once."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._partial = bytearray()  # the start of a frame not received whole yet
        self._need = 0  # the bytes that frame takes, header included (4 while the header is short)
        self._frames: collections.deque[bytes] = collections.deque()
        self._wakeup = Wakeup()
        self._error: Exception | None = None
        self._closed = False  # the other end closed, or the connection is lost
        self._pending: list[bytes] = []
        self._paused: asyncio.Future | None = None  # set while the transport's buffer is full

    # -- asyncio.Protocol

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._partial:  # a frame arriving in many reads is joined once, when it is whole
            self._partial += data
            if len(self._partial) < self._need:
                return
            data, self._partial = bytes(self._partial), bytearray()
        at, end = 0, len(data)
        while end - at >= 4:
            (size,) = _HEADER.unpack_from(data, at)
            if size > MAX_FRAME:
                self._fail(ConnectionError(f"frame of {size} bytes exceeds {MAX_FRAME}"))
                return
            if end - at - 4 < size:
                break
            self._frames.append(data[at + 4 : at + 4 + size])
            at += 4 + size
        if at < end:
            self._partial += data[at:]
            self._need = 4 + size if end - at >= 4 else 4
        self._wake()

    def eof_received(self) -> bool:
        self._closed = True
        self._wake()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if exc is not None and self._error is None:
            self._error = exc
        self._wake()
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)

    def pause_writing(self) -> None:
        self._paused = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)
        self._paused = None

    # -- reading

    def at_eof(self) -> bool:
        """The other end is gone (it sends nothing mid-call, so mid-call this means it left)."""
        return self._closed

    async def read(self) -> bytes | None:
        """The next frame's payload; None at a clean EOF between frames."""
        while not self._frames:
            if self._error is not None:
                raise self._error
            if self._closed:
                if self._partial:
                    raise ConnectionError("connection closed inside a frame")
                return None
            await self._wakeup.wait()
        return self._frames.popleft()

    def _wake(self) -> None:
        self._wakeup.set()

    def _fail(self, err: Exception) -> None:
        self._error, self._closed = err, True
        self._wake()
        self.close()

    # -- writing

    def write(self, payload: bytes) -> None:
        """Send one frame now."""
        self.transport.write(frame(payload))

    def send(self, payload: bytes) -> None:
        """Send one frame with the others written in this event-loop step (see the class)."""
        if not self._pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self._pending.append(frame(payload))

    def flush(self) -> None:
        if self._pending:
            if not self.transport.is_closing():
                self.transport.write(b"".join(self._pending))
            self._pending.clear()

    async def drain(self) -> None:
        """Wait while the transport's buffer is full; ConnectionResetError once it is lost."""
        if self._closed and self.transport.is_closing():
            raise ConnectionResetError("Connection lost")
        if self._paused is not None:
            await self._paused

    def usable(self) -> bool:
        return not self._closed and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


# ---- instance side ------------------------------------------------------------------------------


async def serve(worker, path: str) -> asyncio.AbstractServer:
    """Serve `worker.generate` on a unix socket at `path` (owner-only)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    loop = asyncio.get_running_loop()
    server = await loop.create_unix_server(lambda: _Served(worker), path)
    os.chmod(path, 0o600)
    return server


class _Served(FrameConnection):
    """An instance's end of one connection: its calls run one after another in one task."""

    def __init__(self, worker) -> None:
        super().__init__()
        self.worker = worker

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.task = asyncio.get_running_loop().create_task(_connection(self.worker, self))


async def _connection(worker, conn: FrameConnection) -> None:
    try:
        while (payload := await conn.read()) is not None:
            try:
                req = GenerateRequest.model_validate_json(payload)
            except ValidationError as err:
                bad = ErrorEvent(
                    status=400, code="invalid_request", message=f"bad generate request: {err}"
                )
                conn.write(bad.model_dump_json().encode())
                break
            if not await _one_call(worker, req, conn):
                break
    except ConnectionError as err:
        log.debug("call stream closed: %s", err)
    except asyncio.CancelledError:  # the instance is shutting down; nothing awaits this task
        pass
    finally:
        conn.close()


async def _one_call(worker, req: GenerateRequest, conn: FrameConnection) -> bool:
    """Stream one call's events; False when the gateway went away (the call is then cancelled).
    The gateway sends nothing mid-call, so its side at EOF means it left."""
    events = worker.generate(req)
    try:
        async for ev in events:
            conn.send(ev.model_dump_json().encode())
            if conn.at_eof():
                return False
            await conn.drain()
        return not conn.at_eof()
    finally:
        conn.flush()
        await events.aclose()  # on a disconnect this cancels the call in the worker


# ---- gateway side -------------------------------------------------------------------------------


class StreamClient:
    """Kept-alive call-stream connections per instance socket; one call per connection at a time."""

    def __init__(self) -> None:
        self.idle: dict[str, list[FrameConnection]] = {}

    async def generate(
        self, path: str, req: GenerateRequest, name: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        """The call's events. `name`: the instance's, to end the stream with an `ErrorEvent`
        naming it when the hop fails (a socket error, a garbled frame) rather than raise."""
        try:
            conn, data = await self._send(path, req.model_dump_json().encode())
        except (OSError, ValueError) as err:
            if name is None:
                raise
            yield _failed(name, err)
            return
        clean = False
        try:
            while data is not None:
                ev = parse_event(data)
                if not isinstance(ev, TokenEvent):
                    clean = True  # the call is over and the connection is ready for the next one
                    self.idle.setdefault(path, []).append(conn)
                    yield ev
                    return
                yield ev
                data = await conn.read()
            raise ConnectionError("instance closed the call stream")
        except (OSError, ValueError) as err:  # ValueError: a garbled frame
            if name is None:
                raise
            yield _failed(name, err)
        finally:
            if not clean:  # abandoned or failed mid-call: closing tells the instance to cancel it
                conn.close()

    async def _send(self, path: str, payload: bytes) -> tuple[FrameConnection, bytes | None]:
        """Send a request and read its first frame; a stale kept-alive connection (the instance
        restarted since) is replaced by a fresh one once."""
        reused, conn = await self._connection(path)
        try:
            conn.write(payload)
            first = await conn.read()
        except OSError:
            if not reused:
                conn.close()
                raise
            first = None
        except BaseException:  # cancelled: the instance must see the call abandoned
            conn.close()
            raise
        if first is not None or not reused:
            return conn, first
        conn.close()
        conn = await self._open(path)
        try:
            conn.write(payload)
            return conn, await conn.read()
        except BaseException:
            conn.close()
            raise

    async def _connection(self, path: str) -> tuple[bool, FrameConnection]:
        pool = self.idle.get(path)
        while pool:
            conn = pool.pop()
            if conn.usable():
                return True, conn
            conn.close()
        return False, await self._open(path)

    @staticmethod
    async def _open(path: str) -> FrameConnection:
        _, conn = await asyncio.get_running_loop().create_unix_connection(FrameConnection, path)
        return conn

    async def aclose(self) -> None:
        for pool in self.idle.values():
            for conn in pool:
                conn.close()
        self.idle.clear()


def _failed(name: str, err: Exception) -> ErrorEvent:
    return ErrorEvent(message=f"instance {name} failed: {err or type(err).__name__}")
