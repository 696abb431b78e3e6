"""Three sim boxes behind the real Envoy 1.40 and Talaria's endpoint picker: sessions stick to a
box (the box Envoy served from is the EPP's pick), the box's prefix reuse survives the gateway,
streams and large bodies pass intact, a spoofed destination picks nothing, bad input gets the
API's answer from the EPP. One pool for the module (the boxes take seconds to start)."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json

import httpx
import pytest

from tests.support import fuzz
from tests.support.pool import Answer, chat, needs_envoy, running_pool, served_by_id

pytestmark = [pytest.mark.e2e, needs_envoy]

SESSIONS, CALLS = 50, 6
# The 8 MiB test body must reach the box whole: raise the box's limits, and the picker's, above it (its prompt is
# judged at 64 bytes a token at least, so it fits tiny-agent's context).
LIMITS = {"max_body_bytes": 16 << 20, "max_string_chars": 16 << 20, "max_bytes_per_token": 64}


# What keeps a session on its box is its lease (τ). Fifty concurrent sessions on a loaded 2-core
# box can take longer than the 1 s default between an answer's end and the next call reaching the
# EPP; past τ, cost placement may rightly move a tiny-model session (its recompute is cheaper than
# a queue). The test is of the lease path through Envoy, so τ covers the machine's stalls.
EPP = {"router": {"tau_s": 10.0}, "max_body_bytes": LIMITS["max_body_bytes"]}


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with running_pool(tmp_path_factory.mktemp("pool"), limits=LIMITS, epp=EPP) as p:
        yield p


def client(address: str) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=SESSIONS)
    return httpx.AsyncClient(base_url=f"http://{address}", timeout=60, limits=limits)


async def agent_session(c: httpx.AsyncClient, sid: str) -> list[Answer]:
    """One agent's calls: a growing history, every other call streamed."""
    messages = [{"role": "system", "content": f"You are coding agent {sid}. " * 30}]
    answers = []
    for turn in range(CALLS):
        messages.append({"role": "user", "content": f"turn {turn}: look at file_{sid}.py " * 4})
        answer = await chat(c, sid, messages, stream=turn % 2 == 1)
        answers.append(answer)
        if answer.status != 200:
            break
        messages.append({"role": "assistant", "content": answer.text})
    return answers


def test_sessions_stick_to_the_picked_box_and_reuse_their_prefix(pool):
    async def run():
        async with client(pool.gateway) as c:
            sids = [f"agent-{i}" for i in range(SESSIONS)]
            return dict(
                zip(sids, await asyncio.gather(*(agent_session(c, s) for s in sids)), strict=True)
            )

    by_session = asyncio.run(run())
    log = served_by_id(pool)
    box_address = {f"box{i}": address for i, address in enumerate(pool.boxes)}
    boxes_used = set()
    for sid, answers in by_session.items():
        assert [a.status for a in answers] == [200] * CALLS, (sid, answers[-1].body)
        boxes = {a.box for a in answers}
        assert len(boxes) == 1, f"{sid} moved between boxes: {[a.box for a in answers]}"
        boxes_used |= boxes
        for a in answers:  # Envoy's own record: the EPP's pick, and where it really went
            row = log[a.headers["x-request-id"]]
            # the pick first, then the box Envoy would retry on had the pick refused the call
            picked, fallback = row["picked"].split(",")
            assert picked == row["served"] == box_address[a.box] != fallback, row
        cached = [a.usage["prompt_tokens_details"]["cached_tokens"] for a in answers]
        assert cached[0] == 0 and all(b > a for a, b in itertools.pairwise(cached)), (sid, cached)
        assert all(a.usage["talaria"]["kv_source"] == "device" for a in answers[1:]), sid
        streamed = answers[1::2]
        assert all(a.events and a.events[-1]["usage"] for a in streamed), sid
    assert len(boxes_used) >= 2, "the picker put every session on one box"


def test_sse_arrives_progressively(pool):
    async def run():
        async with client(pool.gateway) as c:
            messages = [{"role": "user", "content": "write a long answer " * 20}]
            return await chat(c, "stream-1", messages, stream=True, max_tokens=200)

    a = asyncio.run(run())
    assert a.status == 200 and a.headers["content-type"].startswith("text/event-stream")
    assert len(a.events) > 20
    # a buffering gateway would hand every event over at the end, at one moment
    spread = a.arrivals[-1] - a.arrivals[0]
    early = sum(t < a.arrivals[0] + spread / 2 for t in a.arrivals)
    assert spread > 0.05 and 0 < early < len(a.arrivals), a.arrivals


def test_the_pickers_metrics_count_what_it_decided(pool):
    asyncio.run(_one_call(pool))
    text = httpx.get(f"http://{pool.epp_admin}/metrics", timeout=5).text
    picked = next(
        line
        for line in text.splitlines()
        if line.startswith('talaria_epp_decisions_total{outcome="picked"}')
    )
    assert float(picked.split()[-1]) >= 1
    assert "talaria_epp_decision_seconds_bucket" in text


async def _one_call(pool) -> None:
    async with client(pool.gateway) as c:
        answer = await chat(c, "metrics-1", [{"role": "user", "content": "hi"}], stream=False)
    assert answer.status == 200


