"""The instance process's shell around the instance core: real time, one executor, one event sink
per call (its call-stream connection, `wire/stream.py`). It asks the core for the next step, has
the executor run it, streams the tokens, hands the result back, and sleeps until the next step is
due or a call arrives; every decision (admission, completion, rotation, forgetting, round records)
is the core's (`talariad.instance`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from talariad.cold_sched import Idle
from talariad.config import InstanceConfig, TalariaConfig
from talariad.engine.deltas import SessionDeltas
from talariad.engine.events import (
    call_order,
    done_event,
    refusal_event,
    telemetry_message,
    token_event,
)
from talariad.instance import Executor, InstanceCall, InstanceCore, Refusal, StepPlan, StepResult
from talariad.instance.rounds import HISTORY, RoundRecorder
from talariad.knobs import config_sched_knobs
from talariad.wire.messages import ErrorEvent, GenerateRequest, StreamEvent, Telemetry

log = logging.getLogger("talariad.engine")

ROUNDS_LIMIT = 50
"""Round records a rounds report carries when the asker gives no limit."""


class EventSink(Protocol):
    """Where the loop hands one call's events (`Worker.start`); called from the loop, so it must
    not wait or start or end calls itself."""

    def put_nowait(self, event: StreamEvent) -> None: ...


class Worker:
    def __init__(
        self,
        cfg: TalariaConfig,
        inst: InstanceConfig,
        executor: Executor,
        profiles: dict,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.inst, self.executor, self._clock = inst, executor, clock
        knobs = config_sched_knobs(cfg, executor.kv_capacity_tokens)
        limits = {m: cfg.model(m).max_context for m in inst.models}
        self.core = InstanceCore(
            inst.name,
            inst.pool,
            list(inst.models),
            knobs,
            profiles,
            executor=executor,
            max_context=limits,
            recorder=RoundRecorder(),
            history=HISTORY,
        )
        self.queues: dict[str, EventSink] = {}
        self.deltas = SessionDeltas()  # the telemetry consumer's view (the gateway's)
        self._t0 = clock()
        self._wake = asyncio.Event()

    @property
    def calls(self) -> dict[str, InstanceCall]:
        return self.core.calls

    def now(self) -> float:
        return self._clock() - self._t0

    async def run(self) -> None:
        try:
            await self._loop()
        except Exception as err:  # the process exits and is restarted: tell every caller first
            for queue in self.queues.values():
                message = f"instance {self.inst.name} failed: {type(err).__name__}"
                queue.put_nowait(ErrorEvent(message=message))
            raise

    async def _loop(self) -> None:
        while True:
            plan = self.core.next_plan(self.now())
            if isinstance(plan, Idle):
                await self._idle(plan.until)
                continue
            started = self.now()
            result = await self.executor.run(plan)
            self._stream(plan, result)
            now = self.now()
            for done in self.core.finish(plan, result, now, now - started):
                if (queue := self.queues.pop(done.call.call_id, None)) is not None:
                    queue.put_nowait(done_event(done))

    def _stream(self, plan: StepPlan, result: StepResult) -> None:
        """Each call's text to its queue; a failed call's error (the core ends the call)."""
        for cid, out in result.calls.items():
            if out.text and cid in self.queues:
                self.queues[cid].put_nowait(token_event(plan, cid, out))
            if out.error is not None and (queue := self.queues.pop(cid, None)) is not None:
                queue.put_nowait(ErrorEvent(message=out.error))
        if result.switch_failed is not None:
            log.warning("switch to %s failed: %s", plan.action.to_model, result.switch_failed)

    async def _idle(self, until: float | None) -> None:
        """Sleep until `until` or a wake-up (a timer rather than `wait_for`, which costs a task)."""
        self._wake.clear()
        if until is None:
            await self._wake.wait()
            return
        timer = asyncio.get_running_loop().call_later(max(0.0, until - self.now()), self._wake.set)
        try:
            await self._wake.wait()
        finally:
            timer.cancel()

    def start(self, req: GenerateRequest, events: EventSink) -> ErrorEvent | None:
        """Admit `req`; the loop hands its events to `events.put_nowait` as they come, the last one
        a `DoneEvent` or `ErrorEvent`. The refusal's event when the core refuses the call."""
        call = self.core.admit(call_order(req), self.now())
        if isinstance(call, Refusal):
            return refusal_event(call)
        self.queues[req.call_id] = events
        self._wake.set()
        return None

    def cancel(self, call_id: str) -> None:
        """The client went away: drop the call if it has not started, else stop it at its next
        step (its last event still comes); nothing if it is over."""
        if call_id in self.core.calls and self.core.cancel(call_id, self.now()):
            self.queues.pop(call_id, None)

    def abort_all(self, message: str) -> int:
        """End every live call with an error event; each call's stream then cancels it."""
        for queue in self.queues.values():
            queue.put_nowait(ErrorEvent(status=503, code="shutting_down", message=message))
        return len(self.queues)

    def count_tokens(self, req: GenerateRequest) -> int:
        """The prompt length of `req` as this instance tokenizes it (ValueError: the template refuses it)."""
        return len(self.executor.encode(req))

    def telemetry(self) -> Telemetry:
        """A fresh, versioned snapshot (every read is a new observation)."""
        return telemetry_message(self.core.telemetry(self.now()))

    def telemetry_since(self, since: int | None) -> Telemetry:
        """A snapshot whose sessions are the changes since the consumer's view `since` (the
        `sessions_epoch` of its last one; `SessionDeltas`)."""
        t = telemetry_message(self.core.telemetry(self.now(), sessions=False))
        return self.deltas.apply(t, since, self.core.session_rows())

    def rounds(self, limit: int = ROUNDS_LIMIT) -> dict:
        """The latest round records (with per-slot phases) and switch records."""
        return self.core.rounds(self.now(), limit)

    def memory_report(self) -> dict:
        """HBM layout rows and switch records of an executor that owns a memory substrate. A
        switch's total is the wall time its round paid, as in the rounds report; the executor's
        phases are the substrate's part of it."""
        report = {"instance": self.inst.name, **self.executor.memory_report()}
        recorder = self.core.recorder
        for record in report.get("switches", []) if recorder is not None else ():
            wall = recorder.wall_s(record)
            if wall is not None:
                record["total_s"] = wall
        return report

    def set_rotation(self, model: str, serve: bool) -> str | None:
        """Load or unload a configured model at run time (the core's decision); the reason it
        cannot, or None. The loop wakes: unloading the active model switches away now."""
        why = self.core.set_rotation(model, serve)
        self._wake.set()
        return why
