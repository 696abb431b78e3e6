"""The instance core on its own: the submit clamp, refusals, truthful KV state at completion,
cancellation, and the executor contract's per-call outputs."""

from __future__ import annotations

from talariad.cold_sched import Idle, Prefill, SchedKnobs, Switch
from talariad.instance import CallOutput, InstanceCall, InstanceCore, KVUpdate, StepResult
from talariad.types import KVState, LatencyProfile

PROFILE = LatencyProfile()


class Recorder:
    """An executor stand-in: it remembers what the core asked of it."""

    def __init__(self, remember: KVUpdate | None = None) -> None:
        self.released, self.remembered, self._update = [], [], remember

    def remember(self, call):
        self.remembered.append(call.call_id)
        return self._update

    def release(self, call):
        self.released.append(call.call_id)

    def memory(self):
        return None


def core(executor=None, pool="hot", **knobs) -> InstanceCore:
    return InstanceCore(
        "i0",
        pool,
        ["m"],
        SchedKnobs(**knobs),
        {"m": PROFILE},
        executor=executor,
        max_context={"m": 100},
    )


def call(cid: str, session: str = "s", prompt: int = 10, max_tokens: int = 2) -> InstanceCall:
    return InstanceCall(cid, session, "m", prompt, max_tokens)


def run_step(c: InstanceCore, now: float, result: StepResult | None = None):
    plan = c.next_plan(now)
    assert not isinstance(plan, Idle)
    return plan, c.finish(plan, result or StepResult(calls=None), now + 0.1, 0.1)


def test_refusals_name_the_limit():
    c = core(kv_capacity_tokens=50)
    assert c.refusal("m", 0, 5).param == "messages"
    assert "maximum context is 100" in c.refusal("m", 90, 20).message
    assert "holds at most 50" in c.refusal("m", 40, 20).message
    assert c.refusal("m", 10, 5) is None


def test_the_prefix_is_clamped_to_what_the_ledger_holds():
    c = core()
    c.submit(call("a", prompt=10, max_tokens=1), 50, 0.0)  # the session claims more than exists
    plan, (done,) = run_step(c, 0.0)
    assert plan.action.calls[0].recompute_tokens == 10  # nothing held: all recomputed
    assert done.call.kv_source == "recompute"
    assert done.kv_state is KVState.DEVICE and done.kv_len == 11
    c.submit(call("b", prompt=30, max_tokens=1), 30, 1.0)
    plan, _ = run_step(c, 1.0)
    assert plan.action.calls[0].cached_device_tokens == 11  # what the ledger holds, not 30


def test_done_reports_where_the_kv_really_is():
    moved = KVUpdate("s", "m", KVState.HOST, 8)
    c = core(Recorder(remember=moved))
    c.submit(call("a", max_tokens=1), 0, 0.0)
    _, (done,) = run_step(c, 0.0)
    assert (done.kv_state, done.kv_len) == (KVState.HOST, 8)  # not the scheduler's DEVICE guess
    c.submit(call("b", session="t", max_tokens=1), 0, 1.0)
    evicted = StepResult(calls=None, kv_updates=[KVUpdate("t", "m", KVState.MISSING, 0)])
    c.executor._update = None
    _, (done,) = run_step(c, 1.0, evicted)
    assert (done.kv_state, done.kv_len) == (KVState.MISSING, 0)


def test_outputs_text_stop_and_cached_tokens_land_in_the_call_record():
    c = core(Recorder())
    c.submit(call("a", max_tokens=5), 0, 0.0)
    out = {"a": CallOutput(text="hi", cached_tokens=3, kv_source="host")}
    run_step(c, 0.0, StepResult(calls=out))
    last = {"a": CallOutput(text=" there", finish_reason="stop")}
    _, (done,) = run_step(c, 0.2, StepResult(calls=last))
    assert done.call.out == ["hi", " there"] and done.call.generated == 2
    assert (done.finish_reason, done.cached_tokens, done.call.kv_source) == ("stop", 3, "host")


def test_cancel_drops_a_queued_call_and_ends_a_running_one_at_its_next_step():
    rec = Recorder()
    c = core(rec, pool="cold")
    c.submit(call("a", max_tokens=50), 0, 0.0)
    assert c.cancel("a", 0.0) and rec.released == ["a"] and not c.calls
    c.submit(call("b", max_tokens=50), 0, 1.0)
    plan = c.next_plan(1.0)
    assert isinstance(plan.action, Switch)
    c.finish(plan, StepResult(), 1.1, 0.1)
    plan = c.next_plan(1.1)
    assert isinstance(plan.action, Prefill)
    assert c.cancel("b", 1.1) is False  # in flight: it ends when this step finishes
    (done,) = c.finish(plan, StepResult(calls=None), 1.2, 0.1)
    assert done.call.call_id == "b" and done.finish_reason == "stop" and not c.calls
    c.check_integrity()
