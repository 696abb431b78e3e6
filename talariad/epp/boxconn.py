"""One kept-alive HTTP/1.1 connection to one box, for the poller's `GET /pool/snapshot`: a
request at a time, on asyncio's streams. Not a general client: it sends GETs, and reads a
response's body by its Content-Length, as chunks, or to the connection's end.

Why not aiohttp (the poller's client before): its request machinery was most of a poll's CPU
(0.14 ms of user time a `304`, against 0.05 ms here, measured with `bench/epp_bench.py
--part poll`), and a pool's polls all run on the pick's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from urllib.parse import urlencode

MAX_HEAD_BYTES = 64 * 1024  # a status line and headers past this are no box's answer


class BoxUnreachable(ConnectionError):
    """The connection could not be opened (nothing listens there, no route): the box is out."""


class Reply:
    """A response: its status, its headers (names in lower case) and its body."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


class BoxConnection:
    """GETs to the box at `endpoint` ("host:port"), each with `headers` besides its own. Any
    failure closes the connection (its state is unknown); the next GET opens a new one, and a
    kept one the box closed meanwhile is opened again once."""

    def __init__(self, endpoint: str, headers: Mapping[str, str]) -> None:
        self.endpoint = endpoint
        host, _, port = endpoint.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self._fixed = f"host: {endpoint}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def get(
        self,
        path: str,
        params: Mapping[str, str],
        headers: Mapping[str, str] | None,
        timeout_s: float,
    ) -> Reply:
        """The box's reply to `GET path?params`. Raises `BoxUnreachable`, OSError (a reset),
        TimeoutError past `timeout_s`, ValueError for what is no HTTP/1.1 response."""
        request = self.request(path, params, headers)
        try:
            async with asyncio.timeout(timeout_s):
                kept = self._writer is not None
                if not kept:
                    await self._open()
                try:
                    return await self._exchange(request)
                except _ClosedBeforeReply:
                    if not kept:  # a new connection closed at once: no box answers there
                        raise ConnectionResetError("the box closed the connection") from None
                    await self._open()  # the box closed the kept one while it idled
                    return await self._exchange(request)
        except BaseException:
            self.close()
            raise

    def request(
        self, path: str, params: Mapping[str, str], headers: Mapping[str, str] | None
    ) -> bytes:
        """The bytes of `GET path?params` to the box, with `headers` besides its own."""
        target = f"{path}?{urlencode(params)}" if params else path
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        return f"GET {target} HTTP/1.1\r\n{self._fixed}{extra}\r\n".encode()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def _open(self) -> None:
        self.close()
        try:
            self._reader, self._writer = await asyncio.open_connection(
                self.host, self.port, limit=MAX_HEAD_BYTES
            )
        except OSError as err:
            raise BoxUnreachable(f"{self.endpoint}: {err}") from err

    async def _exchange(self, request: bytes) -> Reply:
        reader, writer = self._reader, self._writer
        assert reader is not None and writer is not None
        writer.write(request)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as err:
            if not err.partial:
                raise _ClosedBeforeReply from None
            raise ValueError("the box's reply ended inside its headers") from None
        except asyncio.LimitOverrunError:
            raise ValueError(f"the box's reply headers exceed {MAX_HEAD_BYTES} bytes") from None
        status, headers = parse_head(head)
        body, to_end = await _body(reader, status, headers)
        if to_end or headers.get("connection", "").lower() == "close":
            self.close()
        return Reply(status, headers, body)


class _ClosedBeforeReply(Exception):
    """The connection ended before a byte of the reply came."""


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """The status and the headers of a response's head (its bytes up to the blank line)."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise ValueError(f"not an HTTP/1.1 response: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise ValueError(f"a malformed header line: {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
    return int(code), headers


async def _body(
    reader: asyncio.StreamReader, status: int, headers: dict[str, str]
) -> tuple[bytes, bool]:
    """The reply's body, and whether it ran to the connection's end (no length given)."""
    try:
        if status in (204, 304) or status < 200:
            return b"", False
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return await _chunks(reader), False
        if "content-length" in headers:
            return await reader.readexactly(int(headers["content-length"])), False
        return await reader.read(), True
    except asyncio.IncompleteReadError:
        raise ValueError("the box's reply ended inside its body") from None


async def _chunks(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
