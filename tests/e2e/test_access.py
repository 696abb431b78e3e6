"""API keys on the HTTP endpoint: 401 in each API's error shape, probes stay open, keys rotate on
SIGHUP; `/metrics` on a port of its own (`listen.metrics`)."""

from __future__ import annotations

import signal
import time

import httpx
import pytest
import yaml

from talaria_pool.devpool import free_port
from tests.support.daemon import start_daemon, stop_daemon

pytestmark = pytest.mark.e2e

MSG = {"model": "tiny-chat", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keys")
    (tmp / "keys.txt").write_text("# agents\nsk-first\n\nsk-second\n")
    listen = {"api_keys_file": "keys.txt", "metrics": f"127.0.0.1:{free_port()}"}
    d = start_daemon(tmp, {"listen": listen}, executor="sim")
    yield d
    stop_daemon(d)
    d.notify.close()


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer sk-wrong"}, {"x-api-key": "sk-firs"}]
)
def test_openai_paths_need_a_key(keyed, headers):
    r = httpx.get(f"{keyed.endpoint}/v1/models", headers=headers, timeout=10)
    assert r.status_code == 401
    err = r.json()["error"]
    assert err["code"] == "invalid_api_key" and "Authorization: Bearer" in err["message"]


def test_anthropic_path_answers_in_its_own_shape(keyed):
    r = httpx.post(
        f"{keyed.endpoint}/v1/messages", json=MSG, headers={"x-api-key": "nope"}, timeout=10
    )
    assert r.status_code == 401
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(
    "headers", [{"Authorization": "Bearer sk-first"}, {"x-api-key": "sk-second"}]
)
def test_a_listed_key_is_accepted_either_way(keyed, headers):
    assert (
        httpx.post(
            f"{keyed.endpoint}/v1/messages", json=MSG, headers=headers, timeout=30
        ).status_code
        == 200
    )


def test_probes_stay_open(keyed):
    assert httpx.get(f"{keyed.endpoint}/health", timeout=10).status_code == 200
    assert httpx.get(f"{keyed.endpoint}/ready", timeout=10).status_code == 200


def test_metrics_have_a_port_of_their_own(keyed):
    metrics = yaml.safe_load(keyed.config_path.read_text())["listen"]["metrics"]
    r = httpx.get(f"http://{metrics}/metrics", timeout=10)
    assert r.status_code == 200 and "talaria_" in r.text
    assert httpx.get(f"{keyed.endpoint}/metrics", timeout=10).status_code == 404
    assert httpx.get(f"http://{metrics}/v1/models", timeout=10).status_code == 404  # no API there


def test_keys_rotate_on_sighup(keyed):
    (keyed.config_path.parent / "keys.txt").write_text("sk-third\n")
    keyed.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 20
    while (
        httpx.get(
            f"{keyed.endpoint}/v1/models", headers={"x-api-key": "sk-third"}, timeout=10
        ).status_code
        != 200
    ):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert (
        httpx.get(
            f"{keyed.endpoint}/v1/models", headers={"x-api-key": "sk-first"}, timeout=10
        ).status_code
        == 401
    )
