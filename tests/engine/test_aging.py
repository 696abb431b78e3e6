"""An instance that has served many calls keeps what a fresh one keeps: every container reachable
from a torch worker (the core, the scheduler's ledger, the KV book, the substrate, the host KV
registry) stops growing once its bounded caches are full, however many new sessions arrive."""

from __future__ import annotations

import asyncio
from collections import deque

import torch

from talariad.config import parse_config
from talariad.engine.build import model_profile
from talariad.engine.executors.torch_engine.factory import build_torch_executor
from talariad.engine.worker import Worker
from talariad.instance.rounds import RoundRecorder
from talariad.wire.messages import ChatMessage, GenerateRequest, TokenEvent
from tests.support.worker import call_events

CONTAINERS = (dict, list, set, frozenset, tuple, deque)


def make_worker(host_kv_gib: float) -> Worker:
    data = {
        "models": [
            {"name": "a", "profile": "tiny", "seed": 1, "size_gib": 0.05},
            {"name": "b", "profile": "tiny", "seed": 2, "size_gib": 0.05},
        ],
        "instances": [
            {
                "name": "i0",
                "pool": "cold",
                "executor": "torch",
                "devices": "cpu",
                "models": ["a", "b"],
                "memory_gib": 0.25,
                "host_kv_gib": host_kv_gib,
            }
        ],
        "policy": {"tau_s": 0.0},
    }
    cfg = parse_config(data, "test")
    inst = cfg.instances[0]
    executor = build_torch_executor(cfg, inst, dtype=torch.float32)
    return Worker(cfg, inst, executor, {m: model_profile(cfg, m) for m in inst.models})


def census(root: object) -> dict[str, int]:
    """Total length of the containers at each attribute path under `root` (talariad objects
    only; a container's first few items are followed, as the others share their shape; a deque
    with a `maxlen` is bounded by construction)."""
    sizes: dict[str, int] = {}
    seen: set[int] = set()

    def walk(obj: object, path: str, depth: int) -> None:
        if id(obj) in seen or depth > 7 or isinstance(obj, torch.Tensor):
            return
        seen.add(id(obj))
        if isinstance(obj, deque) and obj.maxlen is not None:
            return  # bounded by construction
        if isinstance(obj, CONTAINERS):
            sizes[path] = sizes.get(path, 0) + len(obj)
            items = obj.values() if isinstance(obj, dict) else obj
            for i, item in enumerate(items):
                if i == 4:
                    break
                walk(item, path + "[]", depth + 1)
            return
        if not (type(obj).__module__ or "").startswith("talariad"):
            return
        attrs = dict(getattr(obj, "__dict__", {}))
        for name in getattr(type(obj), "__slots__", ()):
            if hasattr(obj, name):
                attrs[name] = getattr(obj, name)
        for name, value in attrs.items():
            walk(value, f"{path}.{name}", depth + 1)

    walk(root, "worker", 0)
    return sizes


async def session(worker: Worker, sid: str, model: str, calls: int) -> None:
    msgs = [ChatMessage(role="user", content=f"session {sid}: fix the bug in module {sid} " * 4)]
    for t in range(calls):
        req = GenerateRequest(
            call_id=f"{sid}-{t}", session_id=sid, model=model, max_tokens=6, messages=msgs
        )
        text = [e.text async for e in call_events(worker, req) if isinstance(e, TokenEvent)]
        msgs = msgs + [
            ChatMessage(role="assistant", content="".join(text)),
            ChatMessage(role="user", content=f"tool output {t}: 3 passed"),
        ]


def test_no_structure_grows_with_the_calls_served():
    # a small host arena and small bounds: the caches fill within the first rounds
    worker = make_worker(host_kv_gib=0.002)
    worker.executor.book.kvless_records = 24
    worker.executor.sub.registry.max_sessions = 24
    worker.core.recorder = RoundRecorder(keep_rounds=8, keep_switches=8)
    rounds: list[dict[str, int]] = []

    async def main() -> None:
        loop = asyncio.create_task(worker.run())
        try:
            for r in range(10):  # 10 rounds x 20 new sessions x 3 calls
                await asyncio.gather(
                    *(session(worker, f"r{r}s{i}", "ab"[i % 2], 3) for i in range(20))
                )
                rounds.append(census(worker))
        finally:
            loop.cancel()

    asyncio.run(main())
    worker.executor.sub.check_integrity()
    worker.core.check_integrity()
    full = {k: max(r.get(k, 0) for r in rounds[3:6]) for k in rounds[-1]}
    grown = {
        path: (full[path], n)
        for path, n in rounds[-1].items()
        if n > full[path] * 1.25 + 8  # 4 more rounds of 20 sessions add 80 to anything per-session
    }
    assert not grown, f"grew after the caches filled (rounds 4-6 max -> round 10): {grown}"
