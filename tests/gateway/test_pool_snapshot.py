"""`GET /pool/snapshot` on a real daemon (sim executor): the token guards it, the body is a
`BoxSnapshot` with every instance's telemetry and every model's profile."""

from __future__ import annotations

import time

import httpx
import pytest

from talariad.wire.box import SNAPSHOT_PATH, BoxSnapshot
from tests.support.daemon import start_daemon, stop_daemon

TOKEN = "pool-secret-1"


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("box")
    (tmp / "pool.token").write_text(f"\n{TOKEN}\n")
    d = start_daemon(tmp, {"pool": {"token_file": "pool.token"}}, executor="sim")
    yield d
    stop_daemon(d)


def _get(box, headers=None, path=SNAPSHOT_PATH):
    return httpx.get(box.endpoint + path, headers=headers or {}, timeout=5)


def test_missing_and_wrong_tokens_get_401_in_the_api_error_shape(box):
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": TOKEN}):
        r = _get(box, headers)
        assert r.status_code == 401
        err = r.json()["error"]
        assert err["code"] == "invalid_api_key" and "pool token" in err["message"]
        assert r.headers["www-authenticate"] == "Bearer"


def test_the_token_gets_every_instance_and_model(box):
    deadline = time.monotonic() + 20
    while True:
        r = _get(box, {"authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200
        snap = BoxSnapshot.model_validate_json(r.content)
        if all(i.healthy for i in snap.instances) and snap.instances:
            break
        assert time.monotonic() < deadline, snap
        time.sleep(0.2)
    health = httpx.get(box.endpoint + "/health", timeout=5).json()
    assert {i.name for i in snap.instances} == {i["name"] for i in health["instances"]}
    for inst in snap.instances:
        assert inst.telemetry.sessions_base is None and inst.age_s >= 0
        assert inst.telemetry.rounds == []
    assert snap.models and all(m.profile.profile().decode_step_s > 0 for m in snap.models)
    again = BoxSnapshot.model_validate_json(_get(box, {"authorization": f"Bearer {TOKEN}"}).content)
    assert again.version > snap.version


def test_no_token_configured_means_no_endpoint(tmp_path):
    d = start_daemon(tmp_path, executor="sim")
    try:
        r = _get(d, {"authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    finally:
        stop_daemon(d)
