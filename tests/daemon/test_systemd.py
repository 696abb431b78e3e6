"""The service unit: `make unit PREFIX=...` makes ExecStart real, `systemd-analyze verify` is clean,
and the hardening scores in systemd's OK band (exposure <= 4.0)."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.proc,
    pytest.mark.skipif(
        shutil.which("systemd-analyze") is None or shutil.which("make") is None,
        reason="systemd-analyze (Debian package systemd) or make is not installed",
    ),
]


@pytest.fixture(scope="module")
def unit(tmp_path_factory) -> pathlib.Path:
    tmp = tmp_path_factory.mktemp("unit")
    prefix, unitdir = tmp / "prefix", tmp / "units"
    (prefix / "bin").mkdir(parents=True)
    exe = prefix / "bin" / "talariad"  # what `make install` puts there: the venv's console script
    exe.write_text('#!/bin/sh\nexec python3 -m talariad.cli "$@"\n')
    exe.chmod(0o755)
    subprocess.run(
        ["make", "-s", "unit", f"PREFIX={prefix}", f"UNITDIR={unitdir}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=60,
    )
    return unitdir / "talariad.service"


def test_exec_start_points_into_prefix(unit):
    text = unit.read_text()
    start = re.search(r"^ExecStart=(\S+)", text, re.M).group(1)
    assert start == str(unit.parent.parent / "prefix" / "bin" / "talariad")
    assert re.search(r"^ExecReload=/bin/kill -HUP \$MAINPID$", text, re.M)
    assert re.search(r"^RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6$", text, re.M)
    allowed = re.findall(r"^DeviceAllow=(\S+)", text, re.M)
    assert allowed and all(d.startswith("char-nvidia") for d in allowed)


def test_systemd_analyze_verify_is_clean(unit):
    r = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr


def test_security_exposure_is_in_the_ok_band(unit):
    r = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    m = re.search(r"Overall exposure level for talariad\.service: ([\d.]+)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= 4.0
