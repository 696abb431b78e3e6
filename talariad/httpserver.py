"""uvicorn inside our own asyncio loop: we own SIGTERM/SIGINT, uvicorn only serves."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.dependencies.utils import get_typed_return_annotation
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        # The daemon and engine install their own handlers and stop the server themselves.
        yield


class _Bounded(HttpToolsProtocol):
    """httptools with bounds on what a client may hold open. A request head must be whole within
    `head_timeout_s` of its first byte (else the connection is closed) and may not grow past
    `max_head_bytes` (431); a whole head's body must follow within `body_timeout_s` (408 and
    closed); a connection over `max_connections` open at once is closed as soon as it is accepted.
    httptools rather than h11: it parses and writes HTTP/1.1 in C, which halves the per-call cost
    of the HTTP layer (bench/front_bench.py). Why each bound works as it does: docs/internals.md."""

    head_timeout_s = 15.0
    max_head_bytes = 16 * 1024  # h11's bound, which uvicorn's h11 server applied
    body_timeout_s = 60.0
    max_connections = 512
    _head_timer: asyncio.TimerHandle | None = None
    _head_bytes: int | None = 0
    """Bytes received since the current request head began; None while no head is unfinished."""
    _body_timer: asyncio.TimerHandle | None = None
    _body_due = False
    """A request head is whole and its body is not."""
    _head_too_large = False

    def connection_made(self, transport) -> None:
        super().connection_made(_Corked(transport, self.loop))
        if len(self.connections) > self.max_connections:
            self.transport.close()  # before it is read from: nothing of it is held past this step
            return
        # a connection that never sends a byte is idle: uvicorn arms its keep-alive timer only
        # after a first response, so arm it now (the first byte disarms it, as after a response)
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def data_received(self, data: bytes) -> None:
        if self._head_bytes is not None:
            self._head_bytes += len(data)
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self._body_due:
            if self._body_timer is None:  # a body that comes with its head costs no timer
                self._body_timer = self.loop.call_later(self.body_timeout_s, self._body_timeout)
        elif self._head_bytes is None:
            return
        elif self._head_bytes > self.max_head_bytes:
            self._refuse_head()
        elif self._head_timer is None and self._idle():
            # armed after the read, and only if it left a head unfinished: a head that comes
            # whole in one read (nearly every one) costs no timer
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timeout)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._head_bytes = None
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.max_head_bytes:  # whole in one read: the unfinished-head count never saw it
            self._head_too_large = True
            raise _HeadTooLarge  # stops the parser, whose error uvicorn answers: send_400_response
        self._body_due = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._body_due = False
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()
        self._head_bytes = 0  # the next byte begins the next head

    def on_response_complete(self) -> None:
        self._disarm()
        self.transport.flush()  # the response is whole: it leaves now, before the call's cleanup
        super().on_response_complete()  # may start the next pipelined call: re-armed on its bytes

    def connection_lost(self, exc) -> None:
        self._disarm()
        if self._body_timer is not None:
            self._body_timer.cancel()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        if self._head_too_large:  # the parser stopped at our own refusal
            return self._refuse_head()
        super().send_400_response(msg)

    def _idle(self) -> bool:
        """No call is running on the connection (a pipelined head waits for it, untimed)."""
        return self.cycle is None or self.cycle.response_complete

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._head_bytes is not None and self._idle() and not self.transport.is_closing():
            self.transport.close()

    def _body_timeout(self) -> None:
        self._body_timer = None
        if not self._body_due or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_started:
            self._answer_and_close(408, b"the request body did not arrive in time")
        self.transport.close()

    def _refuse_head(self) -> None:
        self._answer_and_close(
            431, b"the request head is larger than %d bytes" % self.max_head_bytes
        )

    def _answer_and_close(self, status: int, text: bytes) -> None:
        head = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status])]
        head += [
            name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers
        ]
        head += [
            b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: %d\r\n" % len(text),
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + text)
        self.transport.close()


class _HeadTooLarge(Exception):
    """Raised from the parser's head callback to stop it at a head over the bound."""


_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class _Corked:
    """A transport whose writes within one event-loop step leave as one send: uvicorn writes a
    response's head and its body separately, and on a kept-alive loopback connection each send is
    a syscall and a wake-up of the client, which cost more than the join."""

    __slots__ = ("_transport", "_loop", "_pending")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


