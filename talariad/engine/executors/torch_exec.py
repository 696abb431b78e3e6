"""The `torch` executor: real tokens from the built-in engine over the instance's memory substrate.

Every hosted model is registered with one `Substrate` (weights are views of its bump buffer, KV
lives in its pool), so a scheduler `Switch` moves real bytes. With `host_kv` (the default) a
finished call checkpoints its session's KV pages to the host KV registry, and a returning session
restores its agreed prefix from host and recomputes only the tail. Steps run on one worker thread
so the event loop stays responsive. Design: docs/internals.md.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from talariad.cold_sched import Decode, Prefill, Switch
from talariad.cold_sched.rounds import staging_target
from talariad.engine.executors.base import common_prefix
from talariad.engine.executors.torch_engine import HostedModel, KVBook, TextStream, TokenContext
from talariad.engine.executors.torch_engine.calls import CallState
from talariad.engine.executors.torch_engine.report import memory_report, memory_stats, record_dict
from talariad.engine.model import DecodeSeq, ModelRunner, PrefillSeq, SamplingParams
from talariad.engine.model.sampling import make_generator, sample
from talariad.instance import (
    CallOutput,
    InstanceCall,
    KVLocation,
    MemoryStats,
    StepPlan,
    StepResult,
)
from talariad.memory import Substrate, prefix_hashes
from talariad.memory.layout import align_up
from talariad.types import KVState
from talariad.wire.messages import GenerateRequest

HEADROOM_SEQS = 64
"""Sequences whose last partly-filled page the scheduler's token accounting does not see."""


