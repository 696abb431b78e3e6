"""The instance worker: runs calls on one instance's executor and keeps its telemetry.

Walking skeleton: each call runs as its own task against the `sim` executor; a cold instance
switches its active model under a lock. The cold-pool scheduler core replaces this loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from talariad.config import InstanceConfig, TalariaConfig
from talariad.engine.executors import sim
from talariad.engine.messages import DoneEvent, ErrorEvent, GenerateRequest, SessionKV, Telemetry, TokenEvent, Usage
from talariad.types import LatencyProfile, SwitchPath


@dataclass
class _Session:
    tokens: list[str] = field(default_factory=list)


class Worker:
    def __init__(self, cfg: TalariaConfig, inst: InstanceConfig):
        self.cfg, self.inst = cfg, inst
        self.profiles = {m: _profile(cfg, m) for m in inst.models}
        self.active: str | None = inst.models[0] if inst.pool == "hot" else None
        self.sessions: dict[tuple[str, str], _Session] = {}
        self.version = 0
        self.running = 0
        self.queued: dict[str, int] = {m: 0 for m in inst.models}
        self.switches = 0
        self._switch_lock = asyncio.Lock()

    def hosts(self, model: str) -> bool:
        return model in self.profiles

    async def _sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds * self.inst.time_scale)

    async def _activate(self, model: str) -> None:
        async with self._switch_lock:
            if self.active != model:
                await self._sleep(self.profiles[model].switch_cost_s(SwitchPath.H2D))
                self.active = model
                self.switches += 1

    async def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent | DoneEvent | ErrorEvent]:
        if not self.hosts(req.model):
            yield ErrorEvent(message=f"instance {self.inst.name} does not host model {req.model!r}")
            return
        arrived = time.monotonic()
        prof = self.profiles[req.model]
        text = req.prompt if req.prompt is not None else sim.render([(m.role, m.content) for m in req.messages])
        prompt = sim.tokenize(text)
        sess = self.sessions.get((req.session_id, req.model)) if req.session_id else None
        cached = sim.common_prefix(sess.tokens, prompt) if sess else 0
        self.queued[req.model] += 1
        try:
            await self._activate(req.model)
        finally:
            self.queued[req.model] -= 1
        self.running += 1
        try:
            await self._sleep(prof.prefill_s(len(prompt) - cached))
            words = sim.placeholder_words(prompt, req.max_tokens, req.seed)
            ttft = time.monotonic() - arrived
            for i, w in enumerate(words):
                if i:
                    await self._sleep(prof.decode_s(self.running))
                yield TokenEvent(text=(" " if i else "") + w)
        finally:
            self.running -= 1
        if req.session_id:
            self.sessions[(req.session_id, req.model)] = _Session(prompt + words)
        self.version += 1
        usage = Usage(prompt_tokens=len(prompt), completion_tokens=len(words), cached_tokens=cached,
                      kv_source="device" if cached else "none")
        yield DoneEvent(finish_reason="length", usage=usage, kv_state="device",
                        kv_len=len(prompt) + len(words), ttft_s=ttft)

    def telemetry(self) -> Telemetry:
        return Telemetry(
            instance=self.inst.name, version=self.version, pool=self.inst.pool, models=list(self.inst.models),
            active_model=self.active, loaded_models=[self.active] if self.active else [],
            queued=dict(self.queued), running=self.running, switches=self.switches,
            sessions=[SessionKV(session_id=s, model=m, state="device", kv_len=len(v.tokens))
                      for (s, m), v in self.sessions.items()],
        )


def _profile(cfg: TalariaConfig, model: str) -> LatencyProfile:
    m = cfg.model(model)
    return sim.PROFILES.get(m.profile or "tiny", sim.PROFILES["tiny"])
