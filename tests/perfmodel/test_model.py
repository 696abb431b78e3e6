"""The performance model of a `sim` instance: what an action costs under a latency profile, the
memory model that decides a switch's path (staging, host KV, switch phases), and `SimModel`,
which charges both to the instance core's steps."""

from __future__ import annotations

import pytest

from talariad.cold_sched import Decode, Prefill, PrefillItem, Switch
from talariad.perfmodel.costs import action_seconds, switch_seconds
from talariad.perfmodel.memory import MemorySpec, SimMemory, memory_spec
from talariad.perfmodel.profiles import load_set
from talariad.types import LatencyProfile, SwitchPath


@pytest.fixture(scope="module")
def paper():
    return load_set("paper-tp8")


PROF = LatencyProfile(
    prefill_base_s=0.01,
    prefill_s_per_token=1e-3,
    decode_step_s=0.02,
    decode_s_per_seq=0.001,
    restore_s_per_token=1e-4,
    switch_s={SwitchPath.D2D: 0.1, SwitchPath.PARTIAL: 1.0, SwitchPath.H2D: 2.1},
    open_s=3.0,
)


def test_action_costs_follow_the_profile():
    profiles = {"m": PROF}
    pre = Prefill([PrefillItem("a", 100, 50, 10), PrefillItem("b", 0, 50, 0)], "P", "m")
    assert action_seconds(pre, profiles) == pytest.approx(0.01 + 0.1 + 0.01)
    assert action_seconds(Decode("m", ["a", "b"]), profiles) == pytest.approx(0.022)
    sw = Switch("x", "m", SwitchPath.D2D)
    assert action_seconds(sw, profiles) == pytest.approx(0.1)
    assert action_seconds(sw, profiles, SwitchPath.PARTIAL, uncovered=0.5) == pytest.approx(1.1)
    assert action_seconds(sw, profiles, SwitchPath.PARTIAL) == pytest.approx(1.0)
    assert switch_seconds(PROF, SwitchPath.D2D, first_open=True) == 3.0


def spec(**kw) -> MemorySpec:
    base = dict(
        hbm_bytes=100,
        host_kv_bytes=50,
        tp=1,
        h2d_bytes_per_s=10.0,
        weight_bytes={"a": 40, "b": 40},
        kv_bytes_per_token={"a": 1, "b": 1},
    )
    return MemorySpec(**{**base, **kw})


def test_staging_decides_the_switch_path():
    mem = SimMemory(spec())
    mem.switched(0.0, "b")
    assert mem.plan_switch("a", "b", 0, 10.0).path is SwitchPath.D2D  # 40 B staged by t=4 s
    partial = mem.plan_switch("a", "b", 0, 2.0)  # only 20 B copied so far
    assert partial.path is SwitchPath.PARTIAL and partial.uncovered == pytest.approx(0.5)
    assert mem.plan_switch("a", "b", 60, 10.0).path is SwitchPath.H2D  # KV took all the slack
    assert SimMemory(spec(), d2d=False).plan_switch("a", "b", 0, 10.0).path is SwitchPath.H2D


def test_the_sim_model_stages_what_the_rotation_switches_to_next():
    """One staging-target rule for the scheduler, the torch executor and the sim model."""
    from talariad.cold_sched.calls import SessionLedger
    from talariad.cold_sched.rounds import staging_target
    from talariad.instance import InstanceCall, StepPlan
    from talariad.perfmodel.model import SimModel

    assert staging_target(["a", "b", "c"], "a", {"c"}.__contains__) == "c"  # b is idle: skipped
    assert staging_target(["a", "b", "c"], "a", set().__contains__) == "b"
    assert staging_target(["a"], "a", {"a"}.__contains__) is None
    mem = SimMemory(
        spec(weight_bytes={"a": 40, "b": 40, "c": 40}, kv_bytes_per_token={"a": 1, "b": 1, "c": 1})
    )
    model = SimModel({m: PROF for m in "abc"}, mem, ["a", "b", "c"], prewarm=True)
    waiting = {"x": InstanceCall("x", "s", "c", 10, 5)}  # only c has work
    ledger = SessionLedger()

    def switch(src, dst, now):
        plan = StepPlan(Switch(src, dst, SwitchPath.D2D), {}, waiting, ledger, 0)
        return model.begin(plan, now), model.end(plan, now)

    switch(None, "a", 0.0)
    assert model.staging == "c"
    seconds, result = switch("a", "b", 10.0)  # not staged: a full reload
    assert result.switch_path is SwitchPath.H2D and seconds == pytest.approx(2.1)
    model.staging = "c"
    seconds, result = switch("b", "c", 20.0)
    assert result.switch_path is SwitchPath.D2D and seconds == pytest.approx(0.1)