class TorchExecutor:
    def __init__(
        self,
        substrate: Substrate,
        models: dict[str, HostedModel],
        *,
        page_size: int = 16,
        host_kv: bool = True,
        d2d: bool = True,
        pinned: bool = False,
        threads: int = 1,
    ) -> None:
        self.sub, self.models, self.page_size = substrate, models, page_size
        self.order = list(models)
        self.host_kv, self.d2d, self.pinned = host_kv, d2d, pinned
        self.book = KVBook(page_size)
        self.runners: dict[str, ModelRunner] = {}
        self.private: set[str] = set()
        self._cancelled: list[InstanceCall] = []
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        for name, hosted in models.items():
            self._register(name, hosted)
        self.kv_capacity_tokens = self._capacity_tokens()
        self.stats: MemoryStats | None = None
        torch.set_num_threads(threads)
        self._thread = ThreadPoolExecutor(
            1, "torch-exec", initializer=torch.set_num_threads, initargs=(threads,)
        )
        if pinned:
            self._open(self.order[0])
            self._release_host_image(self.order[0])

    # ---- setup ---------------------------------------------------------------------------

    def _register(self, name: str, hosted: HostedModel) -> None:
        views = self.sub.register_model(name, hosted.shapes(), hosted.kv_layout(self.page_size))
        for key, view in views.items():
            view.copy_(hosted.params[key])
        hosted.params = {}  # the substrate's host image is the copy from now on

    def _release_host_image(self, model: str) -> None:
        """A pinned model stays active for good (a hot instance hosts it alone), so its host image,
        the source of H2D opens and staging, is never read again: free it and keep one copy of
        the weights, the device's (on the CPU both copies were host memory)."""
        self.sub.models[model].host = self.sub.device.alloc_host(1)

    def _capacity_tokens(self) -> int:
        """Prompt + output tokens the smallest model's KV pool holds (the scheduler's admission cap)."""
        cfg = self.sub.config
        free = cfg.capacity_bytes - cfg.runtime_bytes - cfg.graph_pool_bytes
        pages = min(
            (free - align_up(e.nbytes, cfg.alignment)) // e.kv_layout.row_bytes
            for e in self.sub.models.values()
        )
        if pages < 2 * HEADROOM_SEQS:
            raise ValueError(
                f"memory_gib: the device buffer leaves {max(pages, 0)} KV pages for the largest model; "
                f"need at least {2 * HEADROOM_SEQS}"
            )
        return (pages - HEADROOM_SEQS) * self.page_size

    def _now(self) -> float:
        return time.monotonic() - self._t0

    # ---- the Executor protocol -------------------------------------------------------------

    def encode(self, request: GenerateRequest) -> list[int]:
        req = request
        tok = self.models[req.model].tokenizer
        if req.prompt is not None:
            return tok.encode(req.prompt)
        return tok.encode_chat([m.template_dict() for m in req.messages], tools=req.tools or None)

    def reusable(self, session: str, model: str, prompt: list) -> int:
        return self.book.reusable(session, model, prompt, self.host_kv)

    def remember(self, call: InstanceCall) -> KVLocation | None:
        """Keep the session's context; checkpoint its KV pages to host (async on CUDA). A call that
        ran on private pages (its session was busy) leaves nothing: say where the session's KV
        is."""
        st: CallState | None = call.state
        if st is None:
            return None
        model = call.model
        st.rec.busy = None
        if st.owner in self.private:
            self._free(st.owner, model)
            return self._where(call.session_id, model)
        if self.host_kv and self.sub.active == model:
            self._checkpoint(st.owner, model, st.rec)
        self.book.settle(st.owner, model)
        return None

    def _where(self, session: str, model: str) -> KVLocation:
        rec = self.book.get(session, model)
        if rec is not None and rec.on_device:
            return KVLocation(session, model, KVState.DEVICE, rec.valid)
        if rec is not None and self.host_kv and rec.host_tokens:
            return KVLocation(session, model, KVState.HOST, rec.host_tokens)
        return KVLocation(session, model, KVState.MISSING, 0)

    def release(self, call: InstanceCall) -> None:
        """A call dropped by its client: release its pages at the next step (one may be running)."""
        if call.state is not None:
            self._cancelled.append(call)

    async def run(self, plan: StepPlan) -> StepResult:
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._step, plan)

    # ---- one step, on the torch thread ---------------------------------------------------------

    def _step(self, plan: StepPlan) -> StepResult:
        action, calls = plan.action, plan.calls
        with self._lock:
            self._release_cancelled()
            self.sub.poll(self._now())
            if isinstance(action, Switch):
                result = self._switch(action, {c.model for c in plan.live.values()})
            elif isinstance(action, Prefill):
                result = self._prefill(action, calls)
            else:
                result = self._decode(action, calls)
            self._stage_some()
            if losses := self._host_losses():  # most steps evict no host page
                result.kv_updates = [*result.kv_updates, *losses]
            if isinstance(action, Switch):  # the substrate's record, after this step's staging
                result.switch_report = record_dict(self.sub.records[-1])
            stats = memory_stats(self.sub)
            self.stats = MemoryStats(stats["hbm_free_bytes"], stats["staging_slack_bytes"])
            return result

    def _release_cancelled(self) -> None:
        while self._cancelled:
            st: CallState = self._cancelled.pop().state
            st.rec.busy = None
            if st.owner in self.private:
                self._free(st.owner, st.model)

    # ---- switching -------------------------------------------------------------------------------

    def _switch(self, action: Switch, waiting: set[str]) -> StepResult:
        """waiting: models with calls on the instance (they decide what to stage next)."""
        updates = self._save_outgoing(self.sub.active) if self.sub.active else []
        record = self._open(action.to_model, waiting)
        staging = self.sub.staging.model if self.sub.staging is not None else None
        return StepResult(kv_updates=updates, switch_path=record.path, staging=staging)

    def _open(self, model: str, waiting: set[str] = frozenset()):
        record = self.sub.switch_to(model, self._now())
        if record is None:
            raise RuntimeError(f"the substrate cannot open model {model!r} (weights do not fit)")
        pool = self.sub.kv_pool().transpose(0, 1)  # [C, L, ...] -> the runner's [L, 2, ...]
        weights = self.sub.weights_view(model)
        runner = self.runners.get(model)
        if runner is None or runner.allocator.num_pages != pool.shape[2]:
            self.runners[model] = ModelRunner(self.models[model].config, weights, kv_pool=pool)
        elif not record.graphs_valid:  # App. D phase 4: regions moved, so the bound views are stale
            runner.bind_params(weights)
            runner.bind_kv_pool(pool)
        self.sub.mark_graphs_captured(model)  # the runner now holds these region addresses
        self._start_staging(model, waiting)
        return record

    def _save_outgoing(self, model: str) -> list:
        """Checkpoint every device-resident context of the outgoing model (the switch drains the
        copies) and say where each now lives."""
        updates = []
        for owner in self.book.on_device_owners(model):
            rec = self.book.get(owner, model)
            if self.host_kv:
                self._checkpoint(owner, model, rec)
            update = self.book.off_device(owner, model, self.host_kv)
            if owner in self.private:
                self.book.drop(owner, model)
            else:
                updates.append(update)
        return updates

    def _start_staging(self, active: str, waiting: set[str]) -> None:
        """Stage the model the scheduler's rotation switches to next (the same rule) into the
        pool's free tail while this one serves."""
        if not self.d2d or self.pinned or len(self.order) < 2:
            return
        nxt = staging_target(self.order, active, waiting.__contains__)
        if nxt is not None and self.sub.stage(nxt, self._now()):
            self._stage_some()

    def _stage_some(self, max_chunks: int = 8) -> None:
        if self.sub.staging is not None and self.sub.staging.model is not None:
            self.sub.stage_step(self._now(), max_chunks)

    # ---- KV pages --------------------------------------------------------------------------------

    def _checkpoint(self, owner: str, model: str, rec: TokenContext) -> None:
        hashes = prefix_hashes(rec.tokens[: rec.valid], self.page_size, model)
        if not hashes:
            return
        self.sub.checkpoint(owner, hashes, self._now())
        blocks = self.sub.registry.blocks
        saved = next((i for i, h in enumerate(hashes) if (model, h) not in blocks), len(hashes))
        rec.host_tokens = saved * self.page_size

    def _host_losses(self) -> list[KVLocation]:
        """Ledger updates for sessions whose host pages were evicted since the last step."""
        updates = []
        for (model, owner), pages in self.sub.registry.take_shrunk().items():
            update = self.book.host_lost(owner, model, pages)
            if update is not None and owner not in self.private:
                updates.append(update)
        return updates

    def _free(self, owner: str, model: str) -> None:
        self.sub.free_session(owner)
        self.book.drop(owner, model)
        self.private.discard(owner)

    def _ensure_pages(self, st: CallState, protect: set[str], updates: list) -> list[int]:
        """Grow the owner's pages to hold its prompt and every token it may still generate."""
        total = st.prompt_len + st.sampling.max_tokens
        need = -(-total // self.page_size) - len(self.sub.session_pages(st.owner))
        while need > 0 and self.sub.allocate_pages(st.owner, need) is None:
            victim = self._victim(st.model, protect)
            if victim is None:
                raise RuntimeError(
                    f"KV pool exhausted: {need} pages for {st.owner!r} and nothing to evict"
                )
            self._evict(victim, st.model, updates)
        return self.sub.session_pages(st.owner)

    def _victim(self, model: str, protect: set[str]) -> str | None:
        idle = self.book.idle_on_device(model, keep=set())
        parked = [
            o for o in self.book.on_device_owners(model) if o not in protect and o not in idle
        ]
        return next(iter(idle + parked), None)

    def _evict(self, owner: str, model: str, updates: list) -> None:
        rec = self.book.get(owner, model)
        if self.host_kv:
            self._checkpoint(owner, model, rec)
            self.sub.poll(self._now())
        self.sub.free_session(owner)
        update = self.book.off_device(owner, model, self.host_kv)
        if owner in self.private and rec.busy is None:
            self._free(owner, model)
        elif owner not in self.private:
            updates.append(update)

    # ---- prefill and decode ----------------------------------------------------------------------

    def _state(self, call: InstanceCall, model: str) -> CallState:
        """The call's state, created at its first admission."""
        if call.state is not None:
            return call.state
        req = call.request
        session = req.session_id or f"call-{req.call_id}"
        owner = session
        current = self.book.get(session, model)
        if current is not None and current.busy not in (None, req.call_id):
            owner = f"{session}#{req.call_id}"  # the session runs two calls at once: no sharing
            self.private.add(owner)
        rec = self.book.open(owner, model, req.call_id)
        sampling = SamplingParams(
            temperature=req.temperature, top_p=req.top_p, max_tokens=call.max_tokens, seed=req.seed
        )
        hosted = self.models[model]
        call.state = CallState(
            req.call_id,
            owner,
            model,
            list(call.prompt),
            len(call.prompt),
            sampling,
            make_generator(sampling),
            TextStream(hosted.tokenizer, req.stop),
            rec,
            ignore_eos=req.ignore_eos,
        )
        return call.state

    def _reuse(self, st: CallState, want: int) -> tuple[int, str]:
        """Tokens of the context whose KV is in the owner's pages before the tail is computed."""
        rec = st.rec
        device = common_prefix(rec.tokens[: rec.valid], st.ids)
        if want <= 0:
            return 0, "none"
        if device > 0:
            return min(want, device), "device"
        if not self.host_kv:
            return 0, "recompute"
        if self.sub.session_pages(st.owner):
            self.sub.free_session(st.owner)  # stale pages: a restore needs the owner empty
        hashes = prefix_hashes(st.ids[:want], self.page_size, st.model)
        res = self.sub.restore(st.owner, hashes, self._now())
        if res is None or res.restored_tokens == 0:
            return 0, "recompute"
        self.sub.wait_restore(st.owner)
        return res.restored_tokens, "host"

    def _prefill(self, action: Prefill, calls: dict[str, InstanceCall]) -> StepResult:
        states = [self._state(calls[item.call_id], action.model) for item in action.calls]
        protect = {st.owner for st in states}
        items, updates, reused = [], [], {}
        for item, st in zip(action.calls, states, strict=False):
            prior = common_prefix(st.rec.tokens, st.ids)
            cached, source = self._reuse(st, item.cached_device_tokens + item.restore_tokens)
            table = self._ensure_pages(st, protect, updates)
            # say truthfully how much was reused and from where (the core keeps the first one)
            if source == "none":
                source = "recompute" if prior else None
            reused[st.call_id] = (cached, source)
            st.rec.tokens = st.ids
            items.append(PrefillSeq(st.owner, st.ids, cached, table))
        logits = self.runners[action.model].prefill(items)
        result = self._emit(states, logits)
        for cid, (cached, source) in reused.items():
            result.calls[cid].cached_tokens, result.calls[cid].kv_source = cached, source
        result.kv_updates = updates
        return result

    def _decode(self, action: Decode, calls: dict[str, InstanceCall]) -> StepResult:
        states = [calls[cid].state for cid in action.call_ids]
        items = [
            DecodeSeq(st.owner, st.ids[-1], len(st.ids) - 1, self.sub.session_pages(st.owner))
            for st in states
        ]
        return self._emit(states, self.runners[action.model].decode(items))

    def _emit(self, states: list[CallState], logits: torch.Tensor) -> StepResult:
        tokens = sample(logits, [st.sampling for st in states], [st.generator for st in states])
        result = StepResult()
        for st, tok in zip(states, tokens, strict=False):
            st.ids.append(tok)
            st.rec.valid = len(st.ids) - 1  # the sampled token gets its KV at the next step
            eos = tok in self.models[st.model].eos_ids() and not st.ignore_eos
            last = eos or len(st.ids) - st.prompt_len >= st.sampling.max_tokens
            piece, hit = st.text.push(tok, final=last)
            reason = "stop" if hit or eos else None
            result.calls[st.call_id] = CallOutput(
                text=piece, finish_reason=reason, stop_sequence=st.text.fired if hit else None
            )
        return result

    # ---- reports -----------------------------------------------------------------------------------

    def memory(self) -> MemoryStats | None:
        """HBM free and staging slack as of the last step (cheap; read by telemetry)."""
        return self.stats

    def memory_report(self, last: int = 50) -> dict:
        """The HBM layout rows and the latest switch records (for /internal/memory)."""
        with self._lock:
            return memory_report(self.sub, last)

    def unload(self, model: str) -> None:
        """Take `model` out of the staging rotation and free its staged chunks (it is not active)."""
        with self._lock:
            if model in self.order:
                self.order.remove(model)
            staging = self.sub.staging
            if staging is not None and staging.model == model:
                self.sub._finish_stage_writes(wait=True)
                staging.clear()
                if self.sub.active is not None:
                    self._start_staging(self.sub.active, set())
            self._refresh_stats()

    def load(self, model: str) -> None:
        """Put `model` back into the rotation (in config order); staging picks it up."""
        with self._lock:
            if model not in self.order:
                self.order = [m for m in self.models if m in self.order or m == model]
            if (
                self.sub.active is not None
                and self.sub.staging is not None
                and self.sub.staging.model is None
            ):
                self._start_staging(self.sub.active, set())
            self._refresh_stats()

    def forget(self, session: str) -> bool:
        """Free the session's device pages and host KV; True if it held any."""
        with self._lock:
            held = [m for m in self.models if self.book.get(session, m) is not None]
            if any(self.book.get(session, m).busy for m in held):
                return False
            registry = self.sub.registry
            for model in self.models:
                blocks = registry.blocks_for(model, registry.session_hashes(model, session))
                registry.drop_session(model, session)
                for block in blocks:  # pages no other session shares go back to the slab pool
                    if not block.radix_refs:
                        registry.evict(block)
                held += [model] if blocks and model not in held else []
            for model in held:
                self._free(session, model)
            self._refresh_stats()
            return bool(held)

    def _refresh_stats(self) -> None:
        stats = memory_stats(self.sub)
        self.stats = MemoryStats(stats["hbm_free_bytes"], stats["staging_slack_bytes"])

    async def start(self) -> None:
        """Nothing to bring up: the models were registered (a hot one opened) when it was built."""

    async def aclose(self) -> None:
        """Nothing to stop: the step thread ends with the process, after a step in flight."""
