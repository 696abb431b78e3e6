"""The instance core on its own: the submit clamp, refusals, truthful KV state at completion,
cancellation, and the executor contract's per-call outputs."""

from __future__ import annotations

from dataclasses import fields

from talariad.cold_sched import Idle, Prefill, SchedKnobs, Switch
from talariad.engine.events import call_order, telemetry_message
from talariad.instance import (
    CallOrder,
    CallOutput,
    InstanceCall,
    InstanceCore,
    InstanceTelemetry,
    KVLocation,
    Refusal,
    StepResult,
)
from talariad.instance.rounds import RoundRecorder
from talariad.router.snapshot import router_snapshot
from talariad.types import KVState, LatencyProfile
from talariad.wire.messages import GenerateRequest, Telemetry

PROFILE = LatencyProfile()


class Recorder:
    """An executor stand-in: it remembers what the core asked of it."""

    def __init__(self, remember: KVLocation | None = None, forgets: bool | None = None) -> None:
        self.released, self.remembered, self._update = [], [], remember
        self.rotation_changes: list[tuple[str, str]] = []
        self.forgotten: list[str] = []
        self._forgets = forgets

    def remember(self, call):
        self.remembered.append(call.call_id)
        return self._update

    def release(self, call):
        self.released.append(call.call_id)

    def forget(self, session):
        self.forgotten.append(session)
        return self._forgets  # None: keeps nothing per session, the core's ledger answers

    def load(self, model):
        self.rotation_changes.append(("load", model))

    def unload(self, model):
        self.rotation_changes.append(("unload", model))

    def memory(self):
        return None


class Words(Recorder):
    """An encoding stand-in too: one token per word; a prompt with "refuse" fails the template."""

    def encode(self, request):
        if "refuse" in request.prompt:
            raise ValueError("the template refuses it")
        return request.prompt.split()

    def reusable(self, session, model, prompt):
        return 0