def test_staging_serves_only_its_target_and_kv_growth_dirties_it_for_good():
    three = spec(
        weight_bytes={"a": 40, "b": 40, "c": 40}, kv_bytes_per_token={"a": 1, "b": 1, "c": 1}
    )
    mem = SimMemory(three)
    mem.switched(0.0, "b")
    assert mem.plan_switch("a", "c", 0, 10.0).path is SwitchPath.H2D  # b was staged, not c
    assert mem.coverage("a", 0, 10.0) == pytest.approx(1.0)
    mem.note_kv(40)  # a's KV peaked into the staging range, then shrank again
    plan = mem.plan_switch("a", "b", 0, 10.0)
    assert plan.path is SwitchPath.PARTIAL and plan.uncovered == pytest.approx(0.5)


def test_host_kv_evicts_least_recently_used():
    mem = SimMemory(spec())
    assert mem.save([(("s1", "a"), 20), (("s2", "a"), 20)]) == []
    mem.touch(("s1", "a"))
    assert mem.save([(("s3", "a"), 20)]) == [("s2", "a")]
    mem.check_integrity()
    assert SimMemory(spec(), host_kv=False).save([(("s1", "a"), 80)]) == []


def test_memory_spec_from_the_paper_box(paper):
    s = memory_spec(paper)
    assert s.tp == 8 and s.hbm_bytes < paper.box.hbm_per_gpu_bytes
    assert 0 < s.host_kv_bytes < paper.box.host_memory_bytes
    assert set(s.weight_bytes) == set(paper.models)


def timed_spec(**kw) -> MemorySpec:
    """Table 2-like phases, a 10 B/s H2D link and a 1000 B/s D2D gather."""
    from talariad.perfmodel.memory import SwitchPrices

    other = {p: (0.01, 0.0, 0.0, 0.0) for p in SwitchPath}
    return spec(prices=SwitchPrices(other, 0.1, 1000.0), **kw)


def test_a_switch_costs_its_phases_and_phase_2_follows_the_bytes():
    mem = SimMemory(timed_spec(weight_bytes={m: 40 for m in "abc"}))
    mem.switched(0.0, "b")
    full = mem.plan_switch("a", "b", 0, 10.0)
    assert full.path is SwitchPath.D2D
    assert mem.switch_phases("b", full) == pytest.approx((0.01, 0.1 + 40 / 1000, 0, 0, 0))
    part = mem.plan_switch("a", "b", 0, 1.0)  # 10 of 40 B staged: 30 B come over H2D
    assert part.path is SwitchPath.PARTIAL and part.staged_bytes == 10
    assert sum(mem.switch_phases("b", part)) == pytest.approx(0.01 + 0.1 + 10 / 1000 + 30 / 10)
    fallback = mem.plan_switch("a", "c", 0, 10.0)  # c was never staged
    assert sum(mem.switch_phases("c", fallback)) == pytest.approx(0.01 + 0.1 + 40 / 10)
    assert SimMemory(spec()).switch_phases("b", full) is None  # no timing: the profile's table


def test_kv_growth_into_the_staged_range_is_dirty_and_reloads_from_host():
    mem = SimMemory(timed_spec())
    mem.switched(0.0, "b", 10)  # 10 B of KV on device when staging began: 50 B of room
    mem.note_kv(40)  # KV grew 30 B into the staged range
    plan = mem.plan_switch("a", "b", 0, 10.0)
    assert plan.path is SwitchPath.PARTIAL
    assert plan.staged_bytes == 20 and plan.dirty_bytes == 20  # 40 B copied, 20 B overwritten
    assert sum(mem.switch_phases("b", plan)) == pytest.approx(0.01 + 0.1 + 20 / 1000 + 20 / 10)


def test_restores_share_the_link_with_staging():
    mem = SimMemory(timed_spec())
    mem.switched(0.0, "b")
    mem.note_restore(3.0)  # 3 of the 4 s went to HKVR restores
    assert mem.plan_switch("a", "b", 0, 4.0).staged_bytes == 10


def test_the_sim_model_reports_switch_phases(paper):
    from talariad.cold_sched.calls import SessionLedger
    from talariad.instance import StepPlan
    from talariad.perfmodel.model import SimModel

    models = list(paper.models)
    model = SimModel(paper.profiles(), SimMemory(memory_spec(paper)), models, prewarm=True)
    ledger = SessionLedger()
    plan = StepPlan(Switch(None, models[0], SwitchPath.D2D), {}, {}, ledger, 0)
    model.begin(plan, 0.0), model.end(plan, 0.0)  # the free first activation
    target = model.staging
    plan = StepPlan(Switch(models[0], target, SwitchPath.D2D), {}, {}, ledger, 0)
    seconds = model.begin(plan, 0.5)  # half a second of staging: a partial switch
    result = model.end(plan, 0.5 + seconds)
    report = result.switch_report
    assert result.switch_path is SwitchPath.PARTIAL and report["path"] == "partial"
    assert len(report["phase_s"]) == 5 and sum(report["phase_s"]) == pytest.approx(seconds)
    weight = paper.models[target].weight_bytes_per_gpu
    assert 0 < report["staged_bytes"] < weight
