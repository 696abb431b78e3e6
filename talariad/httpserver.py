"""uvicorn inside our own asyncio loop: we own SIGTERM/SIGINT, uvicorn only serves."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol


class Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        # The daemon and engine install their own handlers and stop the server themselves.
        yield


class _HeadTimeout(H11Protocol):
    """h11 with a request-head timeout: once the first byte of a request head arrives, the whole
    head must follow within `head_timeout_s`, however slowly the client trickles it (uvicorn's
    keep-alive timer stops at the first byte, so a partial head was held forever). The timer is
    armed by the first byte rather than at connect: a connection with no byte yet is idle and is
    the keep-alive timer's, which is longer than clients' pool expiry, so it is not closed just as
    a client reuses it."""

    head_timeout_s = 15.0
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        # a connection that never sends a byte is idle: uvicorn arms its keep-alive timer only
        # after a first response, so arm it now (the first byte disarms it, as after a response)
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and self.conn.their_state is h11.IDLE:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timeout)
        super().data_received(data)

    def on_response_complete(self) -> None:
        self._disarm()
        super().on_response_complete()  # may start the next pipelined head: re-armed on its bytes

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose protocol is TCP, and an
    # accepted socket inherits the listener's. Without it Nagle holds each small response until the
    # client's delayed ACK (~40 ms) on every kept-alive call.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(False)
    return sock


async def start(
    app,
    sock: socket.socket,
    keep_alive_s: float = 30.0,
    head_timeout_s: float = 15.0,
    graceful_s: float = 2.0,
) -> tuple[Server, asyncio.Task]:
    """Start serving `app` on an already bound socket; returns once it accepts connections.
    keep_alive_s: idle timeout; head_timeout_s: request-head timeout; graceful_s: how long a stop
    waits for running requests before uvicorn cancels them."""
    protocol = type("HeadTimeout", (_HeadTimeout,), {"head_timeout_s": head_timeout_s})
    server = Server(
        uvicorn.Config(
            app,
            log_level="warning",
            timeout_graceful_shutdown=graceful_s,
            lifespan="off",
            http=protocol,
            timeout_keep_alive=keep_alive_s,
        )
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()  # surfaces the startup error
            raise RuntimeError("HTTP server stopped during startup")
        await asyncio.sleep(0.01)
    return server, task


def stop_event() -> asyncio.Event:
    """An event set by the first SIGTERM or SIGINT."""
    import signal

    ev = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, ev.set)
    return ev
