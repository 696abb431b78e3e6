"""Lease returns placed at request headers, through the real Envoy of three sim boxes and
`talariad epp` (the shipped gateway config, which checks each call at its request headers by
default): a session's return to its live lease is placed at its headers (the full-duplex filter never runs
for it), counted in flight on its box until Envoy's access log reports its end, and its lease is
renewed there, so the session stays on its box; a call that may be another branch (a shorter
body) is decided on its body; a call placed at headers whose box was killed is served by the
fallback box, not answered 503. One pool for the module; the box is killed last."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from talaria_pool import devpool
from tests.support.pool import needs_envoy, running_pool, served_by_id

pytestmark = [pytest.mark.e2e, needs_envoy]

# Polled every two seconds: a killed box is still the lease's box for a while,
# and the calls placed at headers meanwhile are what Envoy must retry.
EPP = {"poll_interval_s": 2.0, "stale_after_s": 5.0}
GAP_S = 0.4  # the agent's tool gap between an answer and its next call (well within τ)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with running_pool(tmp_path_factory.mktemp("lease-at-headers"), epp=EPP) as p:
        yield p


class Agent:
    """One session's conversation through the gateway, each call with an id of its own."""

    def __init__(self, pool: devpool.LocalPool, session: str) -> None:
        self.pool, self.session = pool, session
        self.messages = [{"role": "user", "content": f"{session}: fix the failing test. " * 30}]
        self.client = httpx.Client(base_url=f"http://{pool.gateway}", timeout=60)

    def call(self, messages: list[dict] | None = None) -> tuple[str, httpx.Response]:
        rid = f"{self.session}-{uuid.uuid4().hex[:8]}"
        body = {"model": "claude-sonnet-4", "messages": messages or self.messages, "max_tokens": 4}
        headers = {"x-session-id": self.session, "x-request-id": rid}
        r = self.client.post("/v1/chat/completions", json=body, headers=headers)
        if r.status_code == 200 and messages is None:
            answer = r.json()["choices"][0]["message"]["content"]
            self.messages += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": f"tool output {len(self.messages)}: ok"},
            ]
        return rid, r


def metric(pool: devpool.LocalPool, name: str, **labels: str) -> float:
    """One series of the picker's /metrics (0 when absent)."""
    text = httpx.get(f"http://{pool.epp_admin}/metrics", timeout=10).text
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


def placed(pool: devpool.LocalPool) -> float:
    return metric(pool, "talaria_epp_at_headers_total", result="placed")


def box_row(pool: devpool.LocalPool, box: str) -> dict:
    return next(b for b in devpool.epp_status(pool.epp_admin)["boxes"] if b["name"] == box)


def wait_for(condition, wait_s: float, what: str) -> None:
    deadline = time.monotonic() + wait_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def settled(pool: devpool.LocalPool, box: str) -> None:
    """The picker has seen every call on `box` end (its in-flight count back to 0)."""
    wait_for(lambda: box_row(pool, box)["in_flight"] == 0, 10, f"{box}: calls left in flight")


def test_returns_are_placed_at_headers_settled_and_renew_their_lease(pool):
    agent = Agent(pool, "returns")
    rid, first = agent.call()
    assert first.status_code == 200, first.text
    box = first.headers["x-talaria-instance"]
    settled(pool, box)
    before, started = placed(pool), time.monotonic()
    rids = []
    for _ in range(6):  # 2.4 s of calls: past the first lease's life (τ 1 s + 0.5 s slack)
        time.sleep(GAP_S)
        rid, r = agent.call()
        assert r.status_code == 200, r.text
        assert r.headers["x-talaria-instance"] == box  # the session stays on its box
        rids.append(rid)
        settled(pool, box)  # its end reached the picker: released from the box's count
        assert box_row(pool, box)["leases"] >= 1  # and its lease renewed there
    lease_s = 1.5
    assert time.monotonic() - started > lease_s
    # every return was placed at its headers: each one's lease renewed by the one before's end
    assert placed(pool) - before == 6
    for rid in rids:
        d = httpx.get(f"http://{pool.epp_admin}/calls/{rid}", timeout=10).json()
        assert d["kind"] == "lease_hit", d
    assert metric(pool, "talaria_epp_access_log_entries_total") >= 6
    # the full-duplex filter never ran for them: Envoy's log shows the pick and the box served
    log = served_by_id(pool)
    rows = [log[r] for r in rids]
    assert all(
        row["status"] == 200 and row["served"] == row["picked"].split(",")[0] for row in rows
    )


def test_a_shorter_body_is_decided_on_its_body(pool):
    agent = Agent(pool, "branches")
    for _ in range(2):
        rid, r = agent.call()
        assert r.status_code == 200, r.text
        settled(pool, r.headers["x-talaria-instance"])
        time.sleep(GAP_S)
    before = placed(pool)
    deferred = metric(pool, "talaria_epp_at_headers_total", result="deferred")
    # a sub-agent's first call: the same session, a conversation of its own, shorter
    rid, r = agent.call([{"role": "user", "content": "sub-agent: list the test files"}])
    assert r.status_code == 200, r.text
    assert placed(pool) == before
    assert metric(pool, "talaria_epp_at_headers_total", result="deferred") == deferred + 1
    d = httpx.get(f"http://{pool.epp_admin}/calls/{rid}", timeout=10).json()
    assert d["kind"] != "lease_hit", d  # a branch of its own, placed on the body
    settled(pool, r.headers["x-talaria-instance"])
    # two live branches now: which one the next call continues is the body's to say
    rid, r = agent.call()
    assert r.status_code == 200, r.text
    assert placed(pool) == before


def test_a_killed_leased_box_gives_a_re_placed_call_not_a_503(pool):
    agent = Agent(pool, "killed")
    rid, r = agent.call()
    assert r.status_code == 200, r.text
    box = r.headers["x-talaria-instance"]
    settled(pool, box)
    time.sleep(GAP_S)
    rid, r = agent.call()
    assert r.status_code == 200 and r.headers["x-talaria-instance"] == box, r.text
    settled(pool, box)
    dead = pool.boxes[int(box.removeprefix("box"))]
    pool.kill(box)  # SIGKILL; the picker notices at its next poll, two seconds away at most
    before = placed(pool)
    rid, r = agent.call()  # placed at headers on the dead box: Envoy retries the fallback
    assert r.status_code == 200, r.text
    assert r.headers["x-talaria-instance"] != box
    row = served_by_id(pool)[rid]
    if placed(pool) == before + 1:  # the usual case: the picker had not noticed yet
        assert row["picked"].split(",")[0] == dead != row["served"], row
    # once the picker has noticed, the session's calls are re-placed on the body, and succeed
    wait_for(lambda: box_row(pool, box)["state"] != "healthy", 15, "the kill was not noticed")
    for _ in range(2):
        rid, r = agent.call()
        assert r.status_code == 200 and r.headers["x-talaria-instance"] != box, r.text