_NO_TELEMETRY = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


def post_json(app: FastAPI, path: str):
    """`app.post(path)` for an endpoint of one JSON body model, served by `JSONBodyRoute`."""

    def add(endpoint):
        app.router.add_api_route(
            path, endpoint, methods=["POST"], route_class_override=JSONBodyRoute
        )
        return endpoint

    return add


def fastapi_app(**kwargs) -> FastAPI:
    """A FastAPI app without FastAPI's native OpenTelemetry hooks, in the versions that have them:
    each request would look for a configured tracer, meter and logger provider (environment reads
    included), and talariad exports Prometheus metrics, not OpenTelemetry."""
    return FastAPI(**_NO_TELEMETRY, **kwargs)


class JSONBodyRoute(APIRoute):
    """A route whose one body model is validated straight from the request's bytes by pydantic's
    (strict) JSON parser, without FastAPI's generic body handling and dependency solving. It serves
    JSON bodies (`application/json`, `application/*+json`, or no content type) of an endpoint that
    takes the body and, optionally, the `Request`, and returns a `Response`; a body the parser
    refuses is a validation error (`json_invalid`). An empty body, any other content type or any
    other endpoint takes FastAPI's own path. Design: docs/internals.md."""

    def get_route_handler(self):
        standard = super().get_route_handler()
        answers = get_typed_return_annotation(self.endpoint)
        responds = isinstance(answers, type) and issubclass(answers, Response)
        if not responds or not _body_and_request_only(self.dependant):
            return standard  # the shape this route is for: one body model in, a Response out
        (field,) = self.dependant.body_params
        model, name = field.field_info.annotation, field.name
        given = self.dependant.request_param_name
        endpoint = self.endpoint

        async def handler(request: Request):
            try:
                raw = await request.body()
            except ClientDisconnect:  # gone (or cut off by the body timeout): no one to answer
                return Response(status_code=400)
            if not raw or not _is_json(request.headers.get("content-type")):
                return await standard(request)  # no body at all: FastAPI names the missing one
            try:
                body = model.model_validate_json(raw)
            except ValidationError as err:
                raise RequestValidationError(err.errors(include_url=False)) from None
            return await endpoint(**{name: body}, **({given: request} if given else {}))

        return handler


def _is_json(content_type: str | None) -> bool:
    """The body is JSON by its content type, as FastAPI judges it (none at all counts)."""
    if content_type is None or content_type == "application/json":
        return True
    kind = content_type.partition(";")[0].strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


def _body_and_request_only(dependant) -> bool:
    """The endpoint takes one body model and perhaps the `Request`, and nothing FastAPI would have
    to solve (path, query, header or cookie parameters, dependencies, a response or background
    tasks parameter): the fast path passes it only those two."""
    d = dependant
    others = (d.path_params, d.query_params, d.header_params, d.cookie_params, d.dependencies)
    special = (d.response_param_name, d.background_tasks_param_name, d.websocket_param_name)
    return len(d.body_params) == 1 and not any(others) and not any(special)


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
    body_timeout_s: float = 60.0,
    max_connections: int = 512,
) -> tuple[Server, asyncio.Task]:
    """Start serving `app` on an already bound socket; returns once it accepts connections.
    keep_alive_s: idle timeout; head_timeout_s: request-head timeout; graceful_s: how long a stop
    waits for running requests before uvicorn cancels them; body_timeout_s: request-body timeout;
    max_connections: connections open at once (`_Bounded`)."""
    bounds = {
        "head_timeout_s": head_timeout_s,
        "body_timeout_s": body_timeout_s,
        "max_connections": max_connections,
    }
    protocol = type("Bounded", (_Bounded,), bounds)
    server = Server(
        uvicorn.Config(
            app,
            log_level="warning",
            timeout_graceful_shutdown=graceful_s,
            lifespan="off",
            http=protocol,
            timeout_keep_alive=keep_alive_s,
            # per-call work nothing here reads: the access log (its logger sits at warning, so no
            # line was ever written) and X-Forwarded-* rewriting of the client and scheme
            access_log=False,
            proxy_headers=False,
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
