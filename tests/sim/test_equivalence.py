"""One scripted trace through both shells of the instance core gives the same instance behaviour:
(a) the daemon's instance core with its `sim` executor, built by `build_worker` as an instance
process builds it, driven on a fake clock (the executor's sleeps advance it);
(b) the simulator, with the same config through `compare --config`'s mapping.
Same actions in the same order, same switches (path and latency), same completions."""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import pathlib

from talariad.cold_sched import Idle
from talariad.config import load_config
from talariad.engine.build import build_worker
from talariad.instance import InstanceCall
from talariad.replay.generate import fixed_replay
from talariad.replay.trace import Trace
from talariad.sim.configs import from_config
from talariad.sim.simulator import Simulator
from talariad.wire.messages import GenerateRequest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _trace() -> Trace:
    full = fixed_replay(0)
    return Trace(s[:4] for s in full.sessions[:6])


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


def run_daemon_core(cfg, trace: Trace):
    """The closed loop the simulator runs, over the daemon's instance core and sim executor."""
    worker = build_worker(cfg, cfg.instances[0])
    core, executor, clock = worker.core, worker.executor, FakeClock()
    executor.clock, executor.sleep, executor._t0 = clock, clock.sleep, 0.0
    heap = [(0.0, s, 0) for s in range(len(trace.sessions))]
    actions, completions = [], {}

    def release(until: float) -> None:
        while heap and heap[0][0] <= until:
            at, s, k = heapq.heappop(heap)
            c = trace.sessions[s][k]
            req = GenerateRequest(  # the recorded output length, as the simulator replays it
                call_id=f"{c.session_id}#{k}",
                model=c.model,
                max_tokens=max(c.output_tokens, 1),
                ignore_eos=True,
            )
            call = InstanceCall(
                req.call_id,
                c.session_id,
                c.model,
                max(c.prompt_tokens, 1),
                req.max_tokens,
                at,
                request=req,
                prompt=["w"] * max(c.prompt_tokens, 1),
            )
            core.submit(call, c.prefix_tokens, at)

    now = 0.0
    while heap or core.calls:
        release(now)
        plan = core.next_plan(now)
        if isinstance(plan, Idle):
            now = min(t for t in (plan.until, heap[0][0] if heap else None) if t is not None)
            continue
        actions.append(_action(plan.action))
        clock.t = now
        result = asyncio.run(executor.run(plan))
        end = clock.t
        release(end)  # arrivals during the step are submitted at their own time
        for done in core.finish(plan, result, end, end - now):
            c = done.completion
            completions[c.call_id] = (c.finished_at, c.kv_len)
            s, k = _where(trace, c.call_id)
            if k + 1 < len(trace.sessions[s]):
                heapq.heappush(heap, (end + trace.sessions[s][k + 1].gap_s, s, k + 1))
        now = end
    return actions, [_switch(w) for w in core.switches], completions


def _where(trace: Trace, call_id: str) -> tuple[int, int]:
    sid, _, k = call_id.partition("#")
    return next(i for i, s in enumerate(trace.sessions) if s[0].session_id == sid), int(k)


def _action(a) -> tuple:
    return (
        type(a).__name__,
        getattr(a, "model", None) or a.to_model,
        tuple(getattr(a, "call_ids", ())),
    )


def _switch(w) -> tuple:
    return w.from_model, w.to_model, w.path, round(w.at_s, 9), round(w.latency_s, 9)


def run_simulator(cfg, trace: Trace):
    configs, pset = from_config(cfg, "ablations")
    # every action through next_plan, to record it (the decode-run shortcut gives the same
    # result: test_simulator.test_decode_runs_match_stepping_every_decode)
    sim = Simulator(trace, dataclasses.replace(configs[0], prewarm=False), pset, fast_decodes=False)
    inst = next(iter(sim.instances.values()))
    actions = []
    plan_of = inst.core.next_plan

    def recording(now):
        plan = plan_of(now)
        if not isinstance(plan, Idle):
            actions.append(_action(plan.action))
        return plan

    inst.core.next_plan = recording
    result = sim.run()
    completions = {f"{c.session_id}#{c.call_idx}": c.done_s for c in result.calls}
    return actions, [_switch(w) for w in inst.core.switches], completions


def test_daemon_core_and_simulator_agree_on_a_scripted_trace():
    cfg = load_config(ROOT / "etc" / "examples" / "paper-tp8.yaml")
    trace = _trace()
    assert len({c.model for c in trace.calls()}) == 3
    d_actions, d_switches, d_done = run_daemon_core(cfg, trace)
    s_actions, s_switches, s_done = run_simulator(cfg, trace)
    assert len(d_actions) > 50 and len(d_switches) >= 3
    assert d_actions == s_actions
    assert d_switches == s_switches
    assert {k: round(v[0], 9) for k, v in d_done.items()} == {
        k: round(v, 9) for k, v in s_done.items()
    }
