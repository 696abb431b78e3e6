"""The sglang executor in an instance worker, over fake SGLang servers started as real processes."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest

from talariad.engine.build import build_worker
from talariad.wire.messages import ChatMessage, DoneEvent, ErrorEvent, GenerateRequest, TokenEvent
from tests.fakes.sglang_engine import FakeGpu
from tests.support.sglang import check_safe_sequence, read_log, sglang_config
from tests.support.worker import call_events

pytestmark = pytest.mark.proc


@contextlib.asynccontextmanager
async def running(cfg, probe=None):
    worker = build_worker(cfg, cfg.instances[0])
    if probe is not None:
        worker.executor.probe = probe
    await worker.executor.start()
    loop = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        loop.cancel()
        await worker.executor.aclose()


async def call(
    worker, model: str, text: str | list, session: str | None = None, max_tokens: int = 6
):
    turns = [("user", text)] if isinstance(text, str) else text
    req = GenerateRequest(
        call_id=uuid.uuid4().hex,
        session_id=session,
        model=model,
        max_tokens=max_tokens,
        messages=[ChatMessage(role=r, content=c) for r, c in turns],
    )
    events = [e async for e in call_events(worker, req)]
    return req, events


def done(events) -> DoneEvent:
    assert isinstance(events[-1], DoneEvent), events
    return events[-1]


async def test_hot_streams_tokens_and_reports_sglang_cached_tokens(model_dir, tmp_path):
    log = tmp_path / "fake.jsonl"
    async with running(sglang_config(model_dir, log)) as worker:
        req, first = await call(worker, "m1", "hello there, how are you today?", session="s1")
        tokens = [e for e in first if isinstance(e, TokenEvent)]
        end = done(first)
        assert (
            len(tokens) == 6 and end.usage.completion_tokens == 6 and end.finish_reason == "length"
        )
        assert end.usage.cached_tokens == 0 and end.usage.kv_source == "none"
        text = "".join(t.text for t in tokens)
        turns = [
            ("user", "hello there, how are you today?"),
            ("assistant", text),
            ("user", "and then?"),
        ]
        _, second = await call(worker, "m1", turns, session="s1")
        end2 = done(second)
        # the fake's radix match, not the scheduler's plan: the whole first prompt is a prefix
        assert end2.usage.cached_tokens >= len(worker.executor.encode(req)) - 1
        assert end2.usage.kv_source == "device"
        generates = [e for e in read_log(log) if e["event"] == "generate"]
        assert [g["rid"] for g in generates][:1] == [req.call_id]  # rid = our call id
        report = worker.executor.memory_report()
        assert report["servers"]["m1"]["state"] == "active" and report["restarts"] == 0
    check_safe_sequence(read_log(log))


async def test_stop_strings_and_sampling_params_reach_the_server(model_dir, tmp_path):
    log = tmp_path / "fake.jsonl"
    async with running(sglang_config(model_dir, log)) as worker:
        _, events = await call(worker, "m1", "abc", max_tokens=40)
        full = "".join(e.text for e in events if isinstance(e, TokenEvent))
        stop = full[5:7]
        req = GenerateRequest(
            call_id="c-stop",
            model="m1",
            max_tokens=40,
            stop=[stop],
            seed=None,
            messages=[ChatMessage(role="user", content="abc")],
        )
        events = [e async for e in call_events(worker, req)]
        assert done(events).finish_reason == "stop"
        assert stop not in "".join(e.text for e in events if isinstance(e, TokenEvent))


async def test_cold_switches_follow_the_safe_sequence(model_dir, tmp_path):
    log = tmp_path / "fake.jsonl"
    cfg = sglang_config(model_dir, log, pool="cold", models=("m1", "m2"))
    async with running(cfg) as worker:
        results = await asyncio.gather(
            *(
                call(worker, m, f"question {i} for {m}", session=f"s{i}-{m}")
                for i in range(3)
                for m in ("m1", "m2")
            )
        )
        assert all(isinstance(ev[-1], DoneEvent) for _, ev in results), results
        records = worker.executor.memory_report()["switches"]
        assert records and all(r["ok"] for r in records)
        assert {r["to_model"] for r in records} == {"m1", "m2"}
        rec = next(r for r in records if r["from_model"])
        assert rec["path"] == "h2d" and rec["phase_s"][2] is None and rec["phase_s"][0] > 0
        assert set(rec["steps_s"]) == {
            "pause",
            "drain",
            "release",
            "memory_check",
            "resume",
            "continue",
        }
        # recompute: a switched-out model's sessions are reported missing, not host-restorable
        active = worker.telemetry().active_model
        ledger = worker.core.sched.ledger
        parked = [(f"s{i}-{m}", m) for i in range(3) for m in ("m1", "m2") if m != active]
        assert parked and all(ledger.get(*key).state.value == "missing" for key in parked)
        assert all(m == active for _, m in ledger.entries)  # a missing prefix is no entry
    events = read_log(log)
    check_safe_sequence(events)
    assert (
        sum(e["event"] == "release_memory_occupation" for e in events) >= 3
    )  # 2 at start + switches


@pytest.mark.parametrize("kv_host", ["recompute", "storage"])
async def test_a_session_prefix_across_a_switch_is_recomputed_or_restored(
    model_dir, tmp_path, kv_host
):
    log = tmp_path / "fake.jsonl"
    cfg = sglang_config(
        model_dir,
        log,
        pool="cold",
        models=("m1", "m2"),
        kv_host=kv_host,
        hicache_dir=str(tmp_path / "hicache"),
    )
    async with running(cfg) as worker:
        prompt = "a long system prompt about the repository layout and the failing test"
        out = done((await call(worker, "m1", prompt, session="s1"))[1])
        await call(worker, "m2", "something else", session="s2")
        sess = {
            k: e.state.value for k, e in worker.core.sched.ledger.entries.items()
        }  # entries mutate
        again = done((await call(worker, "m1", prompt + " more", session="s1"))[1])
    assert out.usage.cached_tokens == 0
    if kv_host == "storage":  # the L3 file backend survives the release
        assert sess[("s1", "m1")] == "host"
        assert again.usage.cached_tokens > 0 and again.usage.kv_source == "host"
        assert (tmp_path / "hicache" / "cold0").is_dir()
    else:  # the release flushed the radix tree: nothing to reuse, and the router was told so
        assert ("s1", "m1") not in sess  # a prefix that lives nowhere is no ledger entry
        assert again.usage.cached_tokens == 0 and again.usage.kv_source == "recompute"
    starts = [e for e in read_log(log) if e["event"] == "start"]
    assert all(("--hicache-storage-backend" in e["argv"]) == (kv_host == "storage") for e in starts)
    check_safe_sequence(read_log(log))


async def test_crash_mid_stream_fails_the_call_and_restarts_the_server(model_dir, tmp_path):
    log, crash = tmp_path / "fake.jsonl", tmp_path / "crash-now"
    cfg = sglang_config(
        model_dir, log, extra=("--fake-crash-file", str(crash), "--fake-token-s", "0.01")
    )
    async with running(cfg) as worker:
        crash.touch()
        _, events = await call(worker, "m1", "this one dies", max_tokens=20)
        assert (
            isinstance(events[-1], ErrorEvent)
            and "SGLang server for m1 failed" in events[-1].message
        )
        assert not crash.exists()
        _, after = await call(worker, "m1", "the next call", max_tokens=4)
        assert done(after).usage.completion_tokens == 4
        assert worker.executor.restarts == 1
    died = [e for e in read_log(log) if e["event"] == "died"]
    assert len(died) == 1 and "crash requested" in died[0]["why"]


async def test_resume_refused_for_memory_skips_the_slot_and_keeps_its_calls(model_dir, tmp_path):
    log = tmp_path / "fake.jsonl"
    gpu = FakeGpu.create(tmp_path / "gpu.json", total_gib=3.0)
    cfg = sglang_config(
        model_dir,
        log,
        pool="cold",
        models=("m1", "m2"),
        resume_wait_s=0.2,
        resume_headroom_gib=0.5,
        extra=("--fake-gpu-state", str(tmp_path / "gpu.json")),
    )
    async with running(cfg, probe=gpu.free_bytes) as worker:
        done((await call(worker, "m1", "first on m1", session="a"))[1])
        mem = worker.executor.memory()  # the probe's free bytes; KV occupancy from m1's /v1/loads
        assert mem.hbm_free_bytes == gpu.free_bytes() and mem.kv_occupancy is not None
        gpu.set_total(1.2)  # another tenant took memory: m2 (1 GiB + 0.5 headroom) cannot fit
        pending = asyncio.create_task(call(worker, "m2", "waits for m2", session="b"))
        for _ in range(200):
            if any(not r["ok"] for r in worker.executor.memory_report()["switches"]):
                break
            await asyncio.sleep(0.05)
        failed = [r for r in worker.executor.memory_report()["switches"] if not r["ok"]]
        assert failed and "needs 1.50 GiB" in failed[0]["error"]
        assert not pending.done() and worker.core.sched.failed_switches >= 1
        assert worker.telemetry().queued["m2"] == 1  # re-queued, not lost
        gpu.set_total(3.0)
        _, events = await asyncio.wait_for(pending, 20)
        assert done(events).usage.completion_tokens == 6
    events = read_log(log)
    check_safe_sequence(events)
    assert not any(e["event"] == "died" for e in events)


async def test_url_serves_through_an_operator_run_server_and_leaves_it_running(model_dir, tmp_path):
    import subprocess

    from talariad.engine.executors.sglang.client import SGLangClient
    from talariad.engine.executors.sglang.launcher import free_port
    from tests.support.sglang import fake_command

    port, log = free_port(), tmp_path / "op.jsonl"
    proc = subprocess.Popen(fake_command(log, "--model-path", str(model_dir), "--port", str(port)))
    try:
        cfg = sglang_config(
            model_dir,
            tmp_path / "unused.jsonl",
            url=f"http://127.0.0.1:{port}",
            launch_command=None,
        )
        probe = SGLangClient(f"http://127.0.0.1:{port}")
        for _ in range(200):  # the operator's server comes up on its own
            if await probe.health():
                break
            await asyncio.sleep(0.05)
        await probe.aclose()
        async with running(cfg) as worker:
            assert done((await call(worker, "m1", "via url"))[1]).usage.completion_tokens == 6
            assert worker.executor.procs == {}
        assert proc.poll() is None  # not ours to stop
        assert not (tmp_path / "unused.jsonl").exists()
    finally:
        proc.kill()
        proc.wait()


async def test_stop_sends_sigterm_then_sigkill_after_the_grace(tmp_path):
    import sys

    from talariad.engine.executors.sglang.client import SGLangClient
    from talariad.engine.executors.sglang.launcher import ServerProcess, _child_setup

    script = "import signal, time; signal.signal(signal.SIGTERM, lambda *a: print('term', flush=True)); time.sleep(60)"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE, preexec_fn=_child_setup
    )
    await asyncio.sleep(0.5)
    server = ServerProcess("m", 0, proc, SGLangClient("http://127.0.0.1:9"))
    code = await server.stop(grace_s=0.5)
    assert code == -9 and (await proc.stdout.read()).strip() == b"term"


async def test_a_launch_that_cannot_start_is_one_clear_error(model_dir, tmp_path):
    from talariad.engine.executors.sglang.launcher import LaunchError

    cfg = sglang_config(
        model_dir, tmp_path / "x.jsonl", launch_command=[str(tmp_path / "no-such-python")]
    )
    worker = build_worker(cfg, cfg.instances[0])
    with pytest.raises(
        LaunchError, match=r"cannot start '.*no-such-python': No such file or directory"
    ):
        await worker.executor.start()
    bad_flag = sglang_config(model_dir, tmp_path / "y.jsonl", extra_args=["--no-such-flag"])
    worker = build_worker(bad_flag, bad_flag.instances[0])
    with pytest.raises(
        LaunchError, match="SGLang server for m1 exited with status 2 during startup"
    ):
        await worker.executor.start()
