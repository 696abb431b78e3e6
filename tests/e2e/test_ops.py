"""End to end: the operator's actions with talaria-ctl on a running daemon (default config, sim
executor), each checked by its effect. The tests share one daemon and run in file order."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from talaria_ctl.main import app
from tests.support.daemon import start_daemon, stop_daemon

pytestmark = pytest.mark.e2e

CHAT = [{"role": "user", "content": "Fix the failing test in the parser module."}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    # τ = 2 s: a lease outlives the few ctl round trips between two turns of a session
    d = start_daemon(
        tmp_path_factory.mktemp("talariad-ops"),
        executor="sim",
        overrides={"policy": {"tau_s": 2.0, "queue_timeout_s": 10.0}},
    )
    yield d
    stop_daemon(d)
    d.notify.close()


def ctl(d, *args, ok: bool = True):
    """talaria-ctl in this process (a subprocess per call would cost most of this module's time;
    test_refusals_are_one_line_exit_3 runs the real executable)."""
    r = CliRunner().invoke(app, ["--socket", d.socket_path, *args])
    r.returncode = r.exit_code
    if ok:
        assert r.returncode == 0, (r.stderr, r.exception)
    return r


def ctl_process(d, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "talaria_ctl.main", "--socket", d.socket_path, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def ctl_json(d, *args):
    return json.loads(ctl(d, *args, "--json").stdout)


def call(d, model: str, session: str | None = None, max_tokens: int = 4) -> httpx.Response:
    headers = {"x-session-id": session} if session else {}
    return httpx.post(
        f"{d.endpoint}/v1/chat/completions",
        headers=headers,
        timeout=60,
        json={"model": model, "messages": CHAT, "max_tokens": max_tokens, "ignore_eos": True},
    )


def served_by(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.json()["usage"]["talaria"]["instance"]


def instance(d, name: str) -> dict:
    return next(i for i in ctl_json(d, "instance", "list") if i["name"] == name)


def refused_without_force(d, *args) -> None:
    """Emptying the last instance of a model is refused without --force: one line, exit 3."""
    r = ctl(d, *args, ok=False)
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "last instance" in r.stderr and "--force" in r.stderr, r.stderr


def unready_models(d) -> dict:
    """/ready's models without a taker (empty when it answers 200)."""
    r = httpx.get(f"{d.endpoint}/ready", timeout=10)
    assert (r.status_code == 200) == (not r.json()["unavailable"]), r.text
    return r.json()["unavailable"]


def assert_unavailable_at_once(d, model: str, why: str) -> None:
    """A call for `model` gets 503 now, in the OpenAI and the Anthropic error shapes (new
    sessions: no lease of an earlier call may place them)."""
    session = f"s-{uuid.uuid4().hex}"
    r = call(d, model, session)
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_unavailable", r.text
    assert why in r.json()["error"]["message"] and r.headers["retry-after"]
    r = httpx.post(
        f"{d.endpoint}/v1/messages",
        headers={"x-session-id": session},
        timeout=60,
        json={"model": model, "max_tokens": 4, "messages": CHAT},
    )
    assert r.status_code == 503 and r.json()["type"] == "error", r.text
    assert why in r.json()["error"]["message"]


