"""The torch executor driven by the real Worker (in-process, asyncio): App. B's validation protocol
through a forced model switch and an HKVR restore, and a two-model cold instance serving
interleaved sessions with the tokens of single-model reference runs."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from talariad.config import parse_config
from talariad.engine.api import build_app
from talariad.engine.build import model_profile
from talariad.engine.executors.torch_engine.factory import build_torch_executor
from talariad.engine.executors.torch_engine.hosted import model_seed
from talariad.engine.model import (
    ModelRunner,
    SamplingParams,
    load_checkpoint,
    random_weights,
    tiny_config,
    write_tiny_checkpoint,
)
from talariad.engine.worker import Worker
from talariad.wire.messages import ChatMessage, DoneEvent, GenerateRequest, TokenEvent
from tests.support.worker import call_events

CUDA_REASON = "no CUDA device: torch.cuda.is_available() is False"
DEVICES = [
    "cpu",
    pytest.param(
        [0],
        id="cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not torch.cuda.is_available(), reason=CUDA_REASON),
        ],
    ),
]
SYSTEM = ("system", "You are a coding agent. Keep answers short.")
ASK = ("user", "The parser test fails on an empty file. What do we change first?")


def make_worker(
    tmp_path, devices="cpu", pool="cold", models=("ckpt", "rand"), **ablations
) -> Worker:
    write_tiny_checkpoint(tmp_path / "ckpt", tiny_config(), seed=3)
    data = {
        "models": [
            {"name": "ckpt", "path": str(tmp_path / "ckpt")},
            {"name": "rand", "profile": "tiny"},
        ],
        "instances": [
            {
                "name": "i0",
                "pool": pool,
                "executor": "torch",
                "devices": devices,
                "models": list(models),
            }
        ],
        "policy": {"tau_s": 0.0},
        "ablations": ablations,
    }
    cfg = parse_config(data, "test")
    inst = cfg.instances[0]
    # float32 on every device: restore, recompute and reference agree to the last bit of the argmax
    executor = build_torch_executor(cfg, inst, dtype=torch.float32)
    return Worker(cfg, inst, executor, {m: model_profile(cfg, m) for m in inst.models})


def reference_runner(tmp_path, model: str, device: str) -> ModelRunner:
    if model == "ckpt":
        params = load_checkpoint(tmp_path / "ckpt", device, torch.float32).params
    else:
        params = random_weights(tiny_config(), model_seed(model, None), device)
    return ModelRunner(tiny_config(), params, num_pages=64, page_size=16)


def request(cid, session, model, msgs, max_tokens=8, **kw) -> GenerateRequest:
    return GenerateRequest(
        call_id=cid,
        session_id=session,
        model=model,
        max_tokens=max_tokens,
        messages=[ChatMessage(role=r, content=c) for r, c in msgs],
        **kw,
    )


async def call(worker: Worker, req: GenerateRequest) -> tuple[str, list[int], list[int], DoneEvent]:
    """Text, prompt ids, generated ids and the done event of one call."""
    prompt = worker.executor.encode(req)
    pieces = []
    async for event in call_events(worker, req):
        if isinstance(event, TokenEvent):
            pieces.append(event.text)
        else:
            assert isinstance(event, DoneEvent), event
            done = event
    rec = worker.executor.book.get(req.session_id, req.model)
    assert rec.tokens[: len(prompt)] == prompt
    return "".join(pieces), prompt, rec.tokens[len(prompt) :], done


async def two_turns(worker: Worker, force_switch: bool):
    loop = asyncio.create_task(worker.run())
    try:
        text, _, first, _ = await call(worker, request("c1", "s", "ckpt", [SYSTEM, ASK]))
        if force_switch:
            await call(worker, request("x1", "other", "rand", [ASK]))
        turn2 = [SYSTEM, ASK, ("assistant", text), ("user", "Done; the test passes now. Next?")]
        return (first, *(await call(worker, request("c2", "s", "ckpt", turn2)))[1:])
    finally:
        loop.cancel()


def device_name(devices) -> str:
    return "cpu" if devices == "cpu" else f"cuda:{devices[0]}"


@pytest.mark.parametrize("devices", DEVICES)
def test_app_b_restore_equals_recompute_and_never_switched(tmp_path, devices):
    runs = {}
    for name, switch, host_kv in (
        ("never", False, True),
        ("host", True, True),
        ("recompute", True, False),
    ):
        worker = make_worker(tmp_path, devices, host_kv=host_kv)
        runs[name] = asyncio.run(two_turns(worker, switch))
        if switch:
            assert [(r.from_model, r.to_model) for r in worker.executor.sub.records] == [
                (None, "ckpt"),
                ("ckpt", "rand"),
                ("rand", "ckpt"),
            ]
        worker.executor.sub.check_integrity()
    first, prompt2, out, _ = runs["never"]
    assert all(r[0] == first and r[1] == prompt2 for r in runs.values())
    # the generated tokens: identical whether the prefix stayed on device, came back from host or
    # was recomputed, and equal to a plain run of the whole prompt
    expected = (
        reference_runner(tmp_path, "ckpt", device_name(devices))
        .generate(prompt2, SamplingParams(max_tokens=8))
        .token_ids
    )
    assert expected[: len(out)] == out and len(out) >= 1
    assert runs["host"][2] == out and runs["recompute"][2] == out
    usage = {name: r[3].usage for name, r in runs.items()}
    assert usage["never"].kv_source == "device" and usage["never"].cached_tokens > len(first)
    assert (
        usage["host"].kv_source == "host"
        and 0 < usage["host"].cached_tokens < usage["host"].prompt_tokens
    )
    assert usage["host"].cached_tokens % 16 == 0  # whole pages come back from host
    assert usage["recompute"].kv_source == "recompute" and usage["recompute"].cached_tokens == 0


async def session(worker: Worker, sid: str, model: str, sampling: dict, turns: int = 2) -> list:
    msgs, calls = [SYSTEM, ("user", f"Session {sid}: list the files you will edit.")], []
    for t in range(turns):
        text, prompt, out, done = await call(
            worker, request(f"{sid}-{t}", sid, model, msgs, **sampling)
        )
        calls.append((model, prompt, out, done, sampling))
        msgs = msgs + [("assistant", text), ("user", f"Tool result {t}: 3 passed, 1 failed.")]
    return calls


@pytest.mark.parametrize("devices", DEVICES)
def test_two_model_cold_instance_serves_interleaved_sessions(tmp_path, devices):
    worker = make_worker(tmp_path, devices)

    async def main():
        loop = asyncio.create_task(worker.run())
        try:
            plans = [
                ("s1", "ckpt", {}),
                ("s2", "rand", {}),
                ("s3", "ckpt", {"temperature": 0.8, "seed": 11}),
                ("s4", "rand", {"max_tokens": 5}),
            ]
            return await asyncio.gather(*(session(worker, *p) for p in plans))
        finally:
            loop.cancel()

    results = [c for calls in asyncio.run(main()) for c in calls]
    runners = {m: reference_runner(tmp_path, m, device_name(devices)) for m in ("ckpt", "rand")}
    for model, prompt, out, done, sampling in results:
        params = SamplingParams(
            temperature=sampling.get("temperature", 0.0),
            seed=sampling.get("seed"),
            max_tokens=sampling.get("max_tokens", 8),
        )
        assert out == runners[model].generate(prompt, params).token_ids
        assert done.usage.completion_tokens == len(out)
    returns = [r[3].usage for r in results[1::2]]
    assert all(u.kv_source in ("device", "host") and u.cached_tokens > 0 for u in returns)
    assert len(worker.executor.sub.records) >= 2 and worker.core.switch_count >= 2
    # a switch back found the runner's regions where they were and reused it
    assert any(r.graphs_valid for r in worker.executor.sub.records)
    worker.executor.sub.check_integrity()


def test_hot_instance_holds_one_model_and_reports_memory(tmp_path):
    worker = make_worker(tmp_path, pool="hot", models=("rand",))

    async def main():
        loop = asyncio.create_task(worker.run())
        try:
            await call(worker, request("h1", "s", "rand", [ASK], max_tokens=4))
            second = await call(
                worker, request("h2", "s", "rand", [ASK, ("assistant", "ok"), ("user", "more")])
            )
            transport = httpx.ASGITransport(app=build_app(worker))
            async with httpx.AsyncClient(transport=transport, base_url="http://i0") as client:
                return second, (await client.get("/internal/memory")).json()
        finally:
            loop.cancel()

    (_, _, _, done), memory = asyncio.run(main())
    assert done.usage.kv_source == "device" and done.usage.cached_tokens > 0
    assert worker.core.switch_count == 0
    assert [r.to_model for r in worker.executor.sub.records] == ["rand"]
    regions = {row["region"]: row for row in memory["layout"]}
    assert memory["active_model"] == "rand" and regions["weights"]["owner"] == "rand"
    assert regions["kv_pool"]["size"] > 0 and memory["switches"][0]["path"] == "h2d"
    assert worker.telemetry().hbm_free_bytes > 0
    # one copy of the weights: the pinned model's host image is gone, the device copy serves
    sub = worker.executor.sub
    assert sub.models["rand"].host.numel() == 1 and sub.models["rand"].nbytes > 100_000
