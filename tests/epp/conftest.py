"""An EPP server on a loopback port with a recording picker, and a channel to it (in-process)."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import pytest

from talariad.epp.server import EPPServer, ExtProcServicer, TLSFiles, start
from tests.epp.fake_envoy import Conversation, RecordingPicker


@dataclass
class Running:
    server: EPPServer
    processor: ExtProcServicer
    picker: RecordingPicker
    channel: grpc.aio.Channel

    def stream(self, metadata: tuple = ()) -> Conversation:
        return Conversation(self.channel, metadata)


@pytest.fixture
async def epp():
    """`await epp(picker=..., max_body_bytes=..., tls=..., channel=...)` starts one."""
    running: list[Running] = []

    async def make(
        picker: RecordingPicker | None = None,
        tls: TLSFiles | None = None,
        channel=None,
        **options,
    ) -> Running:
        picker = picker or RecordingPicker()
        processor = ExtProcServicer(picker, clock=lambda: 100.0, **options)
        server = await start(processor, "127.0.0.1:0", tls)
        chan = (
            channel(server.port)
            if channel
            else grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
        )
        running.append(Running(server, processor, picker, chan))
        return running[-1]

    yield make
    for r in running:
        await r.channel.close()
        await r.server.server.stop(0)
