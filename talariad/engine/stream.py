"""The gateway → instance call stream: length-prefixed JSON frames over a unix socket.

A connection carries one call at a time: the gateway sends one `GenerateRequest` frame, the
instance answers with event frames (`TokenEvent`… then one `DoneEvent` or `ErrorEvent`), and the
connection is ready for the next call. A gateway that goes away mid-call closes the connection; the
instance sees the EOF and cancels the call, as it does when an HTTP client disconnects.

Why not the internal HTTP API for this hop: on loopback TCP an HTTP client and server (httpx,
uvicorn, FastAPI) cost more than a millisecond of CPU per call in Python; this costs a tenth of
that (bench/front_bench.py). The frames are JSON written by pydantic's serializer, so the event
schema stays the one in `engine/messages.py`.
"""

from __future__ import annotations

import asyncio
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


async def read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """The next frame's payload; None at a clean EOF between frames."""
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as err:
        if err.partial:
            raise ConnectionError("connection closed inside a frame header") from None
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ConnectionError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    return await reader.readexactly(size)


def parse_event(payload: bytes) -> StreamEvent:
    return _EVENT.validate_json(payload)


# ---- instance side ------------------------------------------------------------------------------


async def serve(worker, path: str) -> asyncio.AbstractServer:
    """Serve `worker.generate` on a unix socket at `path` (owner-only)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = await asyncio.start_unix_server(lambda r, w: _connection(worker, r, w), path)
    os.chmod(path, 0o600)
    return server


async def _connection(worker, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while (payload := await read_frame(reader)) is not None:
            try:
                req = GenerateRequest.model_validate_json(payload)
            except ValidationError as err:
                bad = ErrorEvent(
                    status=400, code="invalid_request", message=f"bad generate request: {err}"
                )
                writer.write(frame(bad.model_dump_json().encode()))
                break
            if not await _one_call(worker, req, reader, writer):
                break
    except (ConnectionError, asyncio.IncompleteReadError) as err:
        log.debug("call stream closed: %s", err)
    except asyncio.CancelledError:  # the instance is shutting down; nothing awaits this task
        pass
    finally:
        writer.close()


async def _one_call(
    worker, req: GenerateRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> bool:
    """Stream one call's events; False when the gateway went away (the call is then cancelled).
    The gateway sends nothing mid-call, so its side at EOF means it left."""
    events = worker.generate(req)
    out = _Frames(writer)
    try:
        async for ev in events:
            out.add(ev.model_dump_json().encode())
            if reader.at_eof():
                return False
            await writer.drain()
        return not reader.at_eof()
    finally:
        out.flush()
        await events.aclose()  # on a disconnect this cancels the call in the worker


class _Frames:
    """Event frames written within one event-loop step leave as one send: a call's last token and
    its done event usually come together, and each send wakes the gateway once."""

    __slots__ = ("writer", "pending")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer, self.pending = writer, []

    def add(self, payload: bytes) -> None:
        if not self.pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self.pending.append(frame(payload))

    def flush(self) -> None:
        if self.pending:
            self.writer.write(b"".join(self.pending))
            self.pending.clear()


# ---- gateway side -------------------------------------------------------------------------------


class StreamClient:
    """Kept-alive call-stream connections per instance socket; one call per connection at a time."""

    def __init__(self) -> None:
        self.idle: dict[str, list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}

    async def generate(self, path: str, req: GenerateRequest) -> AsyncIterator[StreamEvent]:
        reader, writer, data = await self._send(path, frame(req.model_dump_json().encode()))
        clean = False
        try:
            while data is not None:
                ev = parse_event(data)
                if not isinstance(ev, TokenEvent):
                    clean = True  # the call is over and the connection is ready for the next one
                    self.idle.setdefault(path, []).append((reader, writer))
                    yield ev
                    return
                yield ev
                data = await read_frame(reader)
            raise ConnectionError("instance closed the call stream")
        finally:
            if not clean:  # abandoned or failed mid-call: closing tells the instance to cancel it
                writer.close()

    async def _send(self, path: str, payload: bytes):
        """Send a request and read its first frame; a stale kept-alive connection (the instance
        restarted since) is replaced by a fresh one once."""
        reused, (reader, writer) = await self._connection(path)
        try:
            writer.write(payload)
            first = await read_frame(reader)
        except (ConnectionError, asyncio.IncompleteReadError):
            if not reused:
                writer.close()
                raise
            first = None
        except BaseException:  # cancelled: the instance must see the call abandoned
            writer.close()
            raise
        if first is not None or not reused:
            return reader, writer, first
        writer.close()
        reader, writer = await asyncio.open_unix_connection(path)
        try:
            writer.write(payload)
            return reader, writer, await read_frame(reader)
        except BaseException:
            writer.close()
            raise

    async def _connection(self, path: str):
        pool = self.idle.get(path)
        while pool:
            reader, writer = pool.pop()
            if not writer.is_closing() and not reader.at_eof():
                return True, (reader, writer)
            writer.close()
        return False, await asyncio.open_unix_connection(path)

    async def aclose(self) -> None:
        for pool in self.idle.values():
            for _, writer in pool:
                writer.close()
        self.idle.clear()
