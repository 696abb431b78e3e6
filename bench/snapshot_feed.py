"""Boxes' snapshot streams without the boxes, for `epp_bench.py --part poll`: one process that
answers every `GET /pool/snapshot?stream=1` on a loopback port as a box of its own would (each
connection one box), a share of them busy, the rest idle, their frames spread evenly in time as
distinct boxes' are. So the picker's CPU at 1,000 boxes is measured with 1,000 streams, not
extrapolated from one sim box under many names (whose changes reach every stream at once).

A busy box sends a snapshot `BUSY_CHANGES_PER_S` times a second, each with a new session, the
one of `KEPT` frames before removed, and a new basis (the picker installs each, as a busy
daemon's); an idle one its target's age every `IDLE_AGE_S` (a stream's default hold). Each
stream begins with the box's whole snapshot, as a daemon's does.

    python bench/snapshot_feed.py PORT_FILE BUSY_SHARE
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import sys
import time
from pathlib import Path

from talariad.router.messages import ModelResidency, ModelState
from talariad.types import KVLocation, KVState
from talariad.wire.box import STREAM_TYPE, BoxModel, BoxSnapshot, BoxTarget

BUSY_CHANGES_PER_S = 4.0  # a daemon reads its instances' telemetry every 250 ms
IDLE_AGE_S = 0.5  # the picker's `poll_hold_s`
KEPT = 8  # sessions a busy box keeps (each frame adds one and drops the oldest)
MODEL = "tiny-agent"
HEAD = (
    f"HTTP/1.1 200 OK\r\ncontent-type: {STREAM_TYPE}\r\ntransfer-encoding: chunked\r\n\r\n"
).encode()


class FakeBox:
    """One connection's box: its session epoch, basis version and sessions."""

    def __init__(self, index: int, writer: asyncio.StreamWriter, busy: bool) -> None:
        self.index, self.writer, self.busy = index, writer, busy
        self.epoch, self.version, self.calls = random.getrandbits(40), 0, 0

    def frame(self, whole: bool) -> bytes:
        if not whole and not self.busy:
            return b"%.6f\n" % random.uniform(0.0, 0.25)
        base, self.epoch, self.version = self.epoch, self.epoch + 1, self.version + 1
        self.calls += 1
        new = KVLocation(f"b{self.index}-s{self.calls}", MODEL, KVState.DEVICE, 512 + self.calls)
        old = f"b{self.index}-s{self.calls - KEPT}"
        target = BoxTarget(
            sessions=[new],
            sessions_base=None if whole else base,
            sessions_removed=[] if whole or self.calls <= KEPT else [(old, MODEL)],
            healthy=True,
            allowed_models=[MODEL],
            models={MODEL: ModelResidency(ModelState.ACTIVE, 0.0, self.calls % 7, 1, 2)},
            round_load_s=0.01 * (self.calls % 5),
            hbm_free_bytes=3 << 30,
            age_s=random.uniform(0.0, 0.25),
            basis=[(f"i{self.index}", self.version)],
            queue=float(self.calls % 3),
            instances=1,
        )
        snap = BoxSnapshot(
            version=self.version,
            sessions_epoch=self.epoch,
            target=target,
            models=[BoxModel(name=MODEL, aliases=["gpt-*"])] if whole else None,
            max_connections=512,
            etag=f'"{self.version:016x}-{self.epoch}"',
        )
        return snap.model_dump_json().encode() + b"\n"

    def send(self, whole: bool = False) -> None:
        data = self.frame(whole)
        self.writer.write(b"%x\r\n%s\r\n" % (len(data), data))


class Feed:
    """Every connection a box; frames sent when due, from one schedule (a heap of due times)."""

    def __init__(self, busy_share: float) -> None:
        self.busy_share, self.count = busy_share, itertools.count()
        self.due: list[tuple[float, int, FakeBox]] = []
        self.wake = asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        index = next(self.count)
        # busy boxes spread among the idle ones: index i is busy while its share says so
        busy = int((index + 1) * self.busy_share) > int(index * self.busy_share)
        box = FakeBox(index, writer, busy)
        writer.write(HEAD)
        box.send(whole=True)
        period = 1 / BUSY_CHANGES_PER_S if busy else IDLE_AGE_S
        heapq.heappush(self.due, (time.monotonic() + random.uniform(0, period), index, box))
        self.wake.set()
        try:
            await reader.read()  # until the picker closes it
        except ConnectionError:
            pass
        box.writer = None  # type: ignore[assignment]
        writer.close()

    async def send_due(self) -> None:
        while True:
            if not self.due:
                self.wake.clear()
                await self.wake.wait()
            at, index, box = self.due[0]
            now = time.monotonic()
            if at > now:
                await asyncio.sleep(at - now)
                continue
            heapq.heappop(self.due)
            if box.writer is None or box.writer.is_closing():
                continue
            box.send()
            period = 1 / BUSY_CHANGES_PER_S if box.busy else IDLE_AGE_S
            heapq.heappush(self.due, (at + period, index, box))


async def main(port_file: Path, busy_share: float) -> None:
    feed = Feed(busy_share)
    server = await asyncio.start_server(feed.serve, "127.0.0.1", 0, backlog=4096)
    port_file.write_text(str(server.sockets[0].getsockname()[1]))
    await feed.send_due()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), float(sys.argv[2])))
