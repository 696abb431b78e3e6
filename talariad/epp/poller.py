"""Box snapshots in: the discovered boxes' `GET /pool/snapshot`, polled with the pool token,
each handed to the picker, which installs the box as one placement target as the box computed it.

Discovery is any async iterator of `{name: "ip:port"}` (each item the whole current set):
`epp.discovery` provides the file and Kubernetes sources.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Protocol

from talariad.wire.box import AGE_HEADER, SNAPSHOT_PATH, BoxSnapshot

from .boxconn import BoxConnection, BoxUnreachable
from .boxstream import BoxStream, NotAStream, StreamEnded, open_stream

log = logging.getLogger("talariad.epp")

Discovery = AsyncIterator[Mapping[str, str]]


class BoxFeed(Protocol):
    """What the poller tells: the picker (`BoxPicker`)."""

    def box_seen(self, name: str, endpoint: str, snap: BoxSnapshot, now: float) -> bool: ...

    def since(self, name: str) -> int | None: ...

    def etag(self, name: str) -> str | None: ...

    def box_same(self, name: str, age_s: float, now: float) -> bool: ...

    def box_lost(self, name: str, now: float) -> None: ...

    def box_gone(self, name: str, now: float) -> None: ...


INSTALL_SLICE_S = 0.0005
"""The longest run of stream frames installed before the event loop serves what else is ready
(a pick): frames are queued as they come and installed in runs this long (docs/pool.md)."""


class _Following:
    """One stream's frames in the install queue: skipped once its box is forgotten or one of its
    frames is refused (`refuse`: the stream ends with why)."""

    __slots__ = ("stream", "why", "dropped", "queued", "idle")

    def __init__(self) -> None:
        self.stream: BoxStream | None = None  # once open (a frame may come before)
        self.why: BaseException | None = None
        self.dropped = False
        self.queued = 0  # its frames not yet installed
        self.idle: asyncio.Future | None = None  # resolved when `queued` falls to 0

    def refuse(self, why: BaseException) -> None:
        self.dropped, self.why = True, why
        if self.stream is not None:
            self.stream.end(why)

    def done_one(self) -> None:
        self.queued -= 1
        if not self.queued and self.idle is not None and not self.idle.done():
            self.idle.set_result(None)

    async def installed(self) -> None:
        """Until its queued frames are installed (or skipped)."""
        if self.queued:
            self.idle = asyncio.get_running_loop().create_future()
            await self.idle


class BoxPoller:
    """One task per box: it follows the box's snapshot stream (`stream`: the answers of held
    polls, pushed as the box changes), or polls it every `interval_s` where the box does not
    stream (an older daemon) or `stream` is off. A box that refuses the connection is lost at
    once (nothing listens: its calls would fail too); one that errs, times out or falls silent is
    lost once it has not answered for `stale_after_s`."""

    def __init__(
        self,
        feed: BoxFeed,
        token: str,
        interval_s: float = 0.1,
        stale_after_s: float = 2.0,
        hold_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        stream: bool = True,
    ) -> None:
        """`hold_s`: how long a box may hold a conditional poll while nothing changes there
        (`?wait=`; 0: answered at once, and no stream), cut so that an unchanged box is heard
        from at least every half `stale_after_s` (`BoxPicker.box_same` renews its target by
        then); on a stream, how often an unchanged box sends its age."""
        hold_s = min(hold_s, max(stale_after_s / 2 - interval_s, 0.0))
        self.stream = stream and hold_s > 0
        self.feed, self.interval_s, self.stale_after_s, self.hold_s, self.clock = (
            feed,
            interval_s,
            stale_after_s,
            hold_s,
            clock,
        )
        self._headers = {"authorization": f"Bearer {token}"}
        self._timeout_s = min(stale_after_s, 1.0)
        self._conns: dict[str, BoxConnection] = {}  # box -> its kept-alive connection
        self._tasks: dict[str, tuple[str, asyncio.Task]] = {}
        self.last_ok: dict[str, float] = {}
        self._streams: dict[str, BoxStream] = {}  # box -> its open stream
        self._polled: set[str] = set()  # boxes that answered a stream as a poll (older daemons)
        self._told_lost: set[str] = set()  # boxes the watch found silent past `stale_after_s`
        self._watch: asyncio.Task | None = None
        self._following: dict[str, _Following] = {}  # box -> its stream's place in the queue
        self._frames: deque[tuple[_Following, str, str, bytes]] = deque()  # to install, in order
        self._draining = False

    def set_boxes(self, boxes: Mapping[str, str]) -> None:
        """Follow discovery: poll new boxes, stop and forget those gone or moved."""
        now = self.clock()
        for name, (ep, task) in list(self._tasks.items()):
            if boxes.get(name) != ep:
                task.cancel()
                del self._tasks[name]
                self._forget(name)
                self.feed.box_gone(name, now)
        for name, ep in boxes.items():
            if name not in self._tasks:
                self._tasks[name] = (ep, asyncio.create_task(self._poll_forever(name, ep)))
        if self.stream and self._watch is None and self._tasks:
            self._watch = asyncio.create_task(self._watch_streams())

    async def run(self, discovery: Discovery) -> None:
        """Follow `discovery` until cancelled."""
        try:
            async for boxes in discovery:
                self.set_boxes(boxes)
        finally:
            await self.aclose()

    def _forget(self, name: str) -> None:
        following = self._following.pop(name, None)
        if following is not None:  # its queued frames are not installed
            following.dropped = True
        stream = self._streams.pop(name, None)
        if stream is not None:  # now, not at its task's cancel: no frame of it is read after
            stream.end(None)
        self.last_ok.pop(name, None)
        self._polled.discard(name)
        self._told_lost.discard(name)
        conn = self._conns.pop(name, None)
        if conn is not None:
            conn.close()

    async def aclose(self) -> None:
        tasks = [t for _, t in self._tasks.values()]
        if self._watch is not None:
            tasks.append(self._watch)
            self._watch = None
        for stream in self._streams.values():  # now: no frame is read while the tasks end
            stream.end(None)
        self._streams.clear()
        for following in self._following.values():
            following.dropped = True
        self._following.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    async def _poll_forever(self, name: str, endpoint: str) -> None:
        while True:
            if self.stream and name not in self._polled:
                if await self.follow(name, endpoint):
                    continue  # its frames asked for the view whole, or it answered as a poll
            elif not await self.poll(name, endpoint):
                self._polled.discard(name)  # a restarted box may stream: asked again
            await asyncio.sleep(self.interval_s)

    async def follow(self, name: str, endpoint: str) -> bool:
        """Follow the box's snapshot stream until it ends (`?stream=1`; from the view and
        snapshot held, as a poll asks). Each frame is handed to the picker as the poll's answer
        would be (`_frame`). True when the poller should go on at once: the frames asked for the
        view whole (a frame the picker could not install), or the box answered as to a poll (an
        older daemon: it is polled from then on, until a poll fails)."""
        since = self.feed.since(name)
        etag = None if since is None else self.feed.etag(name)
        params = {"stream": "1", "wait": str(self.hold_s), "gap": str(self.interval_s)}
        if since is not None:
            params["since"] = str(since)
        conn = self._conn(name, endpoint)
        headers = None if etag is None else {"if-none-match": etag}
        request = conn.request(SNAPSHOT_PATH, params, headers)
        following = _Following()
        on_frame = functools.partial(self._queue, following, name, endpoint)
        try:
            stream = await open_stream(conn.host, conn.port, request, on_frame, self._timeout_s)
        except BoxUnreachable as err:
            log.debug("box %s (%s) refused: %s", name, endpoint, err)
            self.feed.box_lost(name, self.clock())
            return False
        except (OSError, TimeoutError) as err:
            self._failed(name, endpoint, err)
            return False
        following.stream = stream
        if following.dropped:  # a frame that came with the connection was refused
            stream.end(following.why)
        self._streams[name] = stream
        self._following[name] = following
        try:
            why = await stream.ended
            await following.installed()  # the next request asks from the view they make
            why = following.why or why
        finally:
            stream.end(None)  # cancelled: closed
            if self._streams.get(name) is stream:
                del self._streams[name]
            if self._following.get(name) is following:
                del self._following[name]
            self._told_lost.discard(name)
        if isinstance(why, StreamEnded):
            return since is not None  # once: a stream opened whole is never asked anew
        if isinstance(why, NotAStream) and why.status in (200, 304):
            self._polled.add(name)
            return True
        if why is not None and not isinstance(why, (OSError, TimeoutError, ValueError)):
            raise why  # the picker's own error
        self._failed(name, endpoint, why or ConnectionResetError("the box ended its stream"))
        return False

    def _queue(self, following: _Following, name: str, endpoint: str, frame: bytes) -> bool:
        """A stream's frame, queued to be installed (`_install`) after what the event loop has
        ready: a burst of frames from many boxes (each an install of ~0.1 ms) delays a pick by
        one run of them, not by all (docs/pool.md, "Box snapshots")."""
        following.queued += 1
        self._frames.append((following, name, endpoint, frame))
        if not self._draining:
            self._draining = True
            asyncio.get_running_loop().call_soon(self._install)
        return True

    def _install(self) -> None:
        """Install queued frames, in order, for up to `INSTALL_SLICE_S`; the rest after what
        the event loop has ready meanwhile."""
        frames, until = self._frames, time.perf_counter() + INSTALL_SLICE_S
        while frames:
            following, name, endpoint, frame = frames.popleft()
            if not following.dropped:
                try:
                    if not self._frame(name, endpoint, frame):
                        following.refuse(StreamEnded())
                except Exception as err:  # noqa: BLE001 (the stream's end says it: `follow`)
                    following.refuse(err)
            following.done_one()
            if time.perf_counter() >= until:
                break
        if frames:
            asyncio.get_running_loop().call_soon(self._install)
        else:
            self._draining = False

    def _frame(self, name: str, endpoint: str, frame: bytes) -> bool:
        """One frame of the box's stream, handed to the picker as a poll's answer would be: a
        snapshot (`box_seen`), or the target's age (`box_same`). False: the picker could not
        install it (end the stream, ask anew). Raises ValueError for a frame that is neither."""
        now = self.clock()
        if frame[:1] == b"{":
            ok = self.feed.box_seen(name, endpoint, BoxSnapshot.model_validate_json(frame), now)
        else:
            ok = self.feed.box_same(name, _age(frame.decode("latin-1")), now)
        if ok:
            self.last_ok[name] = now
            self._told_lost.discard(name)
        return ok

    def _failed(self, name: str, endpoint: str, err: BaseException) -> None:
        """The box did not answer: lost once it has not for `stale_after_s`."""
        now = self.clock()
        log.debug("box %s (%s) did not answer: %s", name, endpoint, err)
        if now - self.last_ok.get(name, float("-inf")) > self.stale_after_s:
            self.feed.box_lost(name, now)

    async def _watch_streams(self) -> None:
        """A stream silent for longer than a held poll could be (its age every `hold_s`) is
        ended as a poll would time out; a box silent past `stale_after_s` is lost then, not at
        that end (a stopped box's connection stays open). One task for every stream: a frame
        arms no timer."""
        silent_s = self.hold_s + self._timeout_s
        while True:
            await asyncio.sleep(max(min(self.hold_s, 0.25), 0.05))
            heard_by, now = time.monotonic() - silent_s, self.clock()
            for name, stream in list(self._streams.items()):
                if stream.heard < heard_by:
                    stream.end(TimeoutError(f"no frame for {silent_s:g}s"))
                last = self.last_ok.get(name)
                if last is not None and now - last > self.stale_after_s:
                    if name not in self._told_lost:
                        self._told_lost.add(name)
                        self.feed.box_lost(name, now)

    async def poll(self, name: str, endpoint: str) -> bool:
        """One poll of one box; True when it answered with a snapshot, or that the one held
        stands. Sessions come as changes since the view the picker holds (`?since=`); a box that
        cannot send them (a restart, a token too old) sends them whole. The poll is conditional
        on the snapshot held (`If-None-Match`): a box whose state says the same holds it up to
        `hold_s` (answered as soon as that changes), then answers `304` with its age only, which
        neither end serializes or parses."""
        since = self.feed.since(name)
        etag = None if since is None else self.feed.etag(name)
        try:
            snap = await self._fetch(name, endpoint, since, etag)
        except BoxUnreachable as err:
            log.debug("box %s (%s) refused: %s", name, endpoint, err)
            self.feed.box_lost(name, self.clock())
            return False
        # OSError: a reset; ValueError: an error status, or a body that is no snapshot
        except (OSError, TimeoutError, ValueError) as err:
            self._failed(name, endpoint, err)
            return False
        now = self.clock()
        if isinstance(snap, float):
            if not self.feed.box_same(name, snap, now):  # the target held was let go since
                return await self.poll(name, endpoint)  # whole, once: nothing held to name
            self.last_ok[name] = now
            return True
        if not self.feed.box_seen(name, endpoint, snap, now):
            # changes to a view the picker lost (a daemon never sends them): ask for it whole
            return since is not None and await self.poll(name, endpoint)  # once
        self.last_ok[name] = now
        return True

    async def _fetch(
        self, name: str, endpoint: str, since: int | None, etag: str | None
    ) -> BoxSnapshot | float:
        """The box's snapshot, or its target's age when the one `etag` names stands (`304`)."""
        params = {} if since is None else {"since": str(since)}
        headers, timeout_s = None, self._timeout_s
        if etag is not None:  # held by the box while what it would send is the same
            headers, params["wait"] = {"if-none-match": etag}, str(self.hold_s)
            timeout_s += self.hold_s
        reply = await self._conn(name, endpoint).get(SNAPSHOT_PATH, params, headers, timeout_s)
        if reply.status == 304:
            return _not_modified_age(reply.headers.get(AGE_HEADER), etag)
        if reply.status != 200:
            raise ValueError(f"HTTP {reply.status}: {reply.body[:200]!r}")
        return BoxSnapshot.model_validate_json(reply.body)

    def _conn(self, name: str, endpoint: str) -> BoxConnection:
        """The box's connection, kept alive across polls (one per box, its polls one at a
        time)."""
        conn = self._conns.get(name)
        if conn is None or conn.endpoint != endpoint:
            if conn is not None:
                conn.close()
            conn = self._conns[name] = BoxConnection(endpoint, self._headers)
        return conn


def _not_modified_age(header: str | None, etag: str | None) -> float:
    """The target's age a `304` says; ValueError (no answer) when it is no age, or the poll named
    no snapshot to keep."""
    if etag is None:
        raise ValueError(f"a 304 with no snapshot to keep ({AGE_HEADER}: {header})")
    return _age(header or "nan")


def _age(text: str) -> float:
    """A target's age as the box sends it; ValueError when it is none."""
    age = float(text)
    if not (math.isfinite(age) and age >= 0):
        raise ValueError(f"no target's age: {text[:40]!r}")
    return age