def core(executor=None, pool="hot", models=("m",), **knobs) -> InstanceCore:
    return InstanceCore(
        "i0",
        pool,
        list(models),
        SchedKnobs(**knobs),
        {m: PROFILE for m in models},
        executor=executor,
        max_context={m: 100 for m in models},
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
    moved = KVLocation("s", "m", KVState.HOST, 8)
    c = core(Recorder(remember=moved))
    c.submit(call("a", max_tokens=1), 0, 0.0)
    _, (done,) = run_step(c, 0.0)
    assert (done.kv_state, done.kv_len) == (KVState.HOST, 8)  # not the scheduler's DEVICE guess
    c.submit(call("b", session="t", max_tokens=1), 0, 1.0)
    evicted = StepResult(calls=None, kv_updates=[KVLocation("t", "m", KVState.MISSING, 0)])
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


def request(cid: str, prompt: str, max_tokens: int, model: str = "m", **kw) -> CallOrder:
    """An internal API request as the instance process hands it to its core."""
    req = GenerateRequest(call_id=cid, model=model, prompt=prompt, max_tokens=max_tokens, **kw)
    return call_order(req)


def test_admission_refuses_clamps_and_queues():
    c = core(Words(), kv_capacity_tokens=50)
    gone = c.admit(request("a", "x y", 5, model="n"), 0.0)
    assert isinstance(gone, Refusal) and (gone.code, gone.status) == ("model_not_loaded", 503)
    bad = c.admit(request("b", "refuse this", 5), 0.0)
    assert (bad.code, bad.param, bad.status) == ("invalid_value", "messages", 400)
    big = c.admit(request("c", "w " * 40, 20), 0.0)
    assert (big.code, big.limit, big.prompt_tokens) == ("context_length_exceeded", 50, 40)
    req = request("d", "w " * 40, 20, clamp_max_tokens=True, session_id="s")
    ok = c.admit(req, 1.0)
    assert isinstance(ok, InstanceCall) and ok.max_tokens == 10  # 50 - 40
    assert req.max_tokens == req.request.max_tokens == 20  # both stay as the gateway sent them
    assert ok.request is req.request  # for the executor
    assert (ok.session_id, ok.arrived_at, ok.prompt_tokens) == ("s", 1.0, 40)
    assert c.calls == {"d": ok} and not c.calls["d"].generated
    alone = c.admit(request("e", "x", 1), 1.0)
    assert alone.session_id == "call-e"  # no session: the call is its own


def test_rotation_changes_are_decided_by_the_core_and_told_to_the_executor():
    rec = Recorder()
    c = core(rec, pool="cold", models=("a", "b"))
    assert "not configured" in c.set_rotation("z", True)
    c.submit(InstanceCall("1", "s", "a", 10, 2), 0, 0.0)
    assert "drain it first" in c.set_rotation("a", False)
    while c.calls:
        run_step(c, c.version)  # any increasing clock
    assert c.sched.active == "a"
    version = c.version
    assert c.set_rotation("a", False) is None and c.models == ["b"]
    assert rec.rotation_changes == [("unload", "a")] and "a" not in c.opened
    assert c.version > version
    plan = c.next_plan(100.0)  # the retired active model switches away at once
    assert isinstance(plan.action, Switch) and plan.action.to_model == "b"
    assert "last model" in c.set_rotation("b", False)
    assert c.set_rotation("a", True) is None and c.models == ["a", "b"]  # config order
    assert c.set_rotation("a", True) is None and rec.rotation_changes[-1] == ("load", "a")
    assert len(rec.rotation_changes) == 2  # no change, nothing told
    assert "hot instance" in core(Recorder(), pool="hot").set_rotation("m", False)


def test_forget_clears_the_ledger_and_takes_the_executors_word():
    for answer, expect in ((None, True), (False, False), (True, True)):
        c = core(Recorder(forgets=answer))
        c.submit(call("a", max_tokens=1), 0, 0.0)
        run_step(c, 0.0)
        assert c.sched.ledger.entries
        assert c.forget("s") is expect and not c.sched.ledger.entries
        assert c.executor.forgotten == ["s"]
    assert core(Recorder()).forget("nobody") is False


def test_round_records_are_kept_only_when_asked():
    assert core().rounds(0.0, 5) == {"instance": "i0", "rounds": [], "switches": []}
    c = InstanceCore("i0", "cold", ["m"], SchedKnobs(), {"m": PROFILE}, recorder=RoundRecorder())
    c.submit(call("a", max_tokens=1), 0, 0.0)
    run_step(c, 0.0)  # the switch in
    run_step(c, 0.1)  # the prefill
    report = c.rounds(1.0, 5)
    assert [w["to_model"] for w in report["switches"]] == ["m"]
    assert report["rounds"][0]["slots"][0]["model"] == "m"


def test_the_scheduler_holds_the_cores_call_record_not_a_copy():
    c = core()
    a = call("a")
    c.submit_resolved(a, 4, KVState.HOST, True, 2.0)
    assert c.sched.table.records["a"].call is a
    assert (a.prefix_tokens, a.prefix_state, a.arrived_at, a.is_continuation) == (
        4,
        KVState.HOST,
        2.0,
        True,
    )


def test_telemetry_is_the_cores_dataclass_and_its_wire_form_carries_every_field():
    c = core(pool="cold", models=("m", "n"))
    c.submit(call("a"), 0, 0.0)
    run_step(c, 0.0)  # the switch in
    t = c.telemetry(0.5)
    assert isinstance(t, InstanceTelemetry) and t.model_load["m"].queued_calls == 1
    wire = Telemetry.model_validate_json(telemetry_message(t).model_dump_json())
    for name in (f.name for f in fields(InstanceTelemetry)):
        assert getattr(wire, name) == getattr(t, name), name
    assert router_snapshot(wire, ["m", "n"], 1.0, True) == router_snapshot(t, ["m", "n"], 1.0, True)
