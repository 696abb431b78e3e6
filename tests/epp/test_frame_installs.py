"""The poller's install queue: a stream's frames are installed in order, in short runs between
which the event loop serves what else is ready (a pick); a refused frame ends its stream and
its later frames are not installed; a forgotten box's queued frames are not installed."""

from __future__ import annotations

import asyncio

from talariad.epp import poller as poller_mod
from talariad.epp.boxstream import StreamEnded
from talariad.epp.poller import BoxPoller, _Following


class _Feed:
    """A picker that takes every frame but the age frames (`box_same`) of `refused` boxes."""

    def __init__(self, refused: set[str] = frozenset()) -> None:
        self.same: list[tuple[str, float]] = []
        self.refused = refused

    def box_seen(self, name: str, endpoint: str, snap, now: float) -> bool:
        self.same.append((name, -1.0))
        return True

    def box_same(self, name: str, age_s: float, now: float) -> bool:
        if name in self.refused:
            return False
        self.same.append((name, age_s))
        return True


class _Stream:
    def __init__(self) -> None:
        self.ended: list[BaseException | None] = []

    def end(self, why: BaseException | None) -> None:
        self.ended.append(why)


def _following() -> _Following:
    f = _Following()
    f.stream = _Stream()  # type: ignore[assignment]
    return f


async def _all_installed(*followings: _Following) -> None:
    for f in followings:
        await f.installed()


def test_frames_install_in_order_and_a_ready_callback_runs_between_runs(monkeypatch):
    monkeypatch.setattr(poller_mod, "INSTALL_SLICE_S", 0.0)  # one frame a run
    feed = _Feed()
    poller = BoxPoller(feed, "t")  # type: ignore[arg-type]
    seen_by_pick: list[int] = []

    async def run() -> None:
        boxes = {f"b{i}": _following() for i in range(20)}
        for step in range(5):
            for name, f in boxes.items():
                poller._queue(f, name, "e", f"{step}.5".encode())
        asyncio.get_running_loop().call_soon(lambda: seen_by_pick.append(len(feed.same)))
        await _all_installed(*boxes.values())

    asyncio.run(run())
    assert len(feed.same) == 100
    assert 0 < seen_by_pick[0] < 100  # the pick's callback ran while frames were still queued
    for i in range(20):
        assert [a for n, a in feed.same if n == f"b{i}"] == [0.5, 1.5, 2.5, 3.5, 4.5]


def test_a_refused_frame_ends_its_stream_and_its_later_frames_are_not_installed():
    feed = _Feed(refused={"bad"})
    poller = BoxPoller(feed, "t")  # type: ignore[arg-type]
    bad, good = _following(), _following()

    async def run() -> None:
        for step in range(3):
            poller._queue(bad, "bad", "e", f"{step}".encode())
            poller._queue(good, "good", "e", f"{step}".encode())
        await _all_installed(bad, good)

    asyncio.run(run())
    assert feed.same == [("good", 0.0), ("good", 1.0), ("good", 2.0)]
    assert len(bad.stream.ended) == 1 and isinstance(bad.stream.ended[0], StreamEnded)
    assert isinstance(bad.why, StreamEnded) and not good.stream.ended


def test_a_malformed_frame_ends_its_stream_with_the_error():
    feed = _Feed()
    poller = BoxPoller(feed, "t")  # type: ignore[arg-type]
    f = _following()

    async def run() -> None:
        poller._queue(f, "b", "e", b"{not json")
        poller._queue(f, "b", "e", b"1.0")
        await f.installed()

    asyncio.run(run())
    assert isinstance(f.why, ValueError) and f.stream.ended == [f.why]
    assert feed.same == []  # nothing after it


def test_a_forgotten_boxs_queued_frames_are_not_installed():
    feed = _Feed()
    poller = BoxPoller(feed, "t")  # type: ignore[arg-type]
    gone, kept = _following(), _following()

    async def run() -> None:
        poller._following["gone"] = gone
        for step in range(3):
            poller._queue(gone, "gone", "e", f"{step}".encode())
            poller._queue(kept, "kept", "e", f"{step}".encode())
        poller._forget("gone")
        await _all_installed(gone, kept)

    asyncio.run(run())
    assert [n for n, _ in feed.same] == ["kept"] * 3
    assert not gone.stream.ended  # forgotten, not refused
