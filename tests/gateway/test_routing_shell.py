"""The gateway's shell around the router: telemetry → snapshot, knobs from config."""

import dataclasses
import pathlib

from talariad.config import load_config
from talariad.gateway.routing import router_knobs, snapshot
from talariad.router import ModelState
from talariad.types import KVState
from talariad.wire.messages import KVLocation, ModelLoad, Telemetry

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_snapshot_maps_model_states_and_sessions():
    t = Telemetry(
        instance="cold0",
        version=7,
        pool="cold",
        models=["a", "b", "c"],
        active_model="a",
        loaded_models=["a"],
        opened_models=["a", "b"],
        model_load={
            "b": ModelLoad(queued_calls=2, queued_tokens=300, running=1, switch_cost_s=0.4)
        },
        sessions=[KVLocation(session_id="s1", model="b", state=KVState.HOST, kv_len=120)],
        round_load_s=1.5,
    )
    snap = snapshot(t, ["a", "b", "c"], taken_at=10.0, healthy=True)
    assert snap.version == 7 and snap.taken_at == 10.0 and snap.round_load_s == 1.5
    assert [snap.residency(m).state for m in "abc"] == [
        ModelState.ACTIVE,
        ModelState.RESIDENT,
        ModelState.ABSENT,
    ]
    assert snap.residency("b").queued_tokens == 300 and snap.residency("b").switch_cost_s == 0.4
    assert (
        snap.sessions[("s1", "b")].state is KVState.HOST
        and snap.sessions[("s1", "b")].kv_len == 120
    )


def test_router_knobs_follow_config_and_ablations():
    cfg = load_config(ROOT / "etc" / "talaria.yaml")
    knobs = router_knobs(cfg)
    assert (
        knobs.tau_s == cfg.policy.tau_s and knobs.gamma == cfg.policy.gamma and knobs.reservations
    )
    off = cfg.model_copy(
        update={"ablations": cfg.ablations.model_copy(update={"reservations": False})}
    )
    assert router_knobs(off).tau_s == 0.0 and not router_knobs(off).reservations


def test_round_measurements_in_telemetry_refine_the_router_profile_once():
    from talariad.gateway.routing import RouterShell
    from talariad.knobs import model_profile
    from talariad.types import RoundMeasurement

    cfg = load_config(ROOT / "etc" / "talaria.yaml")
    shell = RouterShell.from_config(cfg, {m.name: model_profile(cfg, m.name) for m in cfg.models})
    before = shell.router.profiles()["tiny-code"].decode_step_s
    rounds = [RoundMeasurement(model="tiny-code", seq=1, decode_steps=10, decode_s=1.0)]
    t = Telemetry(
        instance="cold0",
        version=1,
        pool="cold",
        models=["tiny-chat", "tiny-code"],
        active_model=None,
        loaded_models=[],
        rounds=rounds,
    )
    shell.observe(t, 0.0)
    after = shell.router.profiles()["tiny-code"].decode_step_s
    assert before < after < 0.1  # 0.1 s per step measured, folded in by the EWMA
    shell.observe(t.model_copy(update={"version": 2}), 0.5)  # the same report again: fed once
    assert shell.router.profiles()["tiny-code"].decode_step_s == after
    slower = [dataclasses.replace(rounds[0], decode_s=2.0)]
    restarted = t.model_copy(update={"version": 1, "rounds": slower})
    shell.instance_down("cold0", 1.0)
    shell.observe(restarted, 1.5)  # a restarted instance numbers its rounds from 1 again
    assert shell.router.profiles()["tiny-code"].decode_step_s > after


def _shell(**knobs):
    from talariad.gateway.routing import RouterShell
    from talariad.router import Router, RouterKnobs
    from tests.router.router_factories import MODEL, PROFILE

    return RouterShell(Router(RouterKnobs(**knobs), {MODEL: PROFILE}))  # no config needed


async def test_a_held_call_is_rejected_after_the_queue_timeout_even_if_expire_ran():
    import time

    from talariad.router import DecisionKind
    from tests.router.router_factories import Snaps, call

    shell = _shell(queue_timeout_s=0.6, staleness_s=1e9, heartbeat_s=1e9)
    t0 = time.monotonic()
    clock = lambda: time.monotonic() - t0  # noqa: E731
    # the model not open there and its round full: nothing is feasible, nowhere to queue it
    shell.router.observe(Snaps()("a", 0.0, models={}, round_load_s=9.0), 0.0)
    shell._expired_at = -10.0
    decision = await shell.place(call("c1"), clock)
    assert decision.kind is DecisionKind.OVERLOAD_REJECT and "queue timeout" in decision.reason
    assert 0.6 <= clock() < 3.0 and shell.router.held() == ()


def test_a_failed_poll_marks_the_instance_unhealthy_and_its_lease_is_not_honoured():
    from talariad.router import DecisionKind
    from talariad.types import KVState
    from tests.router.router_factories import Snaps, call

    shell = _shell(staleness_s=1e9, heartbeat_s=1e9)
    snaps = Snaps()
    for name in ("a", "b"):
        shell.router.observe(snaps(name, 0.0), 0.0)
    first = shell.router.place(call("c1", session="s"), 0.0)
    shell.router.completed("c1", first.instance, KVState.DEVICE, 100, 0.1)
    shell.unhealthy(first.instance, 0.2)
    again = shell.router.place(call("c2", session="s"), 0.3)
    assert again.kind is not DecisionKind.LEASE_HIT and again.instance != first.instance
