"""Readiness under load: 200 concurrent sessions on sim executors never flip `/ready`."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from tests.support.daemon import start_daemon, stop_daemon

pytestmark = pytest.mark.e2e

SESSIONS = 200
TURNS = 3  # every session is open at once; three turns keep the load up for a few seconds


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


def _watch(endpoint: str, stop: threading.Event, ready: list[int]) -> None:
    """Poll `/ready` from a thread of its own: the load's event loop cannot delay the polls."""
    with httpx.Client(base_url=endpoint, timeout=30) as client:
        while not stop.is_set():
            ready.append(client.get("/ready").status_code)
            stop.wait(0.05)


async def _load(endpoint: str) -> list[int]:
    limits = httpx.Limits(max_connections=SESSIONS + 10, max_keepalive_connections=SESSIONS + 10)
    async with httpx.AsyncClient(base_url=endpoint, timeout=120, limits=limits) as client:
        calls = await asyncio.gather(*(_session(client, i) for i in range(SESSIONS)))
        return [s for statuses in calls for s in statuses]


def _load_and_watch(endpoint: str) -> tuple[list[int], list[int]]:
    stop, ready = threading.Event(), []
    watcher = threading.Thread(target=_watch, args=(endpoint, stop, ready))
    watcher.start()
    try:
        calls = asyncio.run(_load(endpoint))
    finally:
        stop.set()
        watcher.join()
    return calls, ready


def test_ready_never_flips_under_200_sessions(tmp_path):
    d = start_daemon(tmp_path, executor="sim", instance={"time_scale": 0.5})
    try:
        calls, ready = _load_and_watch(d.endpoint)
        assert calls == [200] * (TURNS * SESSIONS)
        assert len(ready) >= 3 and set(ready) == {200}, (
            f"{ready.count(503)} of {len(ready)} polls were not ready"
        )
    finally:
        stop_daemon(d)
        d.notify.close()
