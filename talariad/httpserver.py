"""uvicorn inside our own asyncio loop: we own SIGTERM/SIGINT, uvicorn only serves."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import uvicorn


class Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        # The daemon and engine install their own handlers and stop the server themselves.
        yield


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


async def start(app, sock: socket.socket) -> tuple[Server, asyncio.Task]:
    """Start serving `app` on an already bound socket; returns once it accepts connections."""
    server = Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, lifespan="off"))
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
