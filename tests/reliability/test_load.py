"""Readiness under load: 200 concurrent sessions on sim executors never flip `/ready`."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.support.daemon import start_daemon, stop_daemon

pytestmark = pytest.mark.e2e

SESSIONS = 200
TURNS = 1  # every session is open at once: the load is the concurrency, not the length


async def _session(client: httpx.AsyncClient, i: int) -> list[int]:
    model = ("tiny-chat", "tiny-code")[i % 2]
    messages = [{"role": "user", "content": f"Session {i}: run the tests."}]
    statuses = []
    for turn in range(TURNS):
        r = await client.post(
            "/v1/chat/completions",
            headers={"x-session-id": f"load-{i}"},
            json={"model": model, "messages": messages, "max_tokens": 8},
        )
        statuses.append(r.status_code)
        if r.status_code == 200:
            messages = messages + [
                r.json()["choices"][0]["message"],
                {"role": "user", "content": f"turn {turn}"},
            ]
    return statuses


async def _load_and_watch(endpoint: str) -> tuple[list[int], list[int]]:
    limits = httpx.Limits(max_connections=SESSIONS + 10, max_keepalive_connections=SESSIONS + 10)
    async with httpx.AsyncClient(base_url=endpoint, timeout=120, limits=limits) as client:
        load = asyncio.gather(*(_session(client, i) for i in range(SESSIONS)))
        ready: list[int] = []
        while not load.done():
            ready.append((await client.get("/ready")).status_code)
            await asyncio.sleep(0.05)
        return [s for calls in await load for s in calls], ready


def test_ready_never_flips_under_200_sessions(tmp_path):
    d = start_daemon(tmp_path, executor="sim", instance={"time_scale": 0.5})
    try:
        calls, ready = asyncio.run(_load_and_watch(d.endpoint))
        assert calls == [200] * (TURNS * SESSIONS)
        assert len(ready) >= 3 and set(ready) == {200}, (
            f"{ready.count(503)} of {len(ready)} polls were not ready"
        )
    finally:
        stop_daemon(d)
        d.notify.close()
