"""The HTTP server's connection bounds, in-process: a silent connection is closed after the idle
(keep-alive) timeout, a partial request head after the head timeout however slowly it trickles,
a head over the size bound is 431 however it arrives, a body that does not arrive whole within
the body timeout is 408, connections over the cap are closed at once, and a request that
completes in time is served."""

from __future__ import annotations

import asyncio
import time

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from talariad import httpserver
from talariad.gateway import errors
from tests.support.loopback import peer_closed


async def _app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


async def _reading_app(scope, receive, send):
    """Answers with the size of the body, once it has read all of it (as the gateway does)."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return
        size, more = size + len(message.get("body", b"")), message.get("more_body", False)
    body = str(size).encode()
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _serve(app=_app, **bounds):
    sock = httpserver.bind("127.0.0.1", 0)
    bounds = {"keep_alive_s": 0.4, "head_timeout_s": 0.6, **bounds}
    server, task = await httpserver.start(app, sock, **bounds)
    return server, task, sock.getsockname()[1]


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        return await asyncio.wait_for(peer_closed(reader), seconds)
    except TimeoutError:
        return False


async def test_connection_timeouts():
    server, task, port = await _serve()
    try:
        silent_r, silent_w = await asyncio.open_connection("127.0.0.1", port)
        assert await _closed_within(silent_r, 5)  # idle: no byte at all

        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET / HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        closed = False
        while time.monotonic() - started < 5 and not closed:  # trickle a header byte every 0.1 s
            w.write(b"X")
            closed = await _closed_within(r, 0.1)
        assert closed

        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await asyncio.wait_for(r.read(1024), 5)).startswith(b"HTTP/1.1 200")
        w.close()
    finally:
        server.should_exit = True
        await task


async def test_an_unfinished_head_may_not_grow_past_the_bound_but_a_large_body_may():
    server, task, port = await _serve()
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (20 * 1024))
        assert (await asyncio.wait_for(r.read(1024), 5)).startswith(b"HTTP/1.1 431")
        assert await _closed_within(r, 5)

        r, w = await asyncio.open_connection("127.0.0.1", port)
        body = b"b" * (256 * 1024)
        w.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        assert (await asyncio.wait_for(r.read(1024), 5)).startswith(b"HTTP/1.1 200")
        w.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # kept alive: the next head is served too
        assert (await asyncio.wait_for(r.read(1024), 5)).startswith(b"HTTP/1.1 200")
        w.close()
    finally:
        server.should_exit = True
        await task


async def test_a_whole_head_over_the_bound_is_431_even_in_one_write():
    server, task, port = await _serve()
    try:
        for body in (b"", b"{}"):  # with its body in the same write, too
            r, w = await asyncio.open_connection("127.0.0.1", port)
            head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % len(body)
            w.write(head + b"X-Big: " + b"a" * (20 * 1024) + b"\r\n\r\n" + body)
            assert (await asyncio.wait_for(r.read(1024), 5)).startswith(b"HTTP/1.1 431")
            assert await _closed_within(r, 5)
        r, w = await asyncio.open_connection("127.0.0.1", port)  # a head under the bound is served
        w.write(b"GET / HTTP/1.1\r\nHost: x\r\nX-Fine: " + b"a" * (12 * 1024) + b"\r\n\r\n")
        assert (await asyncio.wait_for(r.read(1024), 5)).startswith(b"HTTP/1.1 200")
        w.close()
    finally:
        server.should_exit = True
        await task


async def test_a_body_that_trickles_past_the_body_timeout_is_408_and_closed():
    server, task, port = await _serve(_reading_app, body_timeout_s=0.6)
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
        answer, deadline = b"", time.monotonic() + 10  # a guard: the server must end it first
        while not answer and time.monotonic() < deadline:  # a body byte every 0.1 s
            w.write(b"x")
            try:
                answer = await asyncio.wait_for(r.read(1024), 0.1)
            except TimeoutError:
                continue
        assert answer.startswith(b"HTTP/1.1 408")
        assert await _closed_within(r, 5)

        r, w = await asyncio.open_connection("127.0.0.1", port)  # a body sent in time is served
        w.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab")
        w.write(b"cde")
        assert (await asyncio.wait_for(r.read(1024), 5)).endswith(b"\r\n\r\n5")
        w.close()
    finally:
        server.should_exit = True
        await task


async def test_connections_over_the_cap_are_closed_at_once():
    server, task, port = await _serve(_reading_app, max_connections=3, head_timeout_s=60)
    try:
        held = []
        for _ in range(3):  # each holds an unfinished request
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
            held.append((r, w))
        while len(server.server_state.connections) < 3:  # accepted, in the server's books
            await asyncio.sleep(0.01)
        r, w = await asyncio.open_connection("127.0.0.1", port)
        assert await _closed_within(r, 5)  # over the cap: closed without being served
        held[0][1].write(b"cdefghij")  # one finishes its request and leaves
        assert (await asyncio.wait_for(held[0][0].read(1024), 5)).endswith(b"\r\n\r\n10")
        held[0][1].close()
        while len(server.server_state.connections) > 2:
            await asyncio.sleep(0.01)
        r, w = await asyncio.open_connection("127.0.0.1", port)  # room again: served
        w.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nz")
        assert (await asyncio.wait_for(r.read(1024), 5)).endswith(b"\r\n\r\n1")
        for _, writer in held[1:] + [(r, w)]:
            writer.close()
    finally:
        server.should_exit = True
        await task


def test_apps_leave_fastapis_opentelemetry_hooks_off():
    app = httpserver.fastapi_app(title="t")
    telemetry = getattr(app, "_telemetry", None)  # FastAPI versions with native OpenTelemetry
    if telemetry is not None:
        assert not (telemetry["tracing"] or telemetry["metrics"] or telemetry["logs"])


class _Body(BaseModel):
    model: str
    n: int = Field(default=1, ge=1)


def _echo_app():
    app = httpserver.fastapi_app()
    errors.install(app)

    async def echo(body: _Body, request: Request) -> JSONResponse:
        return JSONResponse({"chars": len(body.model), "n": body.n, "path": request.url.path})

    httpserver.post_json(app, "/fast")(echo)
    app.post("/plain")(echo)
    return app


async def test_a_json_body_route_answers_every_valid_body_as_fastapis_own_route_does():
    bodies = [
        (b'{"model": "m", "n": 2}', "application/json"),
        (b'{"model": "m", "n": 0}', "application/json"),  # a validation error
        (b'{"n": 2}', "application/json"),  # a missing field
        (b'{"model": "\\ud83d\\ude00"}', "application/json"),  # an escaped surrogate pair
        (b"", "application/json"),
        (b'{"model": "m"}', "application/json; charset=utf-8"),
        (b'{"model": "m"}', "application/vnd.talaria+json"),
        (b'{"model": "m"}', "text/plain"),
    ]
    transport = httpx.ASGITransport(app=_echo_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for content, kind in bodies:
            headers = {"content-type": kind}
            fast = await client.post("/fast", content=content, headers=headers)
            plain = await client.post("/plain", content=content, headers=headers)
            assert fast.status_code == plain.status_code, content
            if fast.status_code == 200:
                assert fast.json() == {**plain.json(), "path": "/fast"}, content
            else:
                assert fast.json() == plain.json(), content


async def test_a_json_body_route_decodes_strictly_whatever_the_json_content_type():
    """What `json.loads` would take (or fail on deep inside) is a 400 naming the problem."""
    bodies = {
        b'{"model": "m", "n": 2': "not valid JSON",
        b'{"model": "\\ud800"}': "lone surrogate",  # an escape without its pair
        b'{"model": "a\xed\xa0\x80"}': "not valid UTF-8",  # an encoded surrogate
        b'{"model": "a\xff"}': "not valid UTF-8",
        '{"model": "m"}'.encode("utf-16"): "not valid",
        b'{"model": "m", "x": ' + b"[" * 10_000 + b"]" * 10_000 + b"}": "nested more than",
    }
    transport = httpx.ASGITransport(app=_echo_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for content, problem in bodies.items():
            for kind in ("application/json", "application/json; charset=utf-8", None):
                headers = {"content-type": kind} if kind else {}
                r = await client.post("/fast", content=content, headers=headers)
                assert r.status_code == 400, (content[:40], kind)
                assert problem in r.json()["error"]["message"], (content[:40], kind)


async def test_a_json_body_route_with_other_parameters_is_fastapis_own():
    """The fast path hands an endpoint only its body and request: one that also takes a query
    parameter is served by FastAPI's path, which fills it in."""
    app = httpserver.fastapi_app()

    async def echo(body: _Body, request: Request, tag: str = "none") -> JSONResponse:
        return JSONResponse({"model": body.model, "tag": tag})

    httpserver.post_json(app, "/fast")(echo)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        answer = await client.post(
            "/fast?tag=x", content=b'{"model": "m"}', headers={"content-type": "application/json"}
        )
    assert answer.status_code == 200
    assert answer.json() == {"model": "m", "tag": "x"}