def test_drain_cold0_finishes_in_flight_and_places_nothing_new(daemon):
    # a long tiny-code call is in flight on cold0 (the only instance serving tiny-code) when it drains
    results: dict[str, httpx.Response] = {}
    long = threading.Thread(
        target=lambda: results.setdefault("long", call(daemon, "tiny-code", "s-long", 120))
    )
    long.start()
    deadline = time.monotonic() + 10
    while instance(daemon, "cold0")["running"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert unready_models(daemon) == {}
    refused_without_force(daemon, "instance", "drain", "cold0")
    assert instance(daemon, "cold0")["admission"] == "open"
    drained = ctl_json(daemon, "instance", "drain", "cold0", "--force")
    assert drained["admission"] in ("draining", "drained")
    assert ctl_json(daemon, "instance", "drain", "cold0")["admission"] in (
        "draining",
        "drained",
    )  # idempotent: it takes no new calls already
    # a new tiny-chat call goes to hot0; a new tiny-code call is refused now, not held
    assert served_by(call(daemon, "tiny-chat")) == "hot0"
    assert set(unready_models(daemon)) == {"tiny-code"}
    assert_unavailable_at_once(daemon, "tiny-code", "cold0 is drain")
    long.join(60)
    assert results["long"].status_code == 200 and served_by(results["long"]) == "cold0"
    assert results["long"].json()["usage"]["completion_tokens"] == 120
    deadline = time.monotonic() + 10  # drained once its telemetry shows nothing running
    while instance(daemon, "cold0")["admission"] != "drained" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert instance(daemon, "cold0")["admission"] == "drained"
    assert ctl_json(daemon, "instance", "undrain", "cold0")["admission"] == "open"
    assert unready_models(daemon) == {}
    assert served_by(call(daemon, "tiny-code")) == "cold0"


def test_cordon_keeps_serving_leases(daemon):
    first = call(daemon, "tiny-code", "s-cordon")
    assert served_by(first) == "cold0"
    refused_without_force(daemon, "instance", "cordon", "cold0")
    assert ctl_json(daemon, "instance", "cordon", "cold0", "--force")["admission"] == "cordoned"
    turn2 = call(daemon, "tiny-code", "s-cordon")  # the lease still lands on cold0
    assert served_by(turn2) == "cold0" and turn2.json()["usage"]["talaria"]["route"] == "lease_hit"
    assert set(unready_models(daemon)) == {"tiny-code"}
    assert_unavailable_at_once(daemon, "tiny-code", "cold0 is cordoned")  # no lease: refused
    ctl(daemon, "instance", "undrain", "cold0")


def test_unload_and_load_a_model(daemon):
    assert served_by(call(daemon, "tiny-code")) == "cold0"
    assert instance(daemon, "cold0")["active_model"] == "tiny-code"
    refused_without_force(daemon, "model", "unload", "tiny-code", "--on", "cold0")
    status = ctl_json(daemon, "model", "unload", "tiny-code", "--on", "cold0", "--force")
    assert status["status"] == "unserved" and status["instances"] == []
    assert (
        ctl_json(daemon, "model", "unload", "tiny-code", "--on", "cold0")["instances"] == []
    )  # idempotent
    r = call(daemon, "tiny-code")
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_loaded"
    assert set(unready_models(daemon)) == {"tiny-code"}
    assert instance(daemon, "cold0")["rotation"] == ["tiny-chat"]
    deadline = time.monotonic() + 10  # the idle instance switched away from the unloaded model
    while instance(daemon, "cold0")["active_model"] != "tiny-chat" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert instance(daemon, "cold0")["active_model"] == "tiny-chat"
    # the last model of an instance is not unloaded; an unknown model is refused as such
    last = ctl(daemon, "model", "unload", "tiny-chat", "--on", "cold0", ok=False)
    assert last.returncode == 3 and len(last.stderr.strip().splitlines()) == 1
    assert ctl(daemon, "model", "unload", "nope", "--on", "cold0", ok=False).returncode == 3
    loaded = ctl_json(daemon, "model", "load", "tiny-code", "--on", "cold0")
    assert loaded["instances"] == ["cold0"]
    assert unready_models(daemon) == {}
    assert served_by(call(daemon, "tiny-code")) == "cold0"


def _health_row(d, name: str) -> dict:
    rows = httpx.get(f"{d.endpoint}/health", timeout=10).json()["instances"]
    return next(r for r in rows if r["name"] == name)


def _log_line(d, words: str, timeout_s: float = 30) -> str:
    """The daemon's next output line containing `words`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = d.lines.get(timeout=1)
        except queue.Empty:
            continue
        if words in line:
            return line
    raise AssertionError(f"no log line with {words!r}")


def test_a_stalled_instance_is_unready_at_its_third_failed_poll_not_before(daemon):
    """cold0 stops answering (SIGSTOP): it stays ready through two failed telemetry polls and
    turns unready at the third (policy.unready_after_polls: 3), with a log line; its models'
    calls then get 503 at once."""
    pid = instance(daemon, "cold0")["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        seen = []
        deadline = time.monotonic() + 60
        while (row := _health_row(daemon, "cold0"))["ready"] and time.monotonic() < deadline:
            seen.append(row["failed_polls"])
            time.sleep(0.05)
        assert not row["ready"] and 2 in seen, seen
        assert row["failed_polls"] == 3, (row, seen)
        assert "failed" in _log_line(daemon, "cold0 is not ready")
        assert set(unready_models(daemon)) == {"tiny-code"}
        assert_unavailable_at_once(daemon, "tiny-code", "cold0 is unready")
    finally:
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 30
    while unready_models(daemon) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served_by(call(daemon, "tiny-code")) == "cold0"


def test_lease_revoke(daemon):
    assert served_by(call(daemon, "tiny-code", "s-revoke")) == "cold0"
    leases = [
        le
        for le in ctl_json(daemon, "lease", "list")
        if le["session_id"].split("~")[0] == "s-revoke"
    ]
    assert len(leases) == 1 and isinstance(leases[0]["kv_len"], int)
    assert ctl_json(daemon, "lease", "revoke", "s-revoke") == []
    assert not [
        le
        for le in ctl_json(daemon, "lease", "list")
        if le["session_id"].split("~")[0] == "s-revoke"
    ]
    assert call(daemon, "tiny-code", "s-revoke").json()["usage"]["talaria"]["route"] != "lease_hit"
    unknown = ctl_process(daemon, "lease", "revoke", "s-never-seen")
    assert unknown.returncode == 3 and unknown.stderr.strip().splitlines() == [
        "talaria-ctl: no session 's-never-seen' in the router's table"
    ], unknown.stderr


def test_session_forget_frees_its_kv(daemon):
    first = call(daemon, "tiny-code", "s-forget")
    assert served_by(first) == "cold0"
    again = call(daemon, "tiny-code", "s-forget")
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    forgot = ctl_json(daemon, "session", "forget", "s-forget")
    assert forgot["known"] and "cold0" in forgot["instances_freed"]
    assert all(s["session_id"] != "s-forget" for s in ctl_json(daemon, "session", "list"))
    after = call(daemon, "tiny-code", "s-forget")
    assert after.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    unknown = ctl(daemon, "session", "forget", "s-never-seen", ok=False)
    assert unknown.returncode == 3 and unknown.stderr.strip().splitlines() == [
        "talaria-ctl: no session 's-never-seen' in the router's table or on any instance"
    ], unknown.stderr


def test_session_forget_drops_its_side_call_branches(daemon):
    main = call(daemon, "tiny-code", "s-tree").json()["usage"]["talaria"]["branch"]
    side = httpx.post(  # another system prompt under the same session: a branch of its own
        f"{daemon.endpoint}/v1/chat/completions",
        headers={"x-session-id": "s-tree"},
        timeout=60,
        json={
            "model": "tiny-code",
            "messages": [
                {"role": "system", "content": "Write a five-word title for this conversation."},
                {"role": "user", "content": "hello"},
            ],
            "max_tokens": 4,
        },
    )
    branch = side.json()["usage"]["talaria"]["branch"]
    assert side.status_code == 200 and branch.startswith("s-tree~") and branch != main, side.text
    listed = {s["session_id"] for s in ctl_json(daemon, "session", "list")}
    assert {main, branch} <= listed
    ctl_json(daemon, "session", "forget", "s-tree")
    listed = {s["session_id"] for s in ctl_json(daemon, "session", "list")}
    assert not {s for s in listed if s.startswith("s-tree")}, listed
    again = call(daemon, "tiny-code", "s-tree")
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_session_list_never_shows_more_branches_than_the_bound(daemon):
    """Side calls past `sessions.max_branches` (4) evict the least recently used branch from
    the gateway, the router's table and the instances alike."""
    for n in range(7):
        r = httpx.post(
            f"{daemon.endpoint}/v1/chat/completions",
            headers={"x-session-id": "s-bound"},
            timeout=60,
            json={
                "model": "tiny-code",
                "messages": [
                    {"role": "system", "content": f"Side task number {n} of the agent."},
                    {"role": "user", "content": f"do part {n}"},
                ],
                "max_tokens": 2,
            },
        )
        assert r.status_code == 200, r.text
        listed = [
            s["session_id"]
            for s in ctl_json(daemon, "session", "list")
            if s["session_id"].startswith("s-bound")
        ]
        assert 0 < len(listed) <= 4, listed
    ctl_json(daemon, "session", "forget", "s-bound")
    listed = {s["session_id"] for s in ctl_json(daemon, "session", "list")}
    assert not {s for s in listed if s.startswith("s-bound")}, listed


def test_pool_move_and_back(daemon):
    refused_without_force(daemon, "pool", "move", "cold0", "--to", "hot", "--model", "tiny-code")
    moved = ctl_json(
        daemon, "pool", "move", "cold0", "--to", "hot", "--model", "tiny-code", "--force"
    )
    assert (
        moved["pool"] == "hot" and moved["rotation"] == ["tiny-code"] and moved["state"] == "ready"
    )
    assert moved["admission"] == "open"
    pools = {p["name"]: p for p in ctl_json(daemon, "pool", "list")}
    assert "cold0" in pools["hot"]["instances"] and pools["cold"]["instances"] == []
    assert served_by(call(daemon, "tiny-code")) == "cold0"
    back = ctl_json(daemon, "pool", "move", "cold0", "--to", "cold", "--force")
    assert back["pool"] == "cold" and back["rotation"] == ["tiny-chat", "tiny-code"]
    assert (
        ctl_json(daemon, "pool", "move", "cold0", "--to", "cold")["restarts"] == back["restarts"]
    )  # idempotent
    usage = ctl_process(daemon, "pool", "move", "cold0", "--to", "lukewarm")
    assert usage.returncode == 2 and len(usage.stderr.strip().splitlines()) == 1


def test_pin_and_unpin_on_the_hot_instance(daemon):
    pinned = ctl_json(daemon, "model", "pin", "tiny-code", "--on", "hot0")
    assert pinned["pinned_on"] == ["hot0"] and set(pinned["instances"]) == {"hot0", "cold0"}
    assert instance(daemon, "hot0")["rotation"] == ["tiny-code"]
    assert ctl_json(daemon, "model", "pin", "tiny-code", "--on", "hot0")["pinned_on"] == [
        "hot0"
    ]  # idempotent
    back = ctl_json(daemon, "model", "unpin", "tiny-code", "--on", "hot0")
    assert back["pinned_on"] == [] and instance(daemon, "hot0")["rotation"] == ["tiny-chat"]
    assert ctl(daemon, "model", "unpin", "tiny-chat", "--on", "hot0", ok=False).returncode == 3


def test_config_reload_applies_tau(daemon):
    text = daemon.config_path.read_text()
    assert "tau_s: 2.0" in text
    daemon.config_path.write_text(text.replace("tau_s: 2.0", "tau_s: 30.0"))
    reply = ctl_json(daemon, "config", "reload")
    assert "policy.tau_s" in reply["applied"]
    assert served_by(call(daemon, "tiny-code", "s-tau")) == "cold0"
    lease = next(
        le for le in ctl_json(daemon, "lease", "list") if le["session_id"].split("~")[0] == "s-tau"
    )
    assert lease["expires_in_s"] > 10.0  # τ = 30 s now; it was 2 s
    assert "tau_s: 30.0" in ctl(daemon, "config", "show").stdout
    shown = ctl_json(daemon, "config", "show")  # the config itself, as JSON
    assert (
        shown["policy"]["tau_s"] == 30.0 and shown["listen"]["admin_socket"] == daemon.socket_path
    )
    assert [i["name"] for i in shown["instances"]] == ["hot0", "cold0", "agent0"]
    daemon.config_path.write_text("models: [")
    broken = ctl(daemon, "config", "reload", ok=False)
    assert broken.returncode == 3 and "invalid YAML" in broken.stderr
    daemon.config_path.write_text(text)
    assert "policy.tau_s" in ctl_json(daemon, "config", "reload")["applied"]


def test_restart_instance(daemon):
    before = instance(daemon, "hot0")
    after = ctl_json(daemon, "instance", "restart", "hot0")
    assert (
        after["restarts"] == before["restarts"] + 1
        and after["pid"] != before["pid"]
        and after["state"] == "ready"
    )
    assert served_by(call(daemon, "tiny-chat")) in ("hot0", "cold0")


def test_refusals_are_one_line_exit_3(daemon):
    for args in (("instance", "drain", "ghost"), ("model", "pin", "tiny-code", "--on", "cold0")):
        r = ctl_process(daemon, *args)
        assert (
            r.returncode == 3
            and len(r.stderr.strip().splitlines()) == 1
            and "Traceback" not in r.stderr
        ), args
    for args in (("model", "load", "tiny-chat", "--on", "hot0"), ("instance", "rounds", "ghost")):
        r = ctl(daemon, *args, ok=False)
        assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1, args


def test_rounds_carry_slots_and_switches(daemon):
    data = ctl_json(daemon, "instance", "rounds", "cold0")
    assert data["rounds"] and all(r["instance"] == "cold0" for r in data["rounds"])
    assert all(isinstance(r["index"], int) for r in data["rounds"])  # int64 printed as numbers
    phases = {p["phase"] for r in data["rounds"] for s in r["slots"] for p in s["phases"]}
    assert {"P", "D1"} <= phases
    assert all(abs(r["wall_s"] - r["active_s"] - r["switch_s"]) < 1e-6 for r in data["rounds"])
    sw = data["switches"]
    assert sw and {w["path"] for w in sw} <= {"d2d", "partial", "h2d"}
    assert all(
        w["phases"] == [] and w["staged_bytes"] == -1 for w in sw
    )  # the sim measures no phases
    assert "-" in ctl(daemon, "instance", "rounds", "cold0").stdout


def test_version_and_reflection(daemon):
    out = subprocess.run(
        [sys.executable, "-m", "talaria_ctl.main", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.startswith("talaria-ctl ")
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(f"unix://{daemon.socket_path}") as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        replies = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        names = {s.name for s in next(replies).list_services_response.service}
    assert {"talaria.admin.v1.Admin", "grpc.health.v1.Health"} <= names


FAMILIES = (
    "talaria_switch_duration_seconds",
    "talaria_round_duration_seconds",
    "talaria_round_switch_seconds",
    "talaria_sp_admitted",
    "talaria_sp_parked",
    "talaria_num_requests_waiting",
    "talaria_num_requests_running",
    "talaria_leases_live",
    "talaria_instance_restarts",
    "talaria_http_responses",
)


def test_metrics_parse_and_have_every_family(daemon):
    call(daemon, "tiny-code", "s-metrics")
    time.sleep(1.5)  # the daemon folds round and switch records in once a second
    text = httpx.get(f"{daemon.endpoint}/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    missing = [f for f in FAMILIES if f not in families]
    assert not missing, missing

    def total(name: str, suffix: str = "", **labels) -> float:
        return sum(
            s.value
            for s in families[name].samples
            if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items())
        )

    assert total("talaria_switch_duration_seconds", "_count", instance="cold0") > 0
    assert total("talaria_round_duration_seconds", "_count", instance="cold0") > 0
    assert total("talaria_http_responses", "_total", code="200") > 0
    assert total("talaria_http_responses", "_total", code="503") > 0  # the unloaded model's call
    assert total("talaria_instance_restarts", "_total", instance="cold0") >= 2  # the pool moves