def test_an_8_mib_body_arrives_whole(pool):
    words = (hashlib.sha256(str(i).encode()).hexdigest() for i in range((8 << 20) // 65 + 1))
    body = {"model": "claude-sonnet-4", "messages": [{"role": "user", "content": " ".join(words)}]}
    raw = json.dumps(body).encode()
    assert len(raw) > 8 << 20
    headers = {"content-type": "application/json"}
    via = httpx.post(
        f"http://{pool.gateway}/v1/messages/count_tokens", content=raw, headers=headers, timeout=60
    )
    assert via.status_code == 200, via.text
    row = served_by_id(pool)[via.headers["x-request-id"]]
    assert int(row["bytes_in"]) == len(raw) and row["picked"].split(",")[0] == row["served"]
    # the box that served it counts the same prompt as when sent to it directly
    direct = httpx.post(
        f"http://{row['served']}/v1/messages/count_tokens", content=raw, headers=headers, timeout=60
    )
    assert via.json() == direct.json()


def test_a_client_destination_header_picks_nothing(pool):
    admin = pool.envoy_admin.removeprefix("http://")
    spoof = {"x-gateway-destination-endpoint": admin}
    r = httpx.get(f"http://{pool.gateway}/server_info", headers=spoof, timeout=30)
    assert "hot_restart_version" not in r.text and "LIVE" not in r.text  # not Envoy's admin

    async def run():
        async with client(pool.gateway) as c:
            messages = [{"role": "user", "content": "hi"}]
            answers = [await chat(c, "spoof-1", messages, stream=False)]
            home = pool.boxes[int(answers[0].box.removeprefix("box"))]
            elsewhere = next(b for b in pool.boxes if b != home)
            for target in (admin, elsewhere, ",".join(pool.boxes)):
                messages += [
                    {"role": "assistant", "content": answers[-1].text},
                    {"role": "user", "content": "and then?"},
                ]
                headers = {"x-gateway-destination-endpoint": target}
                answers.append(await chat(c, "spoof-1", messages, stream=False, headers=headers))
            return answers

    answers = asyncio.run(run())
    assert [(a.status, a.box) for a in answers] == [(200, answers[0].box)] * 4
    log = served_by_id(pool)
    assert all(log[a.headers["x-request-id"]]["served"] in pool.boxes for a in answers)


def test_a_malformed_body_gets_the_api_400_from_the_epp(pool):
    headers = {"content-type": "application/json", "x-session-id": "bad-1"}
    r = httpx.post(
        f"http://{pool.gateway}/v1/chat/completions",
        content=b'{"model": ',
        headers=headers,
        timeout=30,
    )
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    row = served_by_id(pool)[r.headers["x-request-id"]]
    assert row["served"] is None and row["picked"] is None  # answered before any box


def _streams_taken(pool) -> float:
    """What the EPP was asked: its ext_proc streams and its checks at request headers."""
    text = httpx.get(f"http://{pool.epp_admin}/metrics", timeout=5).text
    series = ("talaria_epp_streams_total ", "talaria_epp_at_headers_total{")
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(series))


@pytest.mark.parametrize(
    "path", ["/metrics", "/ready", "/health", "/pool/snapshot", "/v1/../metrics"]
)
def test_the_boxes_operator_paths_are_not_public(pool, path):
    box = pool.boxes[0]
    real = path.rsplit("/", 1)[-1] if path.startswith("/v1") else path.lstrip("/")
    assert httpx.get(f"http://{box}/{real}", timeout=10).status_code in (200, 401)  # the box has it
    before = _streams_taken(pool)
    r = httpx.get(f"http://{pool.gateway}{path}", timeout=10)
    assert r.status_code == 404, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"]["type"] == "not_found_error"
    assert _streams_taken(pool) == before  # answered by Envoy: the EPP was not asked


def test_the_api_paths_stay_public(pool):
    r = httpx.get(f"http://{pool.gateway}/v1/models", timeout=10)
    assert r.status_code == 200 and r.json()["data"]


FUZZED = 150  # `bench/pool_faults.py --cases fuzz` sends 3,000; the suite keeps it bounded


def test_fuzzed_bodies_through_the_gateway_get_no_5xx_and_nothing_retryable(pool):
    """Malformed bodies of every API (the suite's shared fuzz cases) through Envoy and the EPP:
    each one is answered in its API's shape, none as a server error or as something a client
    would retry (429, 503), and the pool still answers a good call after them."""
    statuses = []
    with httpx.Client(base_url=f"http://{pool.gateway}", timeout=60) as c:
        for path, kind, content in fuzz.cases(FUZZED, 0):
            r = c.post(path, content=content, headers={"content-type": kind or ""})
            statuses.append(r.status_code)
            assert fuzz.acceptable(r.status_code, r.headers), (path, r.status_code, r.text[:200])
    assert not [s for s in statuses if s >= 500 or s in fuzz.RETRYABLE]
    ok = asyncio.run(_one_call(pool))
    assert ok.status == 200


async def _one_call(pool) -> Answer:
    async with client(pool.gateway) as c:
        return await chat(c, "after-fuzz", [{"role": "user", "content": "hello"}], stream=False)
