"""A fake box on a loopback port (`async with` gives its "host:port"): the poller's tests script
its replies in `_serve`."""

from __future__ import annotations

import asyncio


class LoopbackServer:
    """An asyncio server on 127.0.0.1, a free port, serving each connection with `_serve`."""

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


async def peer_closed(reader: asyncio.StreamReader) -> bool:
    """The server closed the connection without answering: an EOF, or a reset (the kernel resets
    a socket closed with bytes we wrote to it still unread). False: it answered."""
    try:
        return await reader.read(65536) == b""
    except ConnectionError:
        return True
