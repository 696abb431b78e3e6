"""The gateway's view of instance processes: where they listen, their latest telemetry, and the
internal hop that forwards a call and reads back its stream of events (the instance's unix-socket
call stream when it has one, else its internal HTTP API)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable

import httpx

from talariad.engine.messages import (
    DoneEvent,
    ErrorEvent,
    GenerateRequest,
    Query,
    StreamEvent,
    Telemetry,
    TokenEvent,
)
from talariad.engine.stream import StreamClient

log = logging.getLogger("talariad.gateway")


class InternalAuth(httpx.Auth):
    """Puts the per-start token of the instance a request goes to (found by its port) on the request."""

    def __init__(self, token_for: Callable[[int | None], str | None]):
        self.token_for = token_for

    def auth_flow(self, request: httpx.Request):
        token = self.token_for(request.url.port)
        if token:
            request.headers["x-talaria-token"] = token
        yield request


class InstanceDirectory:
    """Base URLs and call sockets come from the supervisor (`urls()`, `sockets()`); telemetry is
    polled on the heartbeat. Reports (telemetry, rounds, memory) are asked for on the instance's
    call stream when it has one (a `Query` frame), else over its internal HTTP API."""

    def __init__(
        self,
        urls: Callable[[], dict[str, str | None]],
        interval_s: float,
        on_telemetry: Callable[[Telemetry, float], None] | None = None,
        on_down: Callable[[str, float], None] | None = None,
        on_unhealthy: Callable[[str, float], None] | None = None,
        sockets: Callable[[], dict[str, str | None]] | None = None,
        on_payload: Callable[[str, int], None] | None = None,
        token_for: Callable[[int | None], str | None] | None = None,
    ):
        self.urls, self.interval_s, self.sockets, self.on_payload = (
            urls,
            interval_s,
            sockets,
            on_payload,
        )
        self._epochs: dict[str, int | None] = {}  # the session view each instance last sent us
        self.streams = StreamClient()
        self.on_telemetry, self.on_down, self.on_unhealthy = on_telemetry, on_down, on_unhealthy
        self.snapshots: dict[str, tuple[float, Telemetry]] = {}
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(10.0, read=None),
            auth=InternalAuth(token_for) if token_for else None,
        )

    def snapshot(self, name: str) -> Telemetry | None:
        entry = self.snapshots.get(name)
        return entry[1] if entry else None

    def age_s(self, name: str, now: float) -> float:
        entry = self.snapshots.get(name)
        return now - entry[0] if entry else float("inf")

    async def poll_once(self) -> None:
        urls = self.urls()
        for name, url in urls.items():
            if not url and self.on_down:
                self.on_down(name, time.monotonic())
        await asyncio.gather(*(self._poll(n, u) for n, u in urls.items() if u))

    async def _poll(self, name: str, url: str) -> None:
        # sessions come as changes since the view we hold (`since`); on_telemetry sees every
        # reply in order, so it can apply them (RouterShell.observe)
        since = self._epochs.get(name)
        try:
            body = await self._ask(name, url, Query(query="telemetry", since=since), 2.0)
            now, telemetry = time.monotonic(), Telemetry.model_validate_json(body)
            self._epochs[name] = telemetry.sessions_epoch
            self.snapshots[name] = (now, telemetry)
            if self.on_payload:
                self.on_payload(name, len(body))
            if self.on_telemetry:
                self.on_telemetry(telemetry, now)
        except (OSError, httpx.HTTPError, ValueError) as err:  # OSError: the call stream, a timeout
            log.debug("telemetry from %s failed: %s", name, err)
            if self.on_unhealthy:
                self.on_unhealthy(name, time.monotonic())

    async def poll_forever(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.interval_s)

    async def _ask(self, name: str, url: str, q: Query, timeout_s: float) -> bytes:
        """The instance's answer to `q`: on its call stream when it has one, else `GET
        /internal/<query>` (OSError, httpx.HTTPError: no answer)."""
        path = self.sockets().get(name) if self.sockets else None
        if path:
            async with asyncio.timeout(timeout_s):
                return await self.streams.query(path, q)
        params = q.model_dump(exclude={"query"}, exclude_none=True)
        r = await self.client.get(
            f"{url}/internal/{q.query}", params=params or None, timeout=timeout_s
        )
        r.raise_for_status()
        return r.content

    async def _report(self, instance: str, **query) -> dict | None:
        url = self.urls().get(instance)
        if not url:
            return None
        try:  # ValueError: a garbled answer, or a query out of range (a limit past 4096)
            return json.loads(await self._ask(instance, url, Query(**query), 5.0))
        except (OSError, httpx.HTTPError, ValueError):
            return None

    async def memory(self, instance: str) -> dict | None:
        """The instance's memory report (layout rows, switch records); None when it is not ready."""
        return await self._report(instance, query="memory")

    async def rounds(self, instance: str, limit: int) -> dict | None:
        """The instance's latest `limit` round and switch records; None when it does not answer."""
        return await self._report(instance, query="rounds", limit=limit)

    async def count_tokens(self, instance: str, req: GenerateRequest) -> int | str | None:
        """The prompt length the instance tokenizes `req` to; a string: why it cannot (the client's
        mistake); None: the instance did not answer."""
        url = self.urls().get(instance)
        if not url:
            return None
        try:
            r = await self.client.post(
                f"{url}/internal/count_tokens",
                content=req.model_dump_json(),
                headers={"content-type": "application/json"},
                timeout=30.0,
            )
            data = r.json()
        except (httpx.HTTPError, ValueError):
            return None
        if r.status_code == 400:
            return str(data.get("error", "the prompt cannot be rendered"))
        return data.get("input_tokens") if r.status_code == 200 else None

    def generate(self, instance: str, req: GenerateRequest) -> AsyncIterator[StreamEvent]:
        """The call's events from the instance; a caller that stops early must `aclose()` it
        (that closes the hop, which tells the instance to cancel the call)."""
        path = self.sockets().get(instance) if self.sockets else None
        if path:  # a failed hop ends the stream with an ErrorEvent naming the instance
            return self.streams.generate(path, req, instance)
        return self._http(instance, req)

    async def _http(self, instance: str, req: GenerateRequest) -> AsyncIterator[StreamEvent]:
        url = self.urls().get(instance)
        if not url:
            yield ErrorEvent(message=f"instance {instance} is not ready")
            return
        final: StreamEvent | None = None
        try:
            async with self.client.stream(
                "POST",
                f"{url}/internal/generate",
                content=req.model_dump_json(),
                headers={"content-type": "application/json"},
            ) as r:
                if r.status_code != 200:
                    yield ErrorEvent(message=f"instance {instance} answered HTTP {r.status_code}")
                    return
                async for line in r.aiter_lines():
                    if not line:
                        continue
                    ev = _event(json.loads(line))
                    if isinstance(ev, TokenEvent):
                        yield ev
                    else:  # the last event: hold it until the body is read to its end, which hands
                        final = (
                            ev  # the connection back to the pool (a consumer stops at this event)
                        )
        except (httpx.HTTPError, ValueError) as err:  # ValueError: a garbled event line
            final = ErrorEvent(message=f"instance {instance} failed: {err}")
        if final is not None:
            yield final

    async def abort_all(self) -> int:
        """Ask every instance to end its live calls with an error event; how many were ended."""

        async def one(url: str) -> int:
            try:
                r = await self.client.post(f"{url}/internal/abort", timeout=5.0)
                r.raise_for_status()
                return int(r.json().get("aborted", 0))
            except (httpx.HTTPError, ValueError):
                return 0

        return sum(await asyncio.gather(*(one(u) for u in self.urls().values() if u)))

    async def aclose(self) -> None:
        await self.streams.aclose()
        await self.client.aclose()


def _event(data: dict) -> StreamEvent:
    kind = data.get("type")
    if kind == "token":
        return TokenEvent.model_validate(data)
    if kind == "done":
        return DoneEvent.model_validate(data)
    return ErrorEvent.model_validate(data)
