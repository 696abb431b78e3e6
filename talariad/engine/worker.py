"""The instance process's shell around the instance core: real time, one executor, one token queue
per call. It asks the core for the next step, has the executor run it, hands the result back and
streams tokens; every decision is the core's (`talariad.instance`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

from talariad.cold_sched import Idle, Switch
from talariad.config import InstanceConfig, TalariaConfig
from talariad.engine.messages import (
    DoneEvent,
    ErrorEvent,
    GenerateRequest,
    StreamEvent,
    Telemetry,
    TokenEvent,
    Usage,
)
from talariad.engine.rounds import RoundRecorder
from talariad.instance import Executor, InstanceCall, InstanceCore
from talariad.instance.core import Done
from talariad.knobs import config_sched_knobs

log = logging.getLogger("talariad.engine")


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
        )
        self.queues: dict[str, asyncio.Queue[StreamEvent]] = {}
        self._t0 = clock()
        self._wake = asyncio.Event()
        self.recorder = RoundRecorder()

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
            for cid, out in result.calls.items():
                if out.text and cid in self.queues:
                    self.queues[cid].put_nowait(self._token(plan, cid, out))
                if out.error is not None and (queue := self.queues.pop(cid, None)) is not None:
                    queue.put_nowait(ErrorEvent(message=out.error))  # the core ends the call
            if result.switch_failed is not None:
                log.warning("switch to %s failed: %s", plan.action.to_model, result.switch_failed)
            now = self.now()
            finished = self.core.finish(plan, result, now, now - started)
            switch = plan.action if isinstance(plan.action, Switch) else None
            last_switch = getattr(self.executor, "last_switch", None) if switch else None
            self.recorder.on_action(
                plan.action,
                now - started,
                self.core.sched,
                now,
                last_switch() if last_switch is not None else None,
            )
            for done in finished:
                self._complete(done)

    async def _idle(self, until: float | None) -> None:
        self._wake.clear()
        timeout = None if until is None else max(0.0, until - self.now())
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except TimeoutError:
            pass

    def _token(self, plan, cid: str, out) -> TokenEvent:
        """A piece of text; the call's first also says how long the prompt is and how much of it was
        reused (Anthropic's `message_start` reports both)."""
        call = plan.calls.get(cid)
        if call is None or call.out:
            return TokenEvent(text=out.text)
        cached = out.cached_tokens if out.cached_tokens is not None else call.cached_tokens
        if cached is None:  # the scheduler's plan
            item = next(
                (
                    i
                    for i in getattr(plan.action, "calls", ())
                    if getattr(i, "call_id", None) == cid
                ),
                None,
            )
            cached = item.cached_device_tokens + item.restore_tokens if item is not None else 0
        return TokenEvent(text=out.text, prompt_tokens=call.prompt_tokens, cached_tokens=cached)

    def _complete(self, done: Done) -> None:
        queue = self.queues.pop(done.call.call_id, None)
        if queue is None:
            return
        c = done.completion
        usage = Usage(
            prompt_tokens=c.prompt_tokens,
            completion_tokens=done.call.generated,
            cached_tokens=done.cached_tokens,
            kv_source=done.call.kv_source,
        )
        queue.put_nowait(
            DoneEvent(
                finish_reason=done.finish_reason,
                stop_sequence=done.call.stop_sequence,
                usage=usage,
                ttft_s=c.ttft_s,
                kv_state=done.kv_state.value,
                kv_len=done.kv_len,
            )
        )

    def abort_all(self, message: str) -> int:
        """End every live call with an error event; each call's stream then cancels it."""
        for queue in self.queues.values():
            queue.put_nowait(ErrorEvent(status=503, code="shutting_down", message=message))
        return len(self.queues)

    async def generate(self, req: GenerateRequest) -> AsyncIterator[StreamEvent]:
        if req.model not in self.core.models:
            yield ErrorEvent(
                message=f"instance {self.inst.name} does not serve model {req.model!r} now",
                code="model_not_loaded",
            )
            return
        try:
            prompt = self.executor.encode(req)
        except ValueError as err:  # a conversation the model's chat template refuses
            yield ErrorEvent(status=400, code="invalid_value", param="messages", message=str(err))
            return
        if (
            req.clamp_max_tokens and prompt
        ):  # lower the output limit to what fits (at least one token)
            req.max_tokens = max(1, min(req.max_tokens, self.core.room(req.model, len(prompt))))
        refusal = self.core.refusal(req.model, len(prompt), req.max_tokens)
        if refusal is not None:
            yield ErrorEvent(
                status=400,
                code=refusal.code,
                param=refusal.param,
                message=refusal.message,
                prompt_tokens=len(prompt) if refusal.limit is not None else None,
                limit=refusal.limit,
            )
            return
        session = req.session_id or f"call-{req.call_id}"
        call = InstanceCall(
            req.call_id,
            session,
            req.model,
            len(prompt),
            req.max_tokens,
            self.now(),
            request=req,
            prompt=prompt,
        )
        try:
            self.core.submit(call, self.executor.reusable(session, req.model, prompt), self.now())
        except ValueError as err:  # anything else the scheduler finds it can never fit
            yield ErrorEvent(status=400, code="invalid_value", message=str(err))
            return
        queue = self.queues[req.call_id] = asyncio.Queue()
        self._wake.set()
        try:
            while True:
                event = await queue.get()
                yield event
                if not isinstance(event, TokenEvent):
                    return
        finally:  # the client went away: drop what has not started, stop the rest at its next step
            if req.call_id in self.core.calls and self.core.cancel(req.call_id, self.now()):
                self.queues.pop(req.call_id, None)

    def count_tokens(self, req: GenerateRequest) -> int:
        """The prompt length of `req` as this instance tokenizes it (ValueError: the template refuses it)."""
        return len(self.executor.encode(req))

    def telemetry(self) -> Telemetry:
        """A fresh, versioned snapshot (every read is a new observation)."""
        return self.core.telemetry(self.now())

    # -- admin actions -----------------------------------------------------------------------

    @property
    def rotation(self) -> list[str]:
        """Models served now: the configured ones minus those unloaded at run time (admin API);
        the core's list, so telemetry carries it to the router."""
        return self.core.models

    def set_rotation(self, model: str, serve: bool) -> str | None:
        """Load (serve=True) or unload a configured model at run time; the reason it cannot, or None."""
        sched = self.core.sched
        if model not in self.inst.models:
            return f"model {model!r} is not configured on instance {self.inst.name}"
        if (model in self.rotation) == serve:
            return None
        if sched.mode == "pinned":
            return f"{self.inst.name} is a hot instance; pin another model instead"
        if not serve:
            busy = len(sched.table.waiting[model]) + sum(
                sched.table.records[c].call.model == model for c in sched.table.running
            )
            if busy:
                return f"{busy} calls of {model!r} are queued or running on {self.inst.name}; drain it first"
            if len(self.rotation) == 1:
                return f"{model!r} is the last model of {self.inst.name}"
            if sched.active == model:  # switch away now, so its weights leave the device
                sched.retire(model, next(m for m in self.rotation if m != model))
                self._wake.set()
        hook = getattr(self.executor, "load" if serve else "unload", None)
        if hook is not None:
            hook(model)
        keep = set(self.rotation) | {model} if serve else set(self.rotation) - {model}
        self.core.models = [m for m in self.inst.models if m in keep]
        if not serve:
            self.core.opened.discard(model)
        self.core.version += 1
        return None

    def forget(self, session: str) -> bool:
        """Drop a session's context and KV here (device pages and host copies); True if there was any."""
        ledger = self.core.sched.ledger
        keys = [k for k in ledger.entries if k[0] == session]
        for key in keys:
            del ledger.entries[key]
        hook = getattr(self.executor, "forget", None)
        return bool(hook(session)) if hook is not None else bool(keys)

    def rounds(self, limit: int) -> dict:
        return {
            "instance": self.inst.name,
            **self.recorder.report(self.core.sched, self.now(), limit),
        }
