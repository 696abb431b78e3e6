"""check-config on the planner section: what an automatic planner could not run safely is refused
with one line naming the field; advise (the default) and off keep accepting the same files."""

from __future__ import annotations

import pathlib

import pytest
import yaml
from typer.testing import CliRunner

from talariad.cli import app
from tests.support.daemon import tiny_default


def check(tmp_path: pathlib.Path, data: dict):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(data))
    return CliRunner().invoke(app, ["check-config", str(path)]), path


def base(mode: str) -> dict:
    data = tiny_default()
    for inst in data["instances"]:
        inst["executor"] = "sim"
    data["planner"] = {"mode": mode}
    return data


def unhosted(d: dict) -> None:
    d["models"].append({"name": "orphan", "profile": "tiny"})


def shared_device(d: dict) -> None:
    d["instances"][0]["devices"] = [0, 1]
    d["instances"][1]["devices"] = [1, 2]


@pytest.mark.parametrize(
    "mutate, field, words",
    [
        (shared_device, "instances[1].devices", "device 1 is also 'hot0'"),
    ],
)
def test_auto_refuses_what_it_could_not_run_safely(tmp_path, mutate, field, words):
    data = base("auto")
    mutate(data)
    result, path = check(tmp_path, data)
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"talariad: {path}: {field}: "), lines
    assert words in lines[0]
    data["planner"]["mode"] = "advise"  # proposals only: the same file is fine
    assert check(tmp_path, data)[0].exit_code == 0


def test_a_model_without_an_instance_is_refused(tmp_path):
    data = base("auto")
    unhosted(data)
    result, path = check(tmp_path, data)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"talariad: {path}: models[3].name: no instance serves 'orphan'")


def test_fixed_must_name_an_instance(tmp_path):
    data = base("advise")
    data["planner"]["fixed"] = ["hot9"]
    result, _ = check(tmp_path, data)
    assert result.exit_code == 2
    assert "planner.fixed: 'hot9' is not an instance" in result.stderr


def test_bad_mode_is_one_line(tmp_path):
    result, _ = check(tmp_path, base("sometimes"))
    assert result.exit_code == 2 and "planner.mode" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
