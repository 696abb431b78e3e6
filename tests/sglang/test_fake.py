"""The fake SGLang server keeps the rules it is trusted for (reference §0): each way a real server
dies kills the fake too, pause modes behave as documented, /v1/loads reflects its queues."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import httpx
import pytest

from talariad.engine.executors.sglang.launcher import free_port
from tests.support.sglang import fake_command, read_log

pytestmark = pytest.mark.proc


class Fake:
    def __init__(self, model_dir, log, *extra):
        self.port = free_port()
        self.log = log
        argv = fake_command(
            log,
            "--model-path",
            str(model_dir),
            "--port",
            str(self.port),
            "--fake-token-s",
            "0.02",
            *extra,
        )
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10)

    def ready(self) -> None:
        for _ in range(200):
            try:
                if self.http.get("/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("fake did not start")

    def post(self, path: str, body: dict):
        return self.http.post(path, json=body)

    def fatal(self, path: str, body: dict) -> str | None:
        """A request the fake should die of: why it died (None: it did not)."""
        _swallow(lambda: self.post(path, body))
        return self.died()

    def generate_in_background(self, max_new_tokens: int = 500) -> threading.Thread:
        body = {"input_ids": [300, 301, 302], "sampling_params": {"max_new_tokens": max_new_tokens}}
        t = threading.Thread(
            target=lambda: _swallow(lambda: self.post("/generate", body)), daemon=True
        )
        t.start()
        return t

    def loads(self) -> dict:
        return self.http.get("/v1/loads").json()["loads"][0]

    def wait_running(self, n: int) -> None:
        for _ in range(200):
            if self.loads()["num_running_reqs"] == n:
                return
            time.sleep(0.02)
        raise AssertionError(f"never {n} running: {self.loads()}")

    def died(self) -> str | None:
        self.proc.wait(10)
        return next((e["why"] for e in read_log(self.log) if e["event"] == "died"), None)

    def close(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _swallow(fn):
    try:
        fn()
    except httpx.HTTPError:
        pass


@pytest.fixture
def fakes(model_dir, tmp_path):
    made = []

    def make(*extra):
        f = Fake(model_dir, tmp_path / f"f{len(made)}.jsonl", "--enable-memory-saver", *extra)
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()


def test_each_crash_rule_kills_the_fake(fakes):
    busy, twice, unreleased, unpaused, in_place = (fakes() for _ in range(5))
    for f in (busy, twice, unreleased, unpaused, in_place):
        f.ready()
    busy.generate_in_background()
    busy.wait_running(1)
    assert "idle" in busy.fatal("/release_memory_occupation", {})

    in_place.generate_in_background()
    in_place.wait_running(1)
    in_place.post("/pause_generation", {"mode": "in_place"})
    # in_place keeps the running batch: the idle assert fires
    assert "idle" in in_place.fatal("/release_memory_occupation", {})

    twice.post("/pause_generation", {"mode": "retract"})
    assert twice.post("/release_memory_occupation", {}).status_code == 200
    assert "not active" in twice.fatal("/release_memory_occupation", {"tags": ["weights"]})

    assert "KeyError" in unreleased.fatal("/resume_memory_occupation", {})

    unpaused.post("/pause_generation", {"mode": "retract"})
    unpaused.post("/release_memory_occupation", {})
    unpaused.post("/continue_generation", {})  # continued without a resume
    unpaused.generate_in_background(2)
    assert "released memory" in unpaused.died()


def test_retract_pauses_queues_and_continues(fakes):
    f = fakes()
    f.ready()
    f.generate_in_background(60)
    f.wait_running(1)
    assert f.post("/pause_generation", {"mode": "retract"}).json()["status"] == "ok"
    assert f.loads()["num_running_reqs"] == 0 and f.loads()["num_waiting_reqs"] == 1
    assert f.http.get("/ready").status_code == 503
    assert (
        f.post("/release_memory_occupation", {}).status_code == 200
    )  # idle but for the paused queue
    assert f.post("/resume_memory_occupation", {}).status_code == 200
    f.post("/continue_generation", {})
    f.wait_running(1)
    r = f.post(
        "/generate", {"input_ids": [300, 301, 302, 303], "sampling_params": {"max_new_tokens": 2}}
    )
    # the radix tree was flushed by the release, the retracted call re-entered it on re-prefill
    assert r.json()["meta_info"]["cached_tokens"] == 3
    assert f.proc.poll() is None


def test_abort_mode_ends_running_requests(fakes):
    f = fakes()
    f.ready()
    out = {}
    body = {"input_ids": [300, 301], "sampling_params": {"max_new_tokens": 500}}
    t = threading.Thread(target=lambda: out.setdefault("r", f.post("/generate", body)), daemon=True)
    t.start()
    f.wait_running(1)
    f.post("/pause_generation", {"mode": "abort"})
    t.join(10)
    assert out["r"].json()["meta_info"]["finish_reason"]["type"] == "abort"
    assert f.loads()["num_running_reqs"] == 0


def test_the_fake_rejects_what_sglang_rejects(fakes, model_dir, tmp_path):
    f = fakes("--api-key", "sekrit")
    f.ready()  # /health is open
    assert f.post("/generate", {"input_ids": [1, 2]}).status_code == 401
    f.http.headers["Authorization"] = "Bearer sekrit"
    bad = f.post("/generate", {"input_ids": [1, 2], "sampling_params": {"max_tokens": 3}})
    assert bad.status_code == 400 and "max_tokens" in bad.text
    unknown_flag = subprocess.run(
        fake_command(tmp_path / "x.jsonl", "--model-path", str(model_dir), "--tp", "4"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert unknown_flag.returncode == 2 and "--tp" in unknown_flag.stderr  # no abbreviations
    stream = f.http.post(
        "/generate",
        json={
            "rid": "r1",
            "input_ids": [300, 301],
            "stream": True,
            "sampling_params": {"max_new_tokens": 3},
        },
    )
    chunks = [json.loads(x[6:]) for x in stream.text.splitlines() if x.startswith("data: {")]
    assert len(chunks) == 3 and chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert stream.text.rstrip().endswith("data: [DONE]") and chunks[0]["meta_info"]["id"] == "r1"
