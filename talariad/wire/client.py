"""The one client of instance processes, for the gateway and the operator alike.

One transport per purpose: calls and reports (telemetry, rounds, memory) go on the instance's
call stream, length-prefixed frames on a kept-alive unix socket (`wire/stream.py`), since they
are per call or per heartbeat and HTTP on loopback costs more than the rest of a hop. Every
instance process serves the stream; a report asked of an instance without one (a test's in-process
app) goes to its internal HTTP API. Admin actions (rotation, forget, abort) and token counts are
rare request/response exchanges: internal HTTP, easy to read and to curl.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import httpx

from talariad.wire.messages import ErrorEvent, GenerateRequest, Query, StreamEvent
from talariad.wire.stream import StreamClient


class InstanceUnreachable(Exception):
    """The instance is not ready, or did not answer an admin action."""


class InternalAuth(httpx.Auth):
    """Puts the per-start token of the instance a request goes to (found by its port) on the request."""

    def __init__(self, token_for: Callable[[int | None], str | None]):
        self.token_for = token_for

    def auth_flow(self, request: httpx.Request):
        token = self.token_for(request.url.port)
        if token:
            request.headers["x-talaria-token"] = token
        yield request


class InstanceClient:
    """`urls()`: each instance's internal HTTP base URL, None while it is not ready; `sockets()`:
    its call-stream socket path, None when it has none."""

    def __init__(
        self,
        urls: Callable[[], dict[str, str | None]],
        sockets: Callable[[], dict[str, str | None]] | None = None,
        token_for: Callable[[int | None], str | None] | None = None,
    ):
        self.urls, self.sockets = urls, sockets
        self.streams = StreamClient()
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(10.0, read=None),
            auth=InternalAuth(token_for) if token_for else None,
        )

    # ---- calls and reports: the call stream ------------------------------------------------------

    def generate(self, instance: str, req: GenerateRequest) -> AsyncIterator[StreamEvent]:
        """The call's events from the instance; a caller that stops early must `aclose()` it
        (that closes the hop, which tells the instance to cancel the call)."""
        path = self.sockets().get(instance) if self.sockets else None
        if path:  # a failed hop ends the stream with an ErrorEvent naming the instance
            return self.streams.generate(path, req, instance)
        return _not_ready(instance)

    async def ask(self, instance: str, url: str, q: Query, timeout_s: float) -> bytes:
        """The instance's answer to `q`: on its call stream when it has one, else `GET
        /internal/<query>` (OSError, httpx.HTTPError: no answer)."""
        path = self.sockets().get(instance) if self.sockets else None
        if path:
            async with asyncio.timeout(timeout_s):
                return await self.streams.query(path, q)
        params = q.model_dump(exclude={"query"}, exclude_none=True)
        r = await self.http.get(
            f"{url}/internal/{q.query}", params=params or None, timeout=timeout_s
        )
        r.raise_for_status()
        return r.content

    async def _report(self, instance: str, **query) -> dict | None:
        url = self.urls().get(instance)
        if not url:
            return None
        try:  # ValueError: a garbled answer, or a query out of range (a limit past 4096)
            return json.loads(await self.ask(instance, url, Query(**query), 5.0))
        except (OSError, httpx.HTTPError, ValueError):
            return None

    async def memory(self, instance: str) -> dict | None:
        """The instance's memory report (layout rows, switch records); None when it is not ready."""
        return await self._report(instance, query="memory")

    async def process(self, instance: str) -> dict | None:
        """What the instance process holds (`procstats.process_stats`); None when it does not answer."""
        return await self._report(instance, query="process")

    async def rounds(self, instance: str, limit: int) -> dict | None:
        """The instance's latest `limit` round and switch records; None when it does not answer."""
        return await self._report(instance, query="rounds", limit=limit)

    # ---- counts and admin actions: internal HTTP -------------------------------------------------

    async def count_tokens(self, instance: str, req: GenerateRequest) -> int | str | None:
        """The prompt length the instance tokenizes `req` to; a string: why it cannot (the client's
        mistake); None: the instance did not answer."""
        url = self.urls().get(instance)
        if not url:
            return None
        try:
            r = await self.http.post(
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

    async def _action(self, instance: str, path: str, body: dict) -> httpx.Response:
        url = self.urls().get(instance)
        if not url:
            raise InstanceUnreachable(f"instance {instance} is not ready")
        try:
            return await self.http.post(f"{url}{path}", json=body, timeout=10.0)
        except httpx.HTTPError as err:
            raise InstanceUnreachable(f"instance {instance} did not answer: {err}") from None

    async def rotation(self, instance: str, model: str, serve: bool) -> str | None:
        """Load (`serve`) or unload `model` in a cold instance's rotation; the instance's reason
        when it refuses, None when done."""
        r = await self._action(instance, "/internal/rotation", {"model": model, "serve": serve})
        if r.status_code == 409:
            return str(r.json().get("error", "refused"))
        if r.status_code != 200:
            raise InstanceUnreachable(f"instance {instance} answered HTTP {r.status_code}")
        return None

    async def forget(self, instance: str, session: str) -> bool:
        """Drop the session's context and KV on the instance; True if it held any."""
        r = await self._action(instance, "/internal/forget", {"session_id": session})
        return r.status_code == 200 and bool(r.json().get("freed"))

    async def abort_all(self) -> int:
        """Ask every instance to end its live calls with an error event; how many were ended."""

        async def one(url: str) -> int:
            try:
                r = await self.http.post(f"{url}/internal/abort", timeout=5.0)
                r.raise_for_status()
                return int(r.json().get("aborted", 0))
            except (httpx.HTTPError, ValueError):
                return 0

        return sum(await asyncio.gather(*(one(u) for u in self.urls().values() if u)))

    async def aclose(self) -> None:
        await self.streams.aclose()
        await self.http.aclose()


async def _not_ready(instance: str) -> AsyncIterator[StreamEvent]:
    """A call for an instance with no call stream: it is not ready (a ready one always has one)."""
    yield ErrorEvent(message=f"instance {instance} is not ready")
