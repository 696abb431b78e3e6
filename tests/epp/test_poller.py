"""The poller against a real box (sim daemon): the box's snapshot reaches the picker's router
as one placement target; a box that refuses the connection is lost at once."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import pytest

from talariad.epp.boxpicker import BoxPicker
from talariad.epp.contract import EPPRequest, Pick
from talariad.epp.poller import BoxPoller
from talariad.router import Router, RouterKnobs
from tests.support.daemon import start_daemon, stop_daemon

TOKEN = "pool-secret-2"

pytestmark = pytest.mark.e2e  # a real daemon on a loopback port


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("box")
    (tmp / "pool.token").write_text(TOKEN)
    d = start_daemon(tmp, {"pool": {"token_file": "pool.token"}}, executor="sim")
    yield d
    stop_daemon(d)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_polled_box_takes_calls_and_a_refusing_one_is_lost(box):
    picker = BoxPicker(Router(RouterKnobs(), {}))
    live, dead = box.endpoint.removeprefix("http://"), f"127.0.0.1:{_closed_port()}"

    async def poll() -> tuple[bool, bool, bool]:
        poller = BoxPoller(picker, TOKEN)
        try:
            for _ in range(100):  # until the box's instances are ready
                if await poller.poll("live", live) and picker.healthy_boxes(poller.clock()):
                    break
                await asyncio.sleep(0.2)
            refused = await poller.poll("dead", dead)
            wrong = BoxPoller(picker, "not-the-token")
            denied = await wrong.poll("live2", live)
            await wrong.aclose()
            return True, refused, denied
        finally:
            await poller.aclose()

    _, refused, denied = asyncio.run(poll())
    assert not refused and not denied
    now = max(picker._seen_at.values())
    assert picker.healthy_boxes(now) == ["live"]
    model = picker._models["live"][0].name
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    req = EPPRequest("c1", "POST", "/v1/chat/completions", {}, json.dumps(body).encode())
    assert picker.pick(req, now) == Pick("c1", live)


class _Seen(BoxPicker):
    """The picker, keeping each snapshot the poller hands it."""

    def __init__(self) -> None:
        super().__init__(Router(RouterKnobs(), {}))
        self.snaps: list = []

        self.same = 0  # polls answered `304`

    def box_seen(self, name, endpoint, snap, now) -> bool:
        self.snaps.append(snap)
        return super().box_seen(name, endpoint, snap, now)

    def box_same(self, name, age_s, now) -> bool:
        self.same += 1
        return super().box_same(name, age_s, now)


def test_the_poller_asks_for_changes_and_falls_back_to_whole_views(box):
    picker, live = _Seen(), box.endpoint.removeprefix("http://")
    body = {"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    async def run() -> None:
        poller = BoxPoller(picker, TOKEN)
        try:
            assert await poller.poll("live", live)
            async with httpx.AsyncClient() as client:
                await client.post(
                    box.endpoint + "/v1/chat/completions",
                    json=body,
                    headers={"x-session-id": "p1"},
                )
            for _ in range(100):  # until the session reaches the box's view, as a change
                assert await poller.poll("live", live)
                held = picker._held["live"].sessions
                if any(k[0].split("~")[0] == "p1" for k in held):
                    break
                await asyncio.sleep(0.1)
            assert picker.snaps[-1].target.sessions_base is not None
            picker._held["live"].epoch = 12345  # a token the box does not know (it restarted)
            assert await poller.poll("live", live)
            assert picker.snaps[-1].target.sessions_base is None
            assert picker.since("live") == picker.snaps[-1].sessions_epoch
        finally:
            await poller.aclose()

    asyncio.run(run())
    assert any(
        k[0].split("~")[0] == "p1" for k in picker.router._instances.get("live").snapshot.sessions
    )


def test_a_quiet_box_is_polled_the_cheap_way_and_stays_fresh(box):
    """Past the staleness bound of polls answered `304` only, the box is fresh and takes calls;
    a call's session then comes as a snapshot."""
    picker, live = _Seen(), box.endpoint.removeprefix("http://")
    body = {"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    async def run() -> None:
        poller = BoxPoller(picker, TOKEN)
        try:
            for _ in range(200):  # until the box is quiet
                assert await poller.poll("live", live)
                if picker.same:
                    break
                await asyncio.sleep(0.1)
            seen = len(picker.snaps)
            started = poller.clock()
            while poller.clock() - started < 2.5 * picker.router.knobs.staleness_s:
                assert await poller.poll("live", live)
                assert picker.healthy_boxes(poller.clock()) == ["live"]
                await asyncio.sleep(0.1)
            # an idle sim box says the same for seconds on end (its instances idle)
            assert picker.same > 2 * (len(picker.snaps) - seen)
            async with httpx.AsyncClient() as client:
                r = await client.post(
                    box.endpoint + "/v1/chat/completions", json=body, headers={"x-session-id": "q1"}
                )
                assert r.status_code == 200
            for _ in range(100):  # until the session reaches the picker, as a change
                assert await poller.poll("live", live)
                if any(k[0].split("~")[0] == "q1" for k in picker._held["live"].sessions):
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the call's session never reached the picker")
            assert picker.snaps[-1].target.sessions_base is not None
        finally:
            await poller.aclose()

    asyncio.run(run())
