"""The gateway → instance call stream: length-prefixed JSON frames over a unix socket.

A connection carries one call at a time: the gateway sends one `GenerateRequest` frame, the
instance answers with event frames (`TokenEvent`… then one `DoneEvent` or `ErrorEvent`). A gateway
that leaves mid-call closes the connection; the instance then cancels the call. Between calls a
`Query` frame (telemetry, rounds, memory) is answered with one JSON frame. Cheaper than the
internal HTTP API on this hop (bench/front_bench.py); the event schema stays the one in
`wire/messages.py`. Design: docs/internals.md.
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
from pydantic_core import to_json

from talariad.procstats import process_stats
from talariad.wire.messages import ErrorEvent, GenerateRequest, Query, StreamEvent, TokenEvent

log = logging.getLogger("talariad.stream")

_EVENT = TypeAdapter(Annotated[StreamEvent, Field(discriminator="type")])
_HEADER = struct.Struct("!I")
MAX_FRAME = 64 << 20  # a request frame carries the whole prompt; refuse anything absurd
_QUERY = b'{"query":'  # how a `Query` frame starts (its first field, as pydantic writes it)


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

    # -- reading

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

    def usable(self) -> bool:
        return not self._closed and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


# ---- instance side ------------------------------------------------------------------------------


async def serve(worker, path: str) -> asyncio.AbstractServer:
    """Serve `worker`'s calls (`start`, `cancel`) on a unix socket at `path` (owner-only)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    loop = asyncio.get_running_loop()
    server = await loop.create_unix_server(lambda: _Served(worker), path)
    os.chmod(path, 0o600)
    return server


class _Served(FrameConnection):
    """An instance's end of one connection. A request frame is admitted as it arrives, and the
    worker's loop hands the call's events straight to its `_CallEvents`, which sends them: no task
    per connection or call, so an event costs no wake-up of a reader. Calls run one after another;
    a gateway that leaves mid-call (EOF, a lost connection) cancels its call."""

    def __init__(self, worker) -> None:
        super().__init__()
        self.worker = worker
        self.call: _CallEvents | None = None
        """The call running on this connection; None between calls."""

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._next()

    def eof_received(self) -> bool:
        self._left()
        return super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._left()
        super().connection_lost(exc)

    def deliver(self, call: _CallEvents, event: StreamEvent) -> None:
        if call is not self.call:
            return  # a late event of a call already ended here (aborted, or the gateway left)
        self.send(event.model_dump_json().encode())
        if not isinstance(event, TokenEvent):  # the call is over: its frames leave now
            self.flush()
            self.call = None
            # ended by an error while live (an abort), or more requests queued: see to them after
            # the loop's step, which may be walking the worker's calls
            if call.call_id in self.worker.calls or self._frames:
                asyncio.get_running_loop().call_soon(self._after, call.call_id)

    def _after(self, ended: str) -> None:
        self.worker.cancel(ended)
        self._next()

    def _next(self) -> None:
        """Start the next requested call unless one is running."""
        while self.call is None and self._frames and not self._closed:
            payload = self._frames.popleft()
            try:
                if payload.startswith(_QUERY):
                    self.write(report(self.worker, Query.model_validate_json(payload)))
                    continue
                req = GenerateRequest.model_validate_json(payload)
            except ValidationError as err:
                bad = ErrorEvent(status=400, code="invalid_request", message=f"bad request: {err}")
                self.write(bad.model_dump_json().encode())
                self.close()
                return
            call = _CallEvents(self, req.call_id)
            refused = self.worker.start(req, call)
            if refused is not None:
                self.send(refused.model_dump_json().encode())
                self.flush()
            else:
                self.call = call

    def _left(self) -> None:
        if self.call is not None:
            call, self.call = self.call, None
            log.debug("call stream closed mid-call %s", call.call_id)
            self.worker.cancel(call.call_id)


def report(worker, q: Query) -> bytes:
    """The answer to `q`: the body of the internal API's `GET /internal/<q.query>` (pydantic's
    serializer, as there: enums, dataclasses and tuples in a report are JSON too)."""
    if q.query == "telemetry":
        return worker.telemetry_since(q.since).model_dump_json().encode()
    if q.query == "rounds":
        return to_json(worker.rounds() if q.limit is None else worker.rounds(q.limit))
    if q.query == "process":
        return to_json(process_stats())
    return to_json(worker.memory_report())


class _CallEvents:
    """One call's events on its connection (the worker's `EventSink`)."""

    __slots__ = ("conn", "call_id")

    def __init__(self, conn: _Served, call_id: str) -> None:
        self.conn, self.call_id = conn, call_id

    def put_nowait(self, event: StreamEvent) -> None:
        self.conn.deliver(self, event)


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

    async def query(self, path: str, q: Query) -> bytes:
        """The instance's one-frame answer to `q` (see the module); OSError: the hop failed."""
        conn, answer = await self._send(path, q.model_dump_json(exclude_none=True).encode())
        if answer is None:
            conn.close()
            raise ConnectionError("instance closed the call stream")
        self.idle.setdefault(path, []).append(conn)
        return answer

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
