"""End to end: the planner in `auto` on a running daemon (sim instances). Sessions on two models
share the cold instance while the hot one pins a model nobody calls; the planner proposes pinning
a busy model, carries the move out with the pool-move mechanics, the sessions go on without an
error, and `talaria-ctl pool plan` explains it."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from talaria_ctl.main import app
from tests.support.daemon import start_daemon, stop_daemon, tiny_default

pytestmark = pytest.mark.e2e

CHAT = [{"role": "user", "content": "Fix the failing test in the parser module."}]
BUSY = ("tiny-code", "tiny-agent")


def config() -> dict:
    cfg = tiny_default()
    cfg["instances"] = [
        {"name": "hot0", "pool": "hot", "executor": "sim", "models": ["tiny-chat"]},
        {
            "name": "cold0",
            "pool": "cold",
            "executor": "sim",
            "models": ["tiny-chat", "tiny-code", "tiny-agent"],
        },
    ]
    cfg["planner"] = {
        "mode": "auto",
        "window_s": 1.0,
        "warmup_windows": 2,
        "persistence": 1.0,  # one timescale: the test's demand does not change
        "dwell_s": 3600,
    }
    return cfg


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("talariad-planner"), base=config())
    yield d
    stop_daemon(d)
    d.notify.close()


def ctl(d, *args) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, ["--socket", d.socket_path, *args])
    return r.exit_code, r.stdout, r.stderr


def plan(d) -> dict:
    code, out, err = ctl(d, "pool", "plan", "--json")
    assert code == 0, err
    return json.loads(out)


class Sessions:
    """Agent-like sessions on the busy models, each call after the previous one's answer."""

    def __init__(self, d, per_model: int = 3) -> None:
        self.d, self.stop = d, threading.Event()
        self.errors: list[str] = []
        self.served: list[tuple[float, str, str]] = []  # (time, model, instance)
        self.threads = [
            threading.Thread(target=self._run, args=(f"s-{m}-{i}", m), daemon=True)
            for m in BUSY
            for i in range(per_model)
        ]

    def _run(self, session: str, model: str) -> None:
        with httpx.Client(timeout=60) as client:
            while not self.stop.is_set():
                r = client.post(
                    f"{self.d.endpoint}/v1/chat/completions",
                    headers={"x-session-id": session},
                    json={"model": model, "messages": CHAT, "max_tokens": 16, "ignore_eos": True},
                )
                if r.status_code != 200:
                    self.errors.append(f"{model} {r.status_code}: {r.text[:200]}")
                    continue
                instance = r.json()["usage"]["talaria"]["instance"]
                self.served.append((time.monotonic(), model, instance))

    def __enter__(self) -> Sessions:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


def fresh_call(d, model: str, session: str) -> str:
    r = httpx.post(
        f"{d.endpoint}/v1/chat/completions",
        headers={"x-session-id": session},
        timeout=60,
        json={"model": model, "messages": CHAT, "max_tokens": 4, "ignore_eos": True},
    )
    assert r.status_code == 200, r.text
    return r.json()["usage"]["talaria"]["instance"]


def wait_for_move(d, timeout_s: float = 90.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        p = plan(d)
        done = [e for e in p["history"] if e["outcome"] == "done"]
        if done:
            return p
        assert not [e for e in p["history"] if e["outcome"].startswith("failed")], p["history"]
        time.sleep(0.25)
    raise AssertionError(f"no move within {timeout_s}s: {plan(d)}")


def test_auto_moves_the_idle_hot_instance_to_a_busy_model_without_failing_a_session(daemon):
    with Sessions(daemon) as sessions:
        p = wait_for_move(daemon)
        moved_at = time.monotonic()
        event = next(e for e in p["history"] if e["outcome"] == "done")
        pinned = event["move"]["after"].removeprefix("hot:")
        assert event["by"] == "auto" and event["move"]["instance"] == "hot0"
        assert event["move"]["before"] == "hot:tiny-chat" and pinned in BUSY
        time.sleep(2.0)  # the sessions keep going across and after the move
        new = [fresh_call(daemon, pinned, f"new-{i}") for i in range(3)]
    assert not sessions.errors, sessions.errors[:3]
    assert any(t > moved_at for t, m, _ in sessions.served if m == pinned)
    assert new == ["hot0"] * 3  # new sessions of the pinned model go to its hot instance
    assert f"hot0=hot:{pinned}" in p["assignment"]
    code, out, _ = ctl(daemon, "pool", "plan")
    assert code == 0, out
    assert f"last move: hot0 hot:tiny-chat -> hot:{pinned} by auto, done" in out
    assert any("move: gain" in w for w in event["why"]), (event, p["reasons"])
    assert "gain" in out and "cost" in out and "expected delay" in out  # why, in numbers


def test_pool_plan_explains_the_hold_and_apply_refuses_with_nothing_to_do(daemon):
    p = plan(daemon)
    assert p["mode"] == "auto" and not p["moving"]
    assert p["reasons"] and p["reasons"][0].startswith("expected delay")
    if not p["has_move"]:
        code, _, err = ctl(daemon, "pool", "plan", "--apply")
        assert code == 3 and len(err.strip().splitlines()) == 1 and "no move proposed" in err


def test_metrics_count_proposals_and_moves(daemon):
    text = httpx.get(f"{daemon.endpoint}/metrics", timeout=10).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    done = sum(
        v
        for (name, labels), v in samples.items()
        if name == "talaria_planner_moves_total" and ("outcome", "done") in labels
    )
    proposed = sum(
        v for (name, _), v in samples.items() if name == "talaria_planner_proposals_total"
    )
    assert done >= 1 and proposed >= 1
    assert samples[("talaria_planner_moving", ())] == 0


@pytest.fixture(scope="module")
def advising(tmp_path_factory):
    cfg = config()
    cfg["planner"]["mode"] = "advise"
    d = start_daemon(tmp_path_factory.mktemp("talariad-advise"), base=cfg)
    yield d
    stop_daemon(d)
    d.notify.close()


def test_advise_proposes_and_pool_plan_apply_carries_it_out_once(advising):
    with Sessions(advising) as sessions:
        deadline = time.monotonic() + 90
        while not (p := plan(advising))["has_move"]:
            assert time.monotonic() < deadline, p["reasons"]
            time.sleep(0.25)
        assert not p["history"]  # advise never moves by itself
        code, out, err = ctl(advising, "pool", "plan", "--apply")
        assert code == 0, err
        assert out.startswith("planner: advise; hot0=hot:tiny-") and "applied: hot0" in out
    assert not sessions.errors, sessions.errors[:3]
    event = plan(advising)["history"][0]
    assert (event["by"], event["outcome"]) == ("operator", "done")
    assert f"hot0=hot:{event['move']['after'].removeprefix('hot:')}" in plan(advising)["assignment"]
