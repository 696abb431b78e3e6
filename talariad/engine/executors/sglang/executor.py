"""The `sglang` executor: one SGLang server per hosted model, driven over HTTP.

Hot instance: one server, pinned (or the operator's `url:`). Cold instance: one server per model,
all started with the memory saver and parked; the round scheduler's switches run the swap
sequence (swap.py) and its prefills send the admitted calls to the active server. Tokens come
back as /generate stream chunks; each scheduler action reads the next chunk of each of its calls.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from talariad.cold_sched import Switch
from talariad.config import InstanceConfig
from talariad.engine.executors.base import common_prefix
from talariad.engine.executors.sglang.client import SGLangClient, SGLangError, sampling_params
from talariad.engine.executors.sglang.launcher import LaunchError, ServerProcess
from talariad.engine.executors.sglang.records import SwitchTimer
from talariad.engine.executors.sglang.swap import (
    Command,
    Servers,
    Step,
    SwapSequence,
    SwapViolation,
)
from talariad.engine.model.tokenizer import TextTokenizer
from talariad.instance import (
    CallOutput,
    InstanceCall,
    KVLocation,
    MemoryStats,
    StepPlan,
    StepResult,
)
from talariad.types import KVState, SwitchPath
from talariad.wire.messages import GenerateRequest

log = logging.getLogger("talariad.engine.sglang")
GIB = 1 << 30
DRAIN_TIMEOUT_S = 30.0
CHUNK_TIMEOUT_S = 600.0
"""A stream that sends nothing for this long is failed (SGLang's own watchdog is 300 s a batch)."""


@dataclass
class Hosted:
    name: str
    path: str
    tokenizer: TextTokenizer
    footprint_bytes: int
    """Per-GPU memory of the server when resident: measured at its first start (/server_info),
    the config's size_gib until then."""


@dataclass
class CallStream:
    """One call's /generate stream: chunks arrive in `chunks` (dict, SGLangError, or None at end)."""

    model: str
    chunks: asyncio.Queue = field(default_factory=asyncio.Queue)
    task: asyncio.Task | None = None
    text: str = ""
    ids: list[int] = field(default_factory=list)
    done: bool = False
    expected: int = 0
    """Prompt tokens the session's previous context covers: what SGLang could have reused."""
    seen: bool = False
    """The first chunk was read (it carries the cache report)."""


def footprint_bytes(info: dict) -> int | None:
    """Weights + KV + graph memory of rank 0 from /server_info (GB), or None if absent."""
    try:
        usage = info["internal_states"][0]["memory_usage"]
    except (KeyError, IndexError, TypeError):
        return None
    total = 0.0
    for key in ("weight", "kvcache", "graph"):
        value = usage.get(key, 0)
        total += (
            sum(v for v in value.values() if isinstance(v, int | float))
            if isinstance(value, dict)
            else value
        )
    return int(total * GIB) or None


class SGLangExecutor:
    def __init__(
        self,
        inst: InstanceConfig,
        hosted: dict[str, Hosted],
        *,
        ready_timeout_s: float,
        stop_timeout_s: float,
        probe: Callable[[], int | None],
        host_kv: bool,
    ):
        """probe: free bytes on the fullest GPU of the group now, or None when it cannot be read."""
        self.inst, self.hosted, self.probe, self.host_kv = inst, hosted, probe, host_kv
        self.ready_timeout_s, self.stop_timeout_s = ready_timeout_s, stop_timeout_s
        self.servers = Servers(list(hosted))
        self.kv_capacity_tokens: int | None = inst.sglang.max_total_tokens
        """Known only when the config pins each server's KV pool (--max-total-tokens)."""
        self.procs: dict[str, ServerProcess] = {}
        self.clients: dict[str, SGLangClient] = {}
        self.streams: dict[str, CallStream] = {}
        self.contexts: dict[tuple[str, str], list[int]] = {}
        self.records: list[dict] = []
        self.loads: dict[str, dict] = {}
        self.restarts = 0
        self._control = asyncio.Lock()
        """Switches and restarts never interleave."""
        self._restarting: dict[str, asyncio.Task] = {}
        self._tasks: set[asyncio.Task] = set()
        self._closing = False

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Bring the servers up: a hot model's stays active; a cold instance's are started one by
        one, each parked (paused, released) before the next starts, so each sizes its KV pool
        against the GPUs as they will be when it is switched in."""
        url = self.inst.sglang.url
        if url is not None:
            model = self.inst.models[0]
            self.clients[model] = SGLangClient(url)
            if not await self.clients[model].health():
                raise LaunchError(f"the SGLang server at {url} is not healthy")
            self.servers.started(model)
        else:
            for model in self.inst.models:
                await self._launch(model)
                if self.inst.pool == "cold":
                    seq = SwapSequence(self.servers, model, None)
                    await self._drive(seq, SwitchTimer(None, None))
                    if seq.failed:
                        raise LaunchError(f"cannot park the SGLang server for {model}: {seq.error}")
        self._spawn(self._poll_loads())

    async def aclose(self) -> None:
        self._closing = True
        for task in list(self._tasks) + [s.task for s in self.streams.values() if s.task]:
            task.cancel()
        await asyncio.gather(
            *(p.stop(self.stop_timeout_s) for p in self.procs.values()), return_exceptions=True
        )
        for client in self.clients.values():
            await client.aclose()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _launch(self, model: str) -> None:
        spec = self.hosted[model]
        server = await ServerProcess.launch(self.inst, model, spec.path, self.ready_timeout_s)
        self.procs[model], self.clients[model] = server, server.client
        self.servers.started(model)
        try:
            measured = footprint_bytes(await server.client.server_info())
        except SGLangError:
            measured = None
        spec.footprint_bytes = measured or spec.footprint_bytes
        self._spawn(self._watch(model, server))

    async def _watch(self, model: str, server: ServerProcess) -> None:
        """A server that exits on its own: its calls fail; an active one is restarted now, a parked
        one at its next switch (started fresh)."""
        code = await server.proc.wait()
        if self._closing or self.procs.get(model) is not server:
            return
        was_serving = self.servers[model].serving
        lost = self.servers.died(model)
        if was_serving:
            self._restarting[model] = self._spawn(self._restart(model))
        log.error(
            "SGLang server for %s exited with status %s; %d calls in flight fail",
            model,
            code,
            len(lost),
        )
        for cid in lost:
            if (stream := self.streams.get(cid)) is not None:
                stream.chunks.put_nowait(
                    SGLangError(f"the SGLang server for {model} exited with status {code}")
                )
        await server.client.aclose()

    async def _restart(self, model: str) -> None:
        async with self._control:
            backoff = 0.5
            while not self._closing and not self.servers[model].up:
                try:
                    await self._launch(model)
                    self.restarts += 1
                except LaunchError as err:
                    log.error("restart of %s failed: %s", model, err)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
        self._restarting.pop(model, None)

    # -- the executor contract -------------------------------------------------------------

    def encode(self, req: GenerateRequest) -> list[int]:
        tok = self.hosted[req.model].tokenizer
        if req.prompt is not None:
            return tok.encode(req.prompt)
        return tok.encode_chat([m.template_dict() for m in req.messages], tools=req.tools or None)

    def reusable(self, session: str, model: str, prompt: list) -> int:
        return common_prefix(self.contexts.get((session, model), []), prompt)

    def remember(self, call: InstanceCall) -> KVLocation | None:
        stream = call.state
        if isinstance(stream, CallStream):
            self.contexts[(call.session_id, call.model)] = call.prompt + stream.ids
        self.release(call)
        return None  # SGLang's radix tree holds it: the scheduler's device state is right

    def release(self, call: InstanceCall) -> None:
        stream = self.streams.pop(call.call_id, None)
        if stream is not None and not stream.done and stream.task is not None:
            stream.task.cancel()  # abandoned by its client: closing the stream aborts it in SGLang

    def forget(self, session: str) -> bool:
        """Drop the session's stored contexts, so its next call claims no prefix; True if any.
        The KV stays in SGLang's radix cache, which evicts it by LRU (no per-session release)."""
        keys = [k for k in self.contexts if k[0] == session]
        for key in keys:
            del self.contexts[key]
        return bool(keys)

    def load(self, model: str) -> None:
        """Nothing to do: its server stayed up, parked, while the model was out of rotation."""

    def unload(self, model: str) -> None:
        """Nothing to do: a model that is not active has its server parked (memory released), and
        SGLang stages nothing."""

    async def run(self, plan: StepPlan) -> StepResult:
        action = plan.action
        if isinstance(action, Switch):
            return await self._switch(action)
        return await self._tokens(action.model, action.call_ids, dict(plan.calls))

    # -- tokens ----------------------------------------------------------------------------

    async def _tokens(
        self, model: str, call_ids: list[str], calls: dict[str, InstanceCall]
    ) -> StepResult:
        result = StepResult()
        if (restart := self._restarting.get(model)) is not None:
            try:  # the next call waits for the restarted server, as long as a start may take
                await asyncio.wait_for(asyncio.shield(restart), self.ready_timeout_s)
            except TimeoutError:
                pass  # still down: the sends below fail with a clear error
        for cid in call_ids:
            if cid not in self.streams and cid in calls:
                try:
                    self._send(model, calls[cid])
                except SwapViolation as err:
                    result.calls[cid] = CallOutput(
                        tokens=0, error=f"instance {self.inst.name}: {err}"
                    )
        live = [cid for cid in call_ids if cid in self.streams and cid not in result.calls]
        items = await asyncio.gather(*(self._next_chunk(cid) for cid in live))
        for cid, item in zip(live, items, strict=False):
            self._apply(cid, item, calls.get(cid), result)
        return result

    def _send(self, model: str, call: InstanceCall) -> None:
        self.servers.send(model, call.call_id)
        stream = CallStream(model, expected=self.reusable(call.session_id, model, call.prompt))
        stream.task = self._spawn(self._pump(call, stream))
        call.state = self.streams[call.call_id] = stream

    async def _pump(self, call: InstanceCall, stream: CallStream) -> None:
        cid, client = call.call_id, self.clients[stream.model]
        try:
            async for chunk in client.generate(
                cid, list(call.prompt), sampling_params(call.request, call.max_tokens)
            ):
                stream.chunks.put_nowait(chunk)
        except SGLangError as err:
            await self._settle(stream.model)
            stream.chunks.put_nowait(err)
        finally:
            self.servers.finished(stream.model, cid)
            stream.chunks.put_nowait(None)

    async def _settle(self, model: str, wait_s: float = 2.0) -> None:
        """A stream broke: if its server is exiting, let the watcher see it first, so the caller's
        next call waits for the restart instead of reaching a dead port."""
        server = self.procs.get(model)
        if server is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(server.proc.wait()), wait_s)
        except TimeoutError:
            return  # still running: a transport error, not a crash
        for _ in range(100):
            if not self.servers[model].up:
                return
            await asyncio.sleep(0.01)

    async def _next_chunk(self, cid: str):
        try:
            return await asyncio.wait_for(self.streams[cid].chunks.get(), CHUNK_TIMEOUT_S)
        except TimeoutError:
            return SGLangError(f"no token for {CHUNK_TIMEOUT_S:.0f} s")

    def _apply(self, cid: str, item, call: InstanceCall | None, result: StepResult) -> None:
        stream = self.streams[cid]
        if not isinstance(item, dict):
            why = item if item is not None else "the stream ended before the call finished"
            message = (
                f"instance {self.inst.name}: the SGLang server for {stream.model} failed: {why}"
            )
            result.calls[cid] = CallOutput(tokens=0, error=message)
            stream.done = True
            return
        meta = item.get("meta_info") or {}
        out = result.calls[cid] = CallOutput()
        if not stream.seen:
            stream.seen = True
            self._note_cache(out, meta, stream.expected)
        text = item.get("text", "")
        out.text = text[len(stream.text) :] if text.startswith(stream.text) else ""
        stream.text, stream.ids = text, list(item.get("output_ids") or stream.ids)
        reason = meta.get("finish_reason")
        if reason is None:
            return
        stream.done = True
        if reason.get("type") == "abort":
            out.tokens, out.error = (
                0,
                f"instance {self.inst.name}: SGLang aborted the call: {reason.get('message', '')}",
            )
        else:
            out.finish_reason = "stop" if reason.get("type") == "stop" else "length"
            matched = reason.get("matched")
            if isinstance(matched, str) and matched in (
                call.request.stop if call is not None else ()
            ):
                out.stop_sequence = matched  # the client's stop string (not an end-of-turn token)

    @staticmethod
    def _note_cache(out: CallOutput, meta: dict, expected: int) -> None:
        """What SGLang really reused (meta_info.cached_tokens), and from which tier."""
        cached = int(meta.get("cached_tokens") or 0)
        out.cached_tokens = cached
        details = meta.get("cached_tokens_details") or {}
        if details.get("storage") or details.get("host"):
            out.kv_source = "host"
        elif cached:
            out.kv_source = "device"
        elif expected > 0:
            out.kv_source = "recompute"  # the session had a prefix here; SGLang no longer holds it

    # -- switches --------------------------------------------------------------------------

    async def _switch(self, action: Switch) -> StepResult:
        async with self._control:
            timer = SwitchTimer(action.from_model, action.to_model)
            released_before = {m for m in self.hosted if self.servers[m].released}
            seq = SwapSequence(self.servers, action.from_model, action.to_model)
            await self._drive(seq, timer)
            self.records = (self.records + [timer.record(seq.error)])[-100:]
        released = {
            m for m in self.hosted if self.servers[m].released or not self.servers[m].up
        } - released_before
        state = (
            KVState.HOST if self.host_kv else KVState.MISSING
        )  # what stock SGLang keeps (docs/sglang.md)
        updates = [
            KVLocation(s, m, state, len(ctx))
            for (s, m), ctx in self.contexts.items()
            if m in released
        ]
        return StepResult(kv_updates=updates, switch_path=SwitchPath.H2D, switch_failed=seq.error)

    async def _drive(self, seq: SwapSequence, timer: SwitchTimer) -> None:
        while (cmd := seq.next_command()) is not None:
            started = time.monotonic()
            try:
                running = await self._execute(cmd)
            except (SGLangError, LaunchError, MemoryShort) as err:
                timer.add(cmd.step, time.monotonic() - started)
                seq.done(cmd, ok=False, error=f"{cmd.step.value} of {cmd.model}: {err}")
                continue
            timer.add(cmd.step, time.monotonic() - started, measured=running != "unmeasured")
            seq.done(cmd, running=running if isinstance(running, int) else None)

    async def _execute(self, cmd: Command):
        client = self.clients.get(cmd.model)
        match cmd.step:
            case Step.PAUSE:
                await client.pause("retract")  # never in_place before a release (reference §0.1)
            case Step.DRAIN:
                return await self._drain(cmd.model, client)
            case Step.RELEASE:
                await client.release()
            case Step.MEMORY:
                return await self._memory_check(cmd.model)
            case Step.RESUME:
                await client.resume()
            case Step.START:
                await self._launch(cmd.model)
            case Step.CONTINUE:
                await client.cont()
        return None

    async def _drain(self, model: str, client: SGLangClient) -> int:
        """Poll /v1/loads until the paused server runs nothing (retracted calls wait in its queue)."""
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while True:
            running = int((await client.loads()).get("num_running_reqs", 0))
            if running == 0 or time.monotonic() > deadline:
                if running:
                    raise SGLangError(
                        f"still {running} running requests after {DRAIN_TIMEOUT_S:.0f} s"
                    )
                return 0
            await asyncio.sleep(0.02)

    async def _memory_check(self, model: str):
        """Free memory on every GPU of the group must hold `model`'s footprint plus headroom before
        a resume: a CUDA OOM inside torch_memory_saver kills the server (reference §0.5)."""
        sg = self.inst.sglang
        need = self.hosted[model].footprint_bytes + int(sg.resume_headroom_gib * GIB)
        deadline = time.monotonic() + sg.resume_wait_s
        while True:
            free = self.probe()
            if free is None:
                return "unmeasured"
            if free >= need:
                return None
            if time.monotonic() >= deadline:
                raise MemoryShort(
                    f"{model} needs {need / GIB:.2f} GiB free per GPU, {free / GIB:.2f} GiB free "
                    f"after {sg.resume_wait_s:g} s"
                )
            await asyncio.sleep(0.05)

    # -- telemetry -------------------------------------------------------------------------

    async def _poll_loads(self, interval_s: float = 0.5) -> None:
        """/v1/loads reads a shared-memory snapshot (no scheduler round trip): safe on any server."""
        while True:
            for model, client in list(self.clients.items()):
                if self.servers[model].up:
                    try:
                        self.loads[model] = await client.loads()
                    except SGLangError:
                        self.loads.pop(model, None)
            await asyncio.sleep(interval_s)

    def memory(self) -> MemoryStats | None:
        """NVML free memory; KV occupancy from the active server's /v1/loads token_usage."""
        free = self.probe()
        if free is None:  # no NVML: nothing measured (the scheduler's KV occupancy stands)
            return None
        active = next((m for m in self.hosted if self.servers[m].serving), None)
        usage = self.loads.get(active, {}).get("token_usage") if active else None
        return MemoryStats(
            hbm_free_bytes=free,
            staging_slack_bytes=0,
            kv_occupancy=float(usage) if usage is not None else None,
        )

    def memory_report(self, last: int = 50) -> dict:
        """Server states, their last /v1/loads, and the switch records (no bump layout: SGLang owns HBM)."""
        active = next((m for m in self.hosted if self.servers[m].serving), None)
        servers = {}
        for m, s in self.servers.state.items():
            load = self.loads.get(m, {})
            servers[m] = {
                "state": "down"
                if not s.up
                else "released"
                if s.released
                else "paused"
                if s.paused
                else "active",
                "port": self.procs[m].port if m in self.procs else None,
                "running": load.get("num_running_reqs"),
                "queued": load.get("num_waiting_reqs"),
                "token_usage": load.get("token_usage"),
            }
        return {
            "active_model": active,
            "executor": "sglang",
            "switch_path": SwitchPath.H2D.value,
            "kv_host": self.inst.sglang.kv_host if self.inst.pool == "cold" else None,
            "restarts": self.restarts,
            "servers": servers,
            "layout": [],
            "switches": self.records[-last:],
        }


class MemoryShort(RuntimeError):
    """Not enough free GPU memory to resume a server."""
