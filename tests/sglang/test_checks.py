"""check-config for `executor: sglang`: one line per missing piece; the launch flags it derives."""

from __future__ import annotations

import pathlib

import pytest
from typer.testing import CliRunner

from talariad.checks import load_checked, parse_checked
from talariad.cli import app
from talariad.config import ConfigError
from talariad.engine.executors.sglang import checks
from talariad.engine.executors.sglang.client import sampling_params
from talariad.engine.executors.sglang.launcher import server_args, server_env
from talariad.wire.messages import GenerateRequest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "etc" / "examples" / "h200x8.yaml"


def _cfg(**inst) -> dict:
    base = {
        "name": "c0",
        "pool": "cold",
        "executor": "sglang",
        "devices": [0, 1],
        "models": ["a", "b"],
        "sglang": {"launch_command": ["fake"]},
    }
    return {
        "models": [{"name": "a", "path": "ckpt/a"}, {"name": "b", "path": "ckpt/b"}],
        "instances": [{**base, **inst}],
    }


def _lines(data: dict) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_checked(data, "t.yaml")
    return err.value.lines


def test_a_complete_sglang_instance_passes():
    cfg = parse_checked(_cfg(), "t.yaml")
    assert cfg.instances[0].sglang.kv_host == "recompute"


@pytest.mark.parametrize(
    "change, line",
    [
        ({"devices": "cpu"}, "t.yaml: instances[0].devices: the sglang executor runs on GPUs"),
        (
            {"devices": [0, 2]},
            "t.yaml: instances[0].devices: SGLang takes a group as --base-gpu-id and --tp-size",
        ),
        (
            {"sglang": {"url": "http://127.0.0.1:30000"}},
            "t.yaml: instances[0].sglang.url: only a hot instance may use a server the operator runs",
        ),
        (
            {
                "pool": "hot",
                "models": ["a"],
                "sglang": {"launch_command": ["x"], "kv_host": "storage"},
            },
            "t.yaml: instances[0].sglang.kv_host: storage keeps KV across model switches: a cold instance only",
        ),
        (
            {"sglang": {}},
            "t.yaml: instances[0].executor: executor 'sglang' needs the Python package 'sglang', "
            "which is not installed: install the gpu extra",
        ),
    ],
)
def test_each_missing_piece_is_one_line(change, line, monkeypatch):
    monkeypatch.setattr(checks, "sglang_importable", lambda: False)
    lines = _lines(_cfg(**change))
    assert len(lines) == 1 and lines[0].startswith(line), lines


def test_models_need_a_path():
    data = _cfg()
    del data["models"][1]["path"]
    assert _lines(data) == [
        "t.yaml: models[1].path: model 'b' is served by sglang instance 'c0': give the "
        "checkpoint directory SGLang loads (path:)"
    ]


def test_check_config_on_the_h200_example_names_only_the_missing_sglang(monkeypatch):
    monkeypatch.setattr(checks, "sglang_importable", lambda: False)
    result = CliRunner().invoke(app, ["check-config", str(EXAMPLE)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2
    assert all("'sglang', which is not installed" in x and "sglang==0.5.23" in x for x in lines)
    monkeypatch.setattr(checks, "sglang_importable", lambda: True)
    result = CliRunner().invoke(app, ["check-config", str(EXAMPLE)])
    assert result.exit_code == 0, result.stderr
    cfg = load_checked(EXAMPLE)
    assert [len(i.devices) for i in cfg.instances] == [4, 4]


def test_launch_flags_of_hot_and_cold_servers(monkeypatch):
    monkeypatch.setattr(checks, "sglang_importable", lambda: True)
    cfg = load_checked(EXAMPLE)
    hot, cold = cfg.instances
    args = server_args(hot, "qwen3-coder-480b", "/m", 31000, "k")
    assert args[:8] == [
        "--model-path",
        "/m",
        "--served-model-name",
        "qwen3-coder-480b",
        "--host",
        "127.0.0.1",
        "--port",
        "31000",
    ]
    assert ["--tp-size", "4"] == args[8:10] and ["--base-gpu-id", "0"] == args[10:12]
    assert (
        "--enable-memory-saver" not in args
        and args[args.index("--mem-fraction-static") + 1] == "0.88"
    )
    assert args[args.index("--api-key") + 1] == "k" and "--enable-metrics" in args
    cargs = server_args(cold, "glm-4.6", "/g", 31001, "k2")
    assert cargs[cargs.index("--base-gpu-id") + 1] == "4"
    assert {
        "--enable-memory-saver",
        "--enable-weights-cpu-backup",
        "--enable-hierarchical-cache",
    } <= set(cargs)
    assert cargs[cargs.index("--hicache-storage-backend") + 1] == "file"
    assert cargs[cargs.index("--max-total-tokens") + 1] == "1048576"
    assert (
        server_env(cold)["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"]
        == "/dev/shm/talaria-hicache/cold0"
    )
    assert "--cuda-graph-max-bs" not in " ".join(cargs)  # gone in 0.5.23 (reference §0.9)


def test_sampling_params_use_only_keys_sglang_accepts():
    req = GenerateRequest(
        call_id="c",
        model="a",
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        seed=3,
        stop=["\n\n"],
        ignore_eos=True,
    )
    assert sampling_params(req) == {
        "max_new_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["\n\n"],
        "ignore_eos": True,
        "sampling_seed": 3,
    }
    assert sampling_params(req, max_tokens=3)["max_new_tokens"] == 3  # a clamped budget
    from tests.fakes.sglang_engine import SAMPLING_KEYS

    assert set(sampling_params(req)) <= SAMPLING_KEYS
