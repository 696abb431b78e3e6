"""End to end: a daemon whose `sim` instance models a 100B+ model (the `qwen3-235b` profile) serves
chat calls. Its telemetry reports the modelled HBM, so the router's HBM check admits the call
(it used to report 0 bytes free and every call was held as `overload_queue`, reason `hbm`)."""

from __future__ import annotations

import httpx
import pytest

from tests.support.daemon import start_daemon, stop_daemon

pytestmark = pytest.mark.e2e

CONFIG = {
    "models": [
        {"name": "big", "profile": "qwen3-235b", "max_context": 131072},
        {"name": "other", "profile": "glm5-nvfp4", "max_context": 131072},
    ],
    "instances": [
        {
            "name": "c0",
            "pool": "cold",
            "executor": "sim",
            "time_scale": 0.01,
            "models": ["big", "other"],
        }
    ],
    "policy": {"queue_timeout_s": 5.0},
}


def test_a_sim_instance_of_a_large_model_serves_chat_calls(tmp_path):
    d = start_daemon(tmp_path, base=CONFIG)
    try:
        with httpx.Client(base_url=d.endpoint, timeout=30) as client:
            for model in ("big", "other", "big"):
                r = client.post(
                    "/v1/chat/completions",
                    headers={"x-session-id": f"s-{model}"},
                    json={
                        "model": model,
                        "max_tokens": 3,
                        "messages": [{"role": "user", "content": "Fix the test."}],
                    },
                )
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["completion_tokens"] == 3
    finally:
        stop_daemon(d)
        d.notify.close()
