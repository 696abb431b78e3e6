"""One call's events from an in-process instance worker, driven as its call stream drives it
(`wire/stream.py`): `Worker.start` with a sink, and `Worker.cancel` when the consumer stops
(closing the iterator early is a client that went away)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from talariad.engine.worker import Worker
from talariad.wire.messages import GenerateRequest, StreamEvent, TokenEvent


async def call_events(worker: Worker, req: GenerateRequest) -> AsyncIterator[StreamEvent]:
    """The call's events, the last one a `DoneEvent` or `ErrorEvent` (a refusal's, at once)."""
    queue: asyncio.Queue[StreamEvent] = asyncio.Queue()
    refused = worker.start(req, queue)
    if refused is not None:
        yield refused
        return
    try:
        while True:
            event = await queue.get()
            yield event
            if not isinstance(event, TokenEvent):
                return
    finally:
        worker.cancel(req.call_id)
