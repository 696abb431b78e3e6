"""The sim executor ends its turn like a model: a drawn answer length, capped by max_tokens, and
client stop strings; the worker clamps an output limit that does not fit when asked to."""

import asyncio
import pathlib

from talariad.config import load_config
from talariad.engine.build import build_worker
from talariad.engine.executors.sim import answer_length
from talariad.wire.messages import ChatMessage, DoneEvent, ErrorEvent, GenerateRequest, TokenEvent
from tests.support.worker import call_events

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _worker():
    cfg = load_config(ROOT / "etc" / "talaria.yaml")
    insts = [i.model_copy(update={"executor": "sim", "time_scale": 0.001}) for i in cfg.instances]
    # τ on the same clock: a drained slot holds 1 ms for a returning call, not a second per call
    policy = cfg.policy.model_copy(update={"tau_s": cfg.policy.tau_s * 0.001})
    cfg = cfg.model_copy(update={"instances": insts, "policy": policy})
    return build_worker(cfg, next(i for i in cfg.instances if i.pool == "cold"))


async def _run(worker, **kw) -> tuple[str, object]:
    req = GenerateRequest(
        call_id=kw.pop("call_id"),
        model="tiny-code",
        messages=[ChatMessage(role="user", content=kw.pop("text", "fix the parser"))],
        **kw,
    )
    text = ""
    async for ev in call_events(worker, req):
        if isinstance(ev, TokenEvent):
            text += ev.text
        else:
            return text, ev
    raise AssertionError("no end event")


async def test_answers_end_their_turn_and_stop_strings_are_named():
    worker = _worker()
    loop = asyncio.create_task(worker.run())
    try:
        text, done = await _run(worker, call_id="a", max_tokens=5000)
        n = answer_length(
            worker.executor.encode(
                GenerateRequest(
                    call_id="x",
                    model="tiny-code",
                    messages=[ChatMessage(role="user", content="fix the parser")],
                )
            ),
            None,
        )
        assert (
            isinstance(done, DoneEvent)
            and done.finish_reason == "stop"
            and done.stop_sequence is None
        )
        assert done.usage.completion_tokens == n < 5000
        _, capped = await _run(worker, call_id="b", max_tokens=2)
        assert capped.finish_reason == "length" and capped.usage.completion_tokens == 2
        word = text.split()[1]
        cut, stopped = await _run(worker, call_id="c", max_tokens=5000, stop=[f" {word}"])
        assert (
            stopped.finish_reason == "stop"
            and stopped.stop_sequence == f" {word}"
            and f" {word}" not in cut
        )
        _, clamped = await _run(worker, call_id="d", max_tokens=10**6, clamp_max_tokens=True)
        assert isinstance(clamped, DoneEvent)
        _, refused = await _run(worker, call_id="e", max_tokens=10**6)
        assert isinstance(refused, ErrorEvent) and refused.code == "context_length_exceeded"
        assert refused.prompt_tokens and refused.limit == 8192
    finally:
        loop.cancel()


async def test_ignore_eos_generates_max_tokens_as_a_replay_needs():
    worker = _worker()
    loop = asyncio.create_task(worker.run())
    try:
        _, natural = await _run(worker, call_id="n", max_tokens=5000)
        _, forced = await _run(
            worker, call_id="f", max_tokens=natural.usage.completion_tokens + 7, ignore_eos=True
        )
        assert forced.finish_reason == "length"
        assert forced.usage.completion_tokens == natural.usage.completion_tokens + 7
    finally:
        loop.cancel()
