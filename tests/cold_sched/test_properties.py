"""Properties over random closed-loop arrival sequences, every ablation and both modes."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from talariad.cold_sched import (
    ABLATIONS,
    ColdScheduler,
    Decode,
    Prefill,
    SchedKnobs,
    Switch,
    ablation,
)
from talariad.types import KVState, SwitchPath
from tests.cold_sched.driver import PROFILE, Session, Turn, VirtualDriver

MODELS = ["A", "B", "C"]

turns = st.lists(
    st.builds(Turn, st.integers(1, 4000), st.integers(1, 30), st.floats(0.0, 2.0)),
    min_size=1,
    max_size=3,
)
sessions = st.lists(
    st.tuples(st.sampled_from(MODELS), st.floats(0.0, 12.0), turns, st.sampled_from([0, 0, 500])),
    min_size=1,
    max_size=7,
)
profiles = st.builds(
    lambda per_seq, d2d, h2d: dataclasses.replace(
        PROFILE,
        decode_s_per_seq=per_seq,
        switch_s={SwitchPath.D2D: d2d, SwitchPath.H2D: h2d},
        open_s=h2d,
    ),
    st.sampled_from([0.0, 0.002]),
    st.floats(0.01, 0.5),
    st.floats(0.5, 4.0),
)
knobs = st.builds(
    lambda name, batch, sp_batch, cap: ablation(
        name, SchedKnobs(max_batch=batch, max_sp_batch=sp_batch, kv_capacity_tokens=cap)
    ),
    st.sampled_from(sorted(ABLATIONS)),
    st.integers(1, 8),
    st.integers(1, 4),
    st.sampled_from([5000, 20_000, 1 << 20]),
)


class Invariants:
    """Checked on every action as the scheduler chooses it."""

    def __init__(self, evict: bool = False) -> None:
        self.active: str | None = None
        self.evict, self.seen = evict, 0

    def __call__(self, sched: ColdScheduler, action: object) -> None:
        self.seen += 1
        if self.evict and self.seen % 7 == 0:  # the substrate drops a host copy now and then
            host = [k for k, e in sched.ledger.entries.items() if e.state is KVState.HOST]
            if host:
                sched.set_kv_state(*host[0], KVState.MISSING, 0)
        if isinstance(action, Switch):
            # a switch only at a slot boundary: the slot is closed and its batch parked
            assert sched.slot is None and not sched.table.running
            assert (
                sched.mode == "time_shared" and action.from_model == self.active != action.to_model
            )
            self.active = action.to_model
            return
        assert action.model == self.active == sched.active  # one model active at any instant
        assert all(sched.table.records[c].call.model == action.model for c in action.call_ids)
        if isinstance(action, Prefill) and action.tag == "SP":
            self.check_sp(sched, action)

    @staticmethod
    def check_sp(sched: ColdScheduler, action: Prefill) -> None:
        assert sched.knobs.sp and sched.slot is not None and sched.slot.model == action.model
        for item in action.calls:
            call = sched.table.records[item.call_id].call
            assert call.is_continuation and call.model == sched.active
            assert (
                call.arrived_at >= sched.slot.opened_at and item.call_id not in sched.slot.p_pending
            )
            assert item.cached_device_tokens + item.restore_tokens > 0
            assert sched.knobs.host_kv or item.restore_tokens == 0


def build_sessions(raw: list) -> list[Session]:
    return [
        Session(f"s{i}", model, ts, start, pre) for i, (model, start, ts, pre) in enumerate(raw)
    ]


@settings(max_examples=40, deadline=None)
@given(raw=sessions, profile=profiles, knob=knobs, evict=st.booleans())
def test_time_shared_properties(raw, profile, knob, evict):
    sched = ColdScheduler(knob, dict.fromkeys(MODELS, profile), MODELS)
    check = Invariants(evict)
    d = VirtualDriver(sched, build_sessions(raw), observe=check)
    d.run()
    # every submitted call completes once arrivals stop, and nothing is left behind
    assert set(d.completions) == set(d.submitted)
    assert not sched.table.records and sched.in_flight is None
    assert all(c.ttft_s >= 0 and c.completion_tokens >= 1 for c in d.completions.values())
    for r in sched.round_summaries:
        assert abs(r.wall_s - (r.active_s + r.switch_s)) < 1e-9 and r.ended_at >= r.started_at
    if not knob.sp:
        assert not [s for s in d.actions(Prefill) if s.action.tag == "SP"]
    sched.check_integrity()


@settings(max_examples=25, deadline=None)
@given(raw=sessions, knob=knobs)
def test_pinned_properties(raw, knob):
    sched = ColdScheduler(knob, {"A": PROFILE}, ["A"], mode="pinned")
    pinned = [dataclasses.replace(s, model="A") for s in build_sessions(raw)]
    check = Invariants()
    check.active = "A"
    d = VirtualDriver(sched, pinned, observe=check)
    d.run()
    assert set(d.completions) == set(d.submitted)
    assert not d.actions(Switch) and not sched.round_summaries
    assert all(len(s.action.call_ids) <= knob.max_batch for s in d.actions(Decode))
