"""`talariad epp`'s config errors (one line each, exit 2, no traceback) and `talaria-ctl --epp`
reading the picker's status and explanations."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from talaria_ctl import epp as epp_ctl
from talaria_ctl.main import app as ctl
from talariad.cli import app
from talariad.config import LimitsConfig
from talariad.epp.admin import admin_app
from talariad.epp.config import GATEWAY_STATS, EPPConfig
from talariad.epp.contract import ImmediateAnswer
from talariad.epp.discovery.file import parse_boxes
from talariad.epp.metrics import EPPMetrics
from talariad.epp.run import build_picker
from tests.epp.test_boxpicker import Session, _picker, _turn

GOOD = {"discovery": {"static": {"file": "boxes.yaml"}}, "token_file": "pool.token"}


def _epp(tmp_path, data) -> CliRunner:
    (tmp_path / "epp.yaml").write_text(yaml.safe_dump(data))
    return CliRunner().invoke(app, ["epp", "--config", str(tmp_path / "epp.yaml")])


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"token_file": "absent.token"}, "token_file: cannot read"),
        ({"discovery": {}}, "exactly one of 'static' or 'kubernetes'"),
        ({"discovery": {"kubernetes": {"pool": ""}}}, "discovery.kubernetes.pool"),
        ({"router": {"tau": 1}}, "router: Value error, unknown knob 'tau'"),
        ({"router": {"gamma": 2}}, "gamma must satisfy"),
        ({"poll_interval_s": 0}, "poll_interval_s"),
        ({"max_body_bytes": 10}, "max_body_bytes: Input should be greater than or equal to 1024"),
        ({"body_timeout_s": 0}, "body_timeout_s: Input should be greater than 0"),
        ({"listen": "nowhere"}, "listen: Value error, expected host:port"),
        ({"max_streams": 0}, "max_streams: Input should be greater than or equal to 1"),
        (
            {"conversation_bytes": 4096},
            "conversation_bytes: Input should be greater than or equal to 1048576",
        ),
        ({"body_buffer_bytes": 4096}, "body_buffer_bytes (4096) must be at least max_body_bytes"),
        ({"colour": "blue"}, "colour: unknown key"),
        ({"tls": {"cert_file": "c.pem", "key_file": "k.pem"}}, "tls.cert_file: cannot read"),
        (
            {"tls": {"cert_file": "pool.token", "key_file": "pool.token", "client_ca_file": "x"}},
            "tls.client_ca_file: cannot read",
        ),
    ],
)
def test_a_bad_config_is_one_line_and_exit_2(tmp_path, change, says):
    (tmp_path / "pool.token").write_text("t0k\n")
    result = _epp(tmp_path, {**GOOD, **change})
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert any(says.replace("Value error, ", "") in ln for ln in lines), lines
    assert all(ln.startswith("talariad: ") for ln in lines) and "Traceback" not in result.stderr


def test_the_pickers_body_limits_default_to_the_boxes():
    cfg, box = EPPConfig.model_validate(GOOD), LimitsConfig()
    assert (cfg.max_body_bytes, cfg.body_timeout_s) == (box.max_body_bytes, box.body_timeout_s)


def test_what_the_picker_keeps_of_conversations_is_configured():
    """Both stores of sessions' conversations take the configured bound (default 256 MB)."""
    default = build_picker(EPPConfig.model_validate(GOOD))
    assert default.branches.max_bytes == default.reader.max_bytes == 256 << 20
    picker = build_picker(EPPConfig.model_validate({**GOOD, "conversation_bytes": 8 << 30}))
    assert picker.branches.max_bytes == picker.reader.max_bytes == 8 << 30


def test_the_picker_listens_on_loopback_unless_configured():
    assert EPPConfig.model_validate(GOOD).listen.startswith("127.0.0.1:")


def test_an_empty_token_file_is_refused(tmp_path):
    (tmp_path / "pool.token").write_text("\n")
    result = _epp(tmp_path, GOOD)
    assert result.exit_code == 2 and "holds no token" in result.stderr


def test_unreadable_yaml_is_one_line(tmp_path):
    (tmp_path / "epp.yaml").write_text("listen: [\n")
    result = CliRunner().invoke(app, ["epp", "--config", str(tmp_path / "epp.yaml")])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1


@pytest.fixture
def served(monkeypatch):
    picker = _picker()
    session = Session("s1")
    _turn(picker, session, 0.1)
    metrics = EPPMetrics()
    metrics.refused(ImmediateAnswer(429, b"{}", {}, "pool_full"))  # the pool was full once
    client = TestClient(admin_app(picker, metrics.registry))
    monkeypatch.setattr(epp_ctl.httpx, "get", lambda url, timeout: client.get(url))
    monkeypatch.setattr("talariad.epp.admin.time.monotonic", lambda: 0.2)
    return picker


