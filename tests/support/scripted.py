"""The gateway in-process over real instance workers, one of them with a scripted executor.

A random-weight model cannot produce a tool call, so `ScriptedExecutor` (the `sim` executor's
costs, tokenizer and prefix reuse) answers with a fixed text, a piece per decode step; the
gateway's tool layer, the worker and the router are the real ones. Only the call-stream hop
is replaced by direct calls into the workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import time

import httpx2  # what the openai and anthropic SDKs take as their http_client
import yaml

from talariad.config import parse_config
from talariad.engine.build import build_executor
from talariad.engine.executors.sim import SimExecutor
from talariad.engine.worker import Worker
from talariad.gateway.app import Gateway, build_app
from talariad.gateway.instances import InstanceDirectory
from talariad.gateway.routing import RouterShell
from talariad.instance import CallOutput
from talariad.knobs import model_profile
from talariad.wire.client import InstanceClient
from tests.support.worker import call_events

ROOT = pathlib.Path(__file__).resolve().parents[2]


class ScriptedExecutor(SimExecutor):
    """Answers every call with `script`, `piece` characters per step, then ends the turn."""

    script = ""
    piece = 7

    def _next_word(self, call) -> CallOutput:
        at = sum(len(p) for p in call.out)
        text = self.script[at : at + self.piece]
        return CallOutput(
            text=text, finish_reason="stop" if at + self.piece >= len(self.script) else None
        )


class LocalClient(InstanceClient):
    """The instance client over in-process workers."""

    def __init__(self, workers: dict[str, Worker]):
        super().__init__(lambda: {n: f"local://{n}" for n in workers})
        self.workers = workers

    async def generate(self, instance, req):
        async for event in call_events(self.workers[instance], req):
            yield event

    async def forget(self, instance, session):
        return self.workers[instance].core.forget(session)

    async def count_tokens(self, instance, req):
        try:
            return self.workers[instance].count_tokens(req)
        except ValueError as err:
            return str(err)


class LocalDirectory(InstanceDirectory):
    def __init__(self, workers: dict[str, Worker]):
        super().__init__(lambda: {n: f"local://{n}" for n in workers}, 0.05)
        self.workers = workers
        self.client = LocalClient(workers)


def config(overrides: dict | None = None):
    data = yaml.safe_load((ROOT / "etc" / "talaria.yaml").read_text())
    for inst in data["instances"]:
        inst["executor"], inst["time_scale"] = "sim", 0.01
    for key, value in (overrides or {}).items():
        data.setdefault(key, {}).update(value)
    return parse_config(data, "test")


@contextlib.asynccontextmanager
async def local_gateway(script: str | None = None, overrides: dict | None = None):
    """An httpx client on the gateway app; the `tiny-agent` instance answers with `script`."""
    cfg = config(overrides)
    workers = {}
    for inst in cfg.instances:
        profiles = {m: model_profile(cfg, m) for m in inst.models}
        executor = build_executor(cfg, inst, profiles)
        if script is not None and "tiny-agent" in inst.models:
            executor = ScriptedExecutor(executor.model, inst.time_scale)
            executor.script = script
        workers[inst.name] = Worker(cfg, inst, executor, profiles)
    routing = RouterShell.from_config(cfg, {m.name: model_profile(cfg, m.name) for m in cfg.models})
    directory = LocalDirectory(workers)
    gw = Gateway(cfg, directory, routing, lambda name: True)

    def observe() -> None:
        for w in workers.values():
            routing.observe(w.telemetry(), time.monotonic())

    async def telemetry():
        while True:
            await asyncio.sleep(0.05)
            observe()

    observe()  # the router knows every instance before the first call: no warm-up to wait for
    tasks = [asyncio.create_task(w.run()) for w in workers.values()] + [
        asyncio.create_task(telemetry())
    ]
    await asyncio.sleep(0)  # the workers' loops start
    client = httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=build_app(gw)), base_url="http://talaria", timeout=30
    )
    try:
        yield client
    finally:
        await client.aclose()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
