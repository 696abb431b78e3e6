"""`make run-pool` as a newcomer runs it: the Makefile passes its variables to the devpool's command
line, which starts the pool, prints the operators' address `talaria-ctl --epp` reads, answers the
README's curl, serves a Codex turn without cutting its answer, explains a call by the response id
the client saw, and stops every process on Ctrl-C."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from talaria_ctl.main import app as ctl
from talaria_pool.devpool import free_port
from tests.support import agents
from tests.support.pool import needs_envoy

ROOT = Path(__file__).resolve().parents[2]
README_GATEWAY = "127.0.0.1:8080"  # where the README's pool curl sends its call


def make_dry_run(*variables: str) -> str:
    """The devpool command line `make -n run-pool` prints; under `make test` this make is a
    sub-make, which prints its directory unless told not to."""
    run = subprocess.run(
        ["make", "--no-print-directory", "-n", "run-pool", *variables],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = run.stdout.splitlines()
    return next(ln.strip() for ln in reversed(lines) if "talaria_pool.devpool" in ln)


def test_make_run_pool_passes_its_variables_to_the_command_line():
    line = make_dry_run("BOXES=2", "PICKERS=2", "PORT=18080", "OPS_PORT=19090")
    assert line.endswith(
        "-m talaria_pool.devpool --boxes 2 --pickers 2 --port 18080 --ops-port 19090"
    ), line
    assert make_dry_run().endswith("-m talaria_pool.devpool")


def readme_pool_curl() -> str:
    """The curl of the README's pool section, as one shell command."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## A pool of boxes") :]
    lines = section.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("curl "))
    command = []
    for line in lines[start:]:
        command.append(line.rstrip("\\").rstrip())
        if not line.endswith("\\"):
            break
    return " ".join(command)


class RunPool:
    """`python -m talaria_pool.devpool` as a child process, its output read as it comes."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "talaria_pool.devpool", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, wait_s: float = 180) -> None:
        deadline = time.monotonic() + wait_s
        while not any(text in ln for ln in self.lines):
            assert self.proc.poll() is None, "\n".join(self.lines)
            assert time.monotonic() < deadline, "\n".join(self.lines)
            time.sleep(0.1)

    def found(self, pattern: str) -> list[str]:
        return [m.group(1) for ln in self.lines if (m := re.search(pattern, ln))]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(60)
        finally:
            self.reader.join(5)


@pytest.mark.e2e
@needs_envoy
def test_run_pool_answers_the_readme_curl_and_codex_and_explains_by_response_id():
    port = free_port()
    pool = RunPool(
        "--boxes", "2", "--pickers", "2", "--port", str(port), "--epp-port", "0", "--ops-port", "0"
    )
    try:
        pool.wait_for("Ctrl-C stops every process.")
        gateway = f"127.0.0.1:{port}"
        assert pool.found(r"Envoy\s+http://(\S+)") == [gateway]
        operators = pool.found(r"talaria-ctl --epp (\S+)\)")
        assert len(operators) == 2, pool.lines
        assert f"talaria-ctl --epp {operators[0]} status" in "\n".join(pool.lines)

        # the README's curl, as written, but to this pool's port
        curl = readme_pool_curl().replace(README_GATEWAY, gateway)
        assert curl != readme_pool_curl(), "the README's curl names no pool gateway"
        done = subprocess.run(shlex.split(curl), capture_output=True, text=True, timeout=60)
        answer = json.loads(done.stdout)
        assert answer["choices"][0]["message"]["content"], answer
        response_id = answer["id"]
        assert response_id.startswith("chatcmpl-")

        # the picker that decided it explains it by that id
        explained = []
        for ops in operators:
            ask = ["--epp", ops, "call", "explain", response_id, "--json"]
            result = CliRunner().invoke(ctl, ask)
            if result.exit_code == 0:
                explained.append(json.loads(result.stdout))
            else:
                assert result.exit_code == 3 and "no decision" in result.stderr, result.output
        assert len(explained) == 1, explained
        assert explained[0]["instance"] in ("box0", "box1") and explained[0]["candidates"]
        status = CliRunner().invoke(ctl, ["--epp", operators[0], "status", "--json"])
        assert status.exit_code == 0 and len(json.loads(status.stdout)["boxes"]) == 2

        # Codex sends no output limit and fails on an incomplete answer
        outputs = []
        with httpx.Client(base_url=f"http://{gateway}", timeout=60) as client:
            for task in range(6):
                items = [agents.codex_message("user", f"Task {task}: {agents.words(40, task)}")]
                body = agents.codex_body(items, prompt_cache_key=f"run-pool-codex-{task}")
                del body["max_output_tokens"]
                r = client.post("/v1/responses", json=body, headers={"session_id": f"cx{task}"})
                assert r.status_code == 200, r.text
                assert r.json()["status"] == "completed", r.json().get("incomplete_details")
                outputs.append(r.json()["usage"]["output_tokens"])
        assert max(outputs) > 64, outputs  # answers a 64-token default would have cut
    finally:
        code = pool.stop()
    assert code == 0, pool.lines
    assert "run-pool: stopped every process" in pool.lines