def test_ctl_status_lists_the_boxes(served):
    result = CliRunner().invoke(ctl, ["--epp", "127.0.0.1:9090", "status", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {b["name"] for b in data["boxes"]} == {"a", "b"}
    assert sum(b["sessions"] for b in data["boxes"]) == 1 and data["decisions_per_s"] > 0
    assert all(b["state"] == "healthy" for b in data["boxes"])
    assert data["refusals"][0] == {"status": 429, "code": "pool_full", "count": 1}
    assert {(r["status"], r["code"]) for r in data["refusals"]} >= {(408, "request_timeout")}
    assert all(b["capacity"] == 504 for b in data["boxes"])  # 512 connections, 8 kept
    table = CliRunner().invoke(ctl, ["--epp", "127.0.0.1:9090", "status"])
    assert table.exit_code == 0 and "10.0.0.1:8000" in table.stdout
    assert "refused: 1 x 429 pool_full" in table.stdout


def test_ctl_call_explain_shows_every_box_weighed(served):
    result = CliRunner().invoke(ctl, ["--epp", "x:1", "call", "explain", "s1-1", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["instance"] in ("a", "b") and {c["instance"] for c in data["candidates"]} == {
        "a",
        "b",
    }
    missing = CliRunner().invoke(ctl, ["--epp", "x:1", "call", "explain", "nope"])
    assert missing.exit_code == 3 and "no decision" in missing.stderr
    other = CliRunner().invoke(ctl, ["--epp", "x:1", "lease", "list"])
    assert other.exit_code == 2 and "status and call explain" in other.stderr
    recent = CliRunner().invoke(ctl, ["--epp", "x:1", "call", "recent"])
    assert recent.exit_code == 3 and "status and call explain" in recent.stderr


@pytest.mark.parametrize("prefix", ["chatcmpl-", "msg_", "resp_", "cmpl-"])
def test_ctl_call_explain_takes_the_response_id_the_client_saw(served, prefix):
    # the box answered the picker's call "s1-1" under its own call id (its x-talaria-call-id)
    served.served("s1-1", served.endpoints["a"], 200, 0.12, box_call_id="0badc0ffee")
    ask = ["--epp", "x:1", "call", "explain", f"{prefix}0badc0ffee", "--json"]
    result = CliRunner().invoke(ctl, ask)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["call_id"] == "s1-1"
    unknown = CliRunner().invoke(ctl, ["--epp", "x:1", "call", "explain", f"{prefix}feed"])
    assert unknown.exit_code == 3 and "no decision" in unknown.stderr


def test_the_example_pool_config_and_its_boxes_parse():
    """etc/examples/epp.yaml is what the README points operators at: it must stay valid."""
    examples = Path(__file__).resolve().parents[2] / "etc" / "examples"
    cfg = EPPConfig.model_validate(yaml.safe_load((examples / "epp.yaml").read_text()))
    assert cfg.discovery.static is not None
    boxes = parse_boxes((examples / cfg.discovery.static.file).read_text())
    assert [b.name for b in boxes.values()] == ["box0", "box1"]


def test_ctl_status_shows_what_the_gateway_did_without_the_picker(served, monkeypatch):
    stats = "cluster.pool_fallback.upstream_rq_total: 3\nhttp.gateway.ext_proc.streams_failed: 0\n"
    asked = []
    to_picker = epp_ctl.httpx.get

    def get(url, timeout):
        if "/stats" in url:
            asked.append(httpx.URL(url).params["filter"])
            return httpx.Response(200, text=stats, request=httpx.Request("GET", url))
        return to_picker(url, timeout=timeout)

    monkeypatch.setattr(epp_ctl.httpx, "get", get)
    argv = ["--epp", "127.0.0.1:9090", "status", "--gateway", "127.0.0.1:9901"]
    result = CliRunner().invoke(ctl, [*argv, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["gateway"] == {
        "cluster.pool_fallback.upstream_rq_total": 3,
        "http.gateway.ext_proc.streams_failed": 0,
    }
    assert asked == [GATEWAY_STATS]
    table = CliRunner().invoke(ctl, argv)
    assert "gateway at 127.0.0.1:9901: cluster.pool_fallback.upstream_rq_total 3" in table.stdout
    alone = CliRunner().invoke(ctl, ["status", "--gateway", "127.0.0.1:9901"])
    assert alone.exit_code == 2 and "--gateway goes with --epp" in alone.stderr
