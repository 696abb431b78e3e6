"""Faults of a pool behind the real Envoy: a pool with no room answers 429 from the EPP, a dead
box's sessions move on (their KV recomputed), a dead EPP fails open through the health check or
closed as configured. One pool for the module; the EPP is killed last."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest

from talaria_pool import devpool, envoy
from tests.support.pool import chat, needs_envoy, running_pool, served_by_id

pytestmark = [pytest.mark.e2e, needs_envoy]


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with running_pool(tmp_path_factory.mktemp("faults")) as p:
        yield p


def second_gateway(pool: devpool.LocalPool, name: str, epp: str, failure_mode: str) -> str:
    """Another Envoy on the same boxes (a part of the pool, stopped with it)."""
    spec = envoy.GatewaySpec("127.0.0.1:0", epp, tuple(pool.boxes), 0, failure_mode, "full-duplex")
    return devpool.start_gateway(pool, spec, name).listen


def post(gateway: str, session: str, stream: bool = False) -> httpx.Response:
    body = {"model": "claude-sonnet-4", "max_tokens": 4, "stream": stream}
    body["messages"] = [{"role": "user", "content": f"hello from {session}"}]
    headers = {"x-session-id": session}
    return httpx.post(
        f"http://{gateway}/v1/chat/completions", json=body, headers=headers, timeout=30
    )


def test_a_pool_with_no_room_answers_429_from_the_epp(pool):
    # An EPP whose round budget (gamma × TTFT target) is next to nothing, and which refuses
    # rather than queues: an idle box takes a call, a box with any load or lease has no room.
    knobs = {"router": {"ttft_target_s": 1e-6, "overload": "reject"}}
    epp, _ = devpool.start_epp(pool, "fail_closed", name="epp-full", **knobs)
    gateway = second_gateway(pool, "envoy-full", epp, "fail_closed")
    started = time.monotonic()
    answers = [post(gateway, f"full-{i}") for i in range(len(pool.boxes) + 2)]
    assert time.monotonic() - started < 10  # refused at once, never held
    assert {a.status_code for a in answers} <= {200, 429}
    r = next(a for a in answers if a.status_code == 429)
    assert int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["type"] == "rate_limit_exceeded"
    pool.kill("envoy-full", signal.SIGTERM)
    pool.kill("epp-full", signal.SIGTERM)


def test_a_dead_box_sessions_complete_on_another_box(pool):
    async def calls(turn: int, sids: list[str]):
        async with httpx.AsyncClient(base_url=f"http://{pool.gateway}", timeout=60) as c:
            msgs = lambda s: [{"role": "user", "content": f"{s} says: " + "work " * 40}]  # noqa: E731
            history = {s: msgs(s) for s in sids}
            out = {}
            for s in sids:
                history[s] += [{"role": "user", "content": f"turn {turn}"}] if turn else []
                out[s] = await chat(c, s, history[s], stream=turn % 2 == 1)
            return out

    sids = [f"move-{i}" for i in range(9)]
    first = asyncio.run(calls(0, sids))
    assert all(a.status == 200 for a in first.values())
    victim = next(a.box for a in first.values())
    pool.kill(victim)  # SIGKILL: no goodbye to the EPP
    deadline = time.monotonic() + 10  # the EPP's staleness bound is 2 s
    while victim in devpool.epp_status(pool.epp_admin)["healthy"]:
        assert time.monotonic() < deadline, "the EPP still takes the dead box"
        time.sleep(0.1)
    then = asyncio.run(calls(1, sids))
    for s in sids:
        a = then[s]
        assert a.status == 200 and a.box != victim, (s, a.status, a.box)
        if first[s].box == victim:  # it moved: the new box had none of its prefix
            assert a.usage["prompt_tokens_details"]["cached_tokens"] == 0
            assert a.usage["talaria"]["kv_source"] in ("none", "recompute"), a.usage
        else:
            assert a.box == first[s].box, s


def test_a_dead_epp_fails_open_through_the_health_check_or_closed(pool):
    closed = second_gateway(pool, "envoy-closed", pool.epp, "fail_closed")
    assert post(closed, "before-kill").status_code == 200
    pool.kill("epp")
    assert [post(closed, f"closed-{i}").status_code for i in range(5)] == [500] * 5
    wait_epp_unhealthy(pool.envoy_admin)
    for box in dead_boxes(pool):  # failing open skips them once Envoy's check has found them
        wait_unhealthy(pool.envoy_admin, f"pool_fallback::{box}::")
    answers = [post(pool.gateway, f"open-{i}", stream=i % 2 == 1) for i in range(12)]
    assert [a.status_code for a in answers] == [200] * 12, [a.text[:80] for a in answers]
    assert all(a.text.rstrip().endswith(("}", "data: [DONE]")) for a in answers)
    log = served_by_id(pool)
    rows = [log[a.headers["x-request-id"]] for a in answers]
    assert all(r["picked"] is None and r["served"] in pool.boxes for r in rows)  # round robin


def wait_epp_unhealthy(admin: str, wait_s: float = 10) -> None:
    """Until Envoy's active health check has marked the EPP down (about a second)."""
    wait_unhealthy(admin, "epp::", wait_s)


def wait_unhealthy(admin: str, host: str, wait_s: float = 10) -> None:
    """Until Envoy's active health check has marked `host` ("cluster::" or "cluster::ip:port::")
    failed."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        text = httpx.get(f"{admin}/clusters", timeout=5).text
        if any(line.startswith(host) and "failed_active_hc" in line for line in text.splitlines()):
            return
        time.sleep(0.1)
    raise AssertionError(f"Envoy never marked {host} unhealthy")


def dead_boxes(pool) -> list[str]:
    """The boxes this module killed (their parts are gone from the pool)."""
    return [address for i, address in enumerate(pool.boxes) if f"box{i}" not in pool.procs]
