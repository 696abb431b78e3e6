"""The gateway's view of instance processes: their latest telemetry, polled on the heartbeat
through the one instance client (`wire/client.py`), which also carries calls and admin actions."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import httpx

from talariad.wire.client import InstanceClient
from talariad.wire.messages import Query, Telemetry

log = logging.getLogger("talariad.gateway")


class InstanceDirectory:
    """Base URLs and call sockets come from the supervisor (`urls()`, `sockets()`); telemetry is
    polled on the heartbeat, as changes since the view held (`since`)."""

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
        self.client = InstanceClient(urls, sockets, token_for)
        self.on_telemetry, self.on_down, self.on_unhealthy = on_telemetry, on_down, on_unhealthy
        self.snapshots: dict[str, tuple[float, Telemetry]] = {}

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
            body = await self.client.ask(name, url, Query(query="telemetry", since=since), 2.0)
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

    async def aclose(self) -> None:
        await self.client.aclose()
