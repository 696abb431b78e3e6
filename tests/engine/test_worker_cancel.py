"""The instance worker with the sim executor: a client that leaves mid-decode frees the batch."""

import asyncio
import pathlib

from talariad.config import load_config
from talariad.engine.build import build_worker
from talariad.wire.messages import ChatMessage, GenerateRequest, TokenEvent
from tests.support.worker import call_events

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _worker():
    cfg = load_config(ROOT / "etc" / "talaria.yaml")
    insts = [i.model_copy(update={"executor": "sim"}) for i in cfg.instances]
    cfg = cfg.model_copy(update={"instances": insts})
    return build_worker(cfg, next(i for i in cfg.instances if i.pool == "cold"))


async def test_a_call_abandoned_mid_decode_stops_at_its_next_step():
    worker = _worker()
    loop = asyncio.create_task(worker.run())
    try:
        req = GenerateRequest(
            call_id="c1",
            session_id="s",
            model="tiny-code",
            max_tokens=2000,
            messages=[ChatMessage(role="user", content="hello")],
        )
        stream = call_events(worker, req)
        first = await anext(stream)
        assert isinstance(first, TokenEvent)
        await stream.aclose()  # the client disconnects while the call is in the running batch
        for _ in range(200):
            await asyncio.sleep(0.01)
            if not worker.calls:
                break
        assert worker.calls == {} and worker.queues == {}
        assert worker.telemetry().running == 0
    finally:
        loop.cancel()
