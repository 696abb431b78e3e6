"""The instance worker: the cold-pool scheduler core driven in real time over one executor.

One loop asks the scheduler for the next action, has the executor run it, and tells the
scheduler what happened; tokens flow to each call's event queue as they are produced.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator

from talariad.cold_sched import ColdScheduler, Completion, Idle, Prefill, SchedKnobs, SubmittedCall, Switch
from talariad.cold_sched.snapshot import deadline_risk_share, queued_suffix_tokens, round_load_s, switch_path
from talariad.config import InstanceConfig, TalariaConfig
from talariad.engine.executors.base import Executor, LiveCall
from talariad.engine.messages import (DoneEvent, ErrorEvent, GenerateRequest, ModelLoad, SessionKV, Telemetry,
                                      TokenEvent, Usage)
from talariad.types import KVState

log = logging.getLogger("talariad.engine")

Event = TokenEvent | DoneEvent | ErrorEvent


def sched_knobs(cfg: TalariaConfig) -> SchedKnobs:
    p, a = cfg.policy, cfg.ablations
    return SchedKnobs(gamma=p.gamma, ttft_target_s=p.ttft_target_s, tpot_target_s=p.tpot_target_s,
                      sp=a.sp, host_kv=a.host_kv, d2d=a.d2d, sp_hold_s=p.tau_s)


def _source(item) -> str:
    if item.restore_tokens:
        return "host"
    return "device" if item.cached_device_tokens else "none"


class Worker:
    def __init__(self, cfg: TalariaConfig, inst: InstanceConfig, executor: Executor, profiles: dict):
        self.inst, self.executor = inst, executor
        self.max_context = {m: cfg.model(m).max_context for m in inst.models}
        mode = "pinned" if inst.pool == "hot" else "time_shared"
        knobs = sched_knobs(cfg)
        capacity = getattr(executor, "kv_capacity_tokens", None)  # an executor with a real KV pool
        if capacity:
            knobs = dataclasses.replace(knobs, kv_capacity_tokens=capacity)
        self.sched = ColdScheduler(knobs, profiles, list(inst.models), mode=mode)
        self.calls: dict[str, LiveCall] = {}
        self.queues: dict[str, asyncio.Queue[Event]] = {}
        self._abandoned: set[str] = set()
        """Calls whose client left while they were in the running batch: finished at their next step."""
        self.version = 0
        self.switches = 0
        self.profiles = profiles
        self.opened: set[str] = {inst.models[0]} if mode == "pinned" else set()
        self._t0 = time.monotonic()
        self._wake = asyncio.Event()

    def now(self) -> float:
        return time.monotonic() - self._t0

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._loop()
        except Exception as err:  # the process exits and is restarted: tell every caller first
            for queue in self.queues.values():
                queue.put_nowait(ErrorEvent(message=f"instance {self.inst.name} failed: {type(err).__name__}"))
            raise

    async def _loop(self) -> None:
        while True:
            action = self.sched.next_action(self.now())
            if isinstance(action, Idle):
                await self._idle(action.until)
                continue
            started = self.now()
            result = await self.executor.run(action, self.calls)
            self._emit(action, result.text)
            stopped = result.stopped | (self._abandoned & set(getattr(action, "call_ids", ())))
            done = self.sched.finish(action, self.now(), self.now() - started, tokens=None,
                                     finished=stopped or None, switch_path=result.path)
            self._abandoned -= stopped
            for session, model, state, kv_len in result.kv_updates:
                self.sched.set_kv_state(session, model, state, kv_len, self.now())
            if isinstance(action, Switch):
                self.switches += 1
                self.opened.add(action.to_model)
            for c in done:
                self._complete(c)

    async def _idle(self, until: float | None) -> None:
        self._wake.clear()
        timeout = None if until is None else max(0.0, until - self.now())
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except TimeoutError:
            pass

    def _emit(self, action, text: dict[str, str]) -> None:
        if isinstance(action, Prefill):
            for item in action.calls:
                call = self.calls.get(item.call_id)
                if call and call.kv_source == "none":
                    call.kv_source = _source(item)
        for cid, piece in text.items():
            call = self.calls.get(cid)
            if call is not None:
                call.out.append(piece)
                self.queues[cid].put_nowait(TokenEvent(text=piece))

    def _complete(self, c: Completion) -> None:
        call = self.calls.pop(c.call_id, None)
        queue = self.queues.pop(c.call_id, None)
        if call is None or queue is None:
            return
        self.executor.remember(c.session_id, c.model, call)
        stopped = len(call.out) < call.req.max_tokens
        cached = c.cached_tokens if call.cached_tokens is None else call.cached_tokens
        usage = Usage(prompt_tokens=c.prompt_tokens, completion_tokens=len(call.out), cached_tokens=cached,
                      kv_source=call.kv_source)
        reason = call.finish_reason or ("stop" if stopped else "length")
        queue.put_nowait(DoneEvent(finish_reason=reason, usage=usage,
                                   kv_state=c.kv_state.value, kv_len=c.kv_len, ttft_s=c.ttft_s))

    # -- calls -----------------------------------------------------------------------------

    def _refusal(self, req: GenerateRequest, prompt: list) -> ErrorEvent | None:
        """A call that can never be served here, as the client's error (HTTP 400)."""
        if not prompt:
            return ErrorEvent(status=400, code="invalid_value", param="messages", message="the prompt is empty")
        need, limit = len(prompt) + req.max_tokens, self.max_context[req.model]
        if need > limit:
            return ErrorEvent(status=400, code="context_length_exceeded", param="max_tokens",
                              message=f"this model's maximum context is {limit} tokens; the call needs {need} "
                                      f"({len(prompt)} prompt + {req.max_tokens} max_tokens)")
        if need > self.sched.knobs.kv_capacity_tokens:
            return ErrorEvent(status=400, code="context_length_exceeded", param="max_tokens",
                              message=f"the call needs {need} tokens of KV cache ({len(prompt)} prompt + "
                                      f"{req.max_tokens} max_tokens); this instance holds at most "
                                      f"{self.sched.knobs.kv_capacity_tokens}")
        return None

    def _submit(self, req: GenerateRequest, prompt: list) -> asyncio.Queue[Event]:
        session = req.session_id or f"call-{req.call_id}"
        state, kv_len = self._kv(session, req.model)
        prefix = min(self.executor.reusable(session, req.model, prompt), kv_len, len(prompt) - 1)
        call = LiveCall(req, prompt)
        if state == KVState.MISSING and kv_len:
            call.kv_source = "recompute"
        self.sched.submit(SubmittedCall(
            call_id=req.call_id, session_id=session, model=req.model, prompt_tokens=len(prompt),
            prefix_tokens=max(prefix, 0), prefix_state=state if prefix > 0 else KVState.MISSING,
            max_tokens=req.max_tokens, arrived_at=self.now(), is_continuation=kv_len > 0), self.now())
        self.calls[req.call_id] = call
        queue = self.queues[req.call_id] = asyncio.Queue()
        self._wake.set()
        return queue

    def _kv(self, session: str, model: str) -> tuple[KVState, int]:
        entry = self.sched.ledger.get(session, model)
        return entry.state, entry.kv_len

    async def generate(self, req: GenerateRequest) -> AsyncIterator[Event]:
        if req.model not in self.inst.models:
            yield ErrorEvent(message=f"instance {self.inst.name} does not host model {req.model!r}")
            return
        prompt = self.executor.encode(req)
        refusal = self._refusal(req, prompt)
        if refusal is not None:
            yield refusal
            return
        try:
            queue = self._submit(req, prompt)
        except ValueError as err:  # anything else the scheduler finds it can never fit
            yield ErrorEvent(status=400, code="invalid_value", message=str(err))
            return
        try:
            while True:
                event = await queue.get()
                yield event
                if not isinstance(event, TokenEvent):
                    return
        finally:  # the client went away: drop what has not started, stop the rest at its next step
            if req.call_id in self.calls:
                if self.sched.cancel(req.call_id, self.now()):
                    call = self.calls.pop(req.call_id, None)
                    self.queues.pop(req.call_id, None)
                    if (release := getattr(self.executor, "cancelled", None)) is not None:
                        release(call)  # an executor holding KV pages for the call frees them
                else:
                    self._abandoned.add(req.call_id)

    # -- telemetry -------------------------------------------------------------------------

    def _model_load(self, model: str, running: int) -> ModelLoad:
        return ModelLoad(queued_calls=len(self.sched.table.waiting[model]),
                         queued_tokens=queued_suffix_tokens(self.sched, model), running=running,
                         switch_cost_s=self.sched.switch_costs.predict(model, switch_path(self.sched)),
                         open_cost_s=self.profiles[model].open_s)

    def telemetry(self) -> Telemetry:
        """A fresh, versioned snapshot: every read is a new observation (time-dependent fields move)."""
        self.version += 1
        t = self.sched.telemetry(self.now())
        load = {m: self._model_load(m, q.running) for m, q in t.queues.items()}
        stats = getattr(self.executor, "memory_stats", None)  # executors over a real substrate
        mem = stats() if stats is not None else {}
        queued_work = sum(self.profiles[m].prefill_s(ml.queued_tokens) for m, ml in load.items())
        return Telemetry(
            instance=self.inst.name, version=self.version, pool=self.inst.pool, models=list(self.inst.models),
            active_model=t.active_model, loaded_models=[t.active_model] if t.active_model else [],
            queued={m: q.waiting + q.parked for m, q in t.queues.items()},
            running=sum(q.running for q in t.queues.values()), switches=self.switches,
            round_remaining_s=t.round_remaining_s, opened_models=sorted(self.opened), model_load=load,
            round_load_s=round_load_s(self.sched), deadline_risk_share=deadline_risk_share(self.sched),
            deadline_risk=t.risk_round_bound + t.risk_round_overrun + t.risk_prefill_shortfall + t.ttft_at_risk,
            kv_occupancy=t.kv_used_tokens / max(t.kv_capacity_tokens, 1),
            hbm_free_bytes=mem.get("hbm_free_bytes", 0), staging_slack_bytes=mem.get("staging_slack_bytes", 0),
            sessions=[SessionKV(session_id=s.session_id, model=s.model, state=s.state.value, kv_len=s.kv_len)
                      for s in t.sessions])
