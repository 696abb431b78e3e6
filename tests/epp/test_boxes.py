"""The poller against a real box (sim daemon): the box's snapshot reaches the picker's router
as one placement target; a box that refuses the connection is lost at once."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from talariad.epp.boxes import BoxPoller
from talariad.epp.boxpicker import BoxPicker
from talariad.epp.picker import EPPRequest, Pick
from talariad.router import Router, RouterKnobs
from tests.support.daemon import start_daemon, stop_daemon

TOKEN = "pool-secret-2"


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
