"""The poller against a real box (sim daemon): the box's snapshot reaches the picker's router
as one placement target, polled or followed as a stream; a box that refuses the connection is
lost at once, one whose stream falls silent once it is stale; a box that does not stream (an
older daemon, faked) is polled."""

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
from talariad.wire.box import STREAM_TYPE, BoxModel, BoxSnapshot, BoxTarget
from tests.support.daemon import start_daemon, stop_daemon
from tests.support.loopback import LoopbackServer

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


async def _until(pred, what: str, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.05)


def test_the_poller_follows_a_box_stream(box):
    """Running, the poller follows the box's stream: the box takes calls, its ages keep it fresh
    while it is quiet, and a call's session comes as a change, with no poll asked."""
    picker, live = _Seen(), box.endpoint.removeprefix("http://")
    body = {"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    async def run() -> None:
        poller = BoxPoller(picker, TOKEN, hold_s=0.2)
        poller.set_boxes({"live": live})
        try:
            await _until(lambda: picker.healthy_boxes(poller.clock()) == ["live"], "healthy")
            await _until(lambda: picker.same >= 3, "the quiet box's ages")
            assert picker.healthy_boxes(poller.clock()) == ["live"] and "live" in poller._streams
            async with httpx.AsyncClient() as client:
                r = await client.post(
                    box.endpoint + "/v1/chat/completions", json=body, headers={"x-session-id": "f1"}
                )
                assert r.status_code == 200
            held = lambda: picker._held["live"].sessions  # noqa: E731
            await _until(lambda: any(k[0].split("~")[0] == "f1" for k in held()), "the session")
            assert picker.snaps[-1].target.sessions_base is not None  # as a change
            assert not poller._polled and "live" in poller._streams  # one stream all along
        finally:
            await poller.aclose()

    asyncio.run(run())


def _box_snapshot(version: int) -> bytes:
    target = BoxTarget(healthy=True, allowed_models=["m"], basis=[("i0", version)])
    return (
        BoxSnapshot(version=version, target=target, models=[BoxModel(name="m")])
        .model_dump_json()
        .encode()
    )


class _FakeBox(LoopbackServer):
    """A box on a loopback port: `old` answers every GET as a poll (an older daemon, which
    ignores `?stream=1`), `denied` refuses the token, else it streams one snapshot and then
    falls silent (a stopped box)."""

    def __init__(self, old: bool, denied: bool = False) -> None:
        self.old, self.denied, self.requests = old, denied, []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                self.requests.append((await reader.readuntil(b"\r\n\r\n")).decode())
                body = _box_snapshot(len(self.requests))
                if self.denied:
                    writer.write(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n")
                elif self.old:
                    head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    writer.write(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
                else:
                    head = f"HTTP/1.1 200 OK\r\ncontent-type: {STREAM_TYPE}\r\n"
                    frame = body + b"\n"
                    writer.write(
                        f"{head}transfer-encoding: chunked\r\n\r\n{len(frame):x}\r\n".encode()
                        + frame
                        + b"\r\n"
                    )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


def test_a_box_that_does_not_stream_is_polled():
    picker = _Seen()

    async def run(fake: _FakeBox) -> None:
        async with fake as endpoint:
            poller = BoxPoller(picker, TOKEN, hold_s=0.2)
            poller.set_boxes({"old": endpoint})
            try:
                await _until(lambda: len(picker.snaps) >= 3, "polls answered")
                assert poller._polled == {"old"} and not poller._streams
                assert picker.healthy_boxes(poller.clock()) == ["old"]
            finally:
                await poller.aclose()

    fake = _FakeBox(old=True)
    asyncio.run(run(fake))
    assert "stream=1" in fake.requests[0] and "stream=1" not in fake.requests[-1]


def test_a_box_whose_stream_falls_silent_is_lost():
    """A stopped box's connection stays open: its silence past `stale_after_s` loses it."""
    picker = _Seen()

    async def run() -> None:
        async with _FakeBox(old=False) as endpoint:
            poller = BoxPoller(picker, TOKEN, stale_after_s=0.6, hold_s=0.2)
            poller.set_boxes({"quiet": endpoint})
            try:
                await _until(lambda: picker.snaps, "the first frame")
                assert picker.healthy_boxes(poller.clock()) == ["quiet"]
                now = poller.clock
                lost = lambda: not any(s.healthy for s in picker.router.instances(now()))  # noqa: E731
                await _until(lost, "lost")
            finally:
                await poller.aclose()

    asyncio.run(run())


def test_a_box_that_refuses_the_token_is_asked_again_and_never_taken():
    picker = _Seen()

    async def run(fake: _FakeBox) -> None:
        async with fake as endpoint:
            poller = BoxPoller(picker, TOKEN, hold_s=0.2)
            poller.set_boxes({"denied": endpoint})
            try:
                await _until(lambda: len(fake.requests) >= 4, "asked again")
                assert not picker.snaps and picker.healthy_boxes(poller.clock()) == []
            finally:
                await poller.aclose()

    fake = _FakeBox(old=False, denied=True)
    asyncio.run(run(fake))
    assert any("stream=1" in r for r in fake.requests)
