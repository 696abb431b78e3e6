"""Usage mistakes in the CLIs: one line on stderr, exit status 2, no traceback."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.proc


@pytest.mark.parametrize(
    "argv, words",
    [
        (["talaria_ctl.main", "--bogus"], "talaria-ctl: No such option: --bogus"),
        (
            ["talaria_ctl.main", "call", "recent", "--limit", "0"],
            "talaria-ctl: Invalid value for '--limit'",
        ),
        (
            ["talariad.cli", "run", "--log-level"],
            "talariad: Option '--log-level' requires an argument.",
        ),
        (["talariad.cli", "frobnicate"], "talariad: No such command 'frobnicate'"),
    ],
)
def test_usage_error_is_one_line_exit_2(argv, words):
    r = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and r.stderr.startswith(words), (
        r.stderr
    )
    assert "Traceback" not in r.stderr + r.stdout
