"""The SGLang executor over the fake server (tests/fakes/sglang_server.py), started as the
executor starts `sglang.launch_server`: the config's launch command points at it."""

from __future__ import annotations

import json
import pathlib
import sys

from talariad.config import parse_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "fakes" / "sglang_server.py"


def fake_command(log: pathlib.Path, *extra: str) -> list[str]:
    return [sys.executable, str(FAKE), "--fake-log", str(log), *extra]


def sglang_config(
    model_dir: pathlib.Path,
    log: pathlib.Path,
    *,
    pool: str = "hot",
    models=("m1",),
    extra: tuple[str, ...] = (),
    **sglang,
):
    models_cfg = [
        {"name": m, "path": str(model_dir), "size_gib": 1.0, "max_context": 4096} for m in models
    ]
    inst = {
        "name": f"{pool}0",
        "pool": pool,
        "executor": "sglang",
        "devices": [0],
        "models": list(models),
        "sglang": {"launch_command": fake_command(log, *extra), **sglang},
    }
    return parse_config(
        {
            "models": models_cfg,
            "instances": [inst],
            "supervisor": {"ready_timeout_s": 20, "stop_timeout_s": 3},
        },
        "test.yaml",
    )


def read_log(log: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def check_safe_sequence(events: list[dict]) -> None:
    """Every control request the fakes saw follows the safe swap sequence (reference §7)."""
    state: dict[int, dict] = {}
    for e in events:
        s = state.setdefault(e["port"], {"paused_mode": None, "released": False})
        assert e["event"] != "died", f"a fake server died: {e}"
        if e["event"] == "pause_generation":
            assert e["mode"] == "retract", e
            s["paused_mode"] = e["mode"]
        elif e["event"] == "release_memory_occupation":
            assert s["paused_mode"] == "retract" and e["running"] == 0 and not s["released"], e
            s["released"] = True
        elif e["event"] == "resume_memory_occupation":
            assert s["released"], e
            s["released"] = False
        elif e["event"] == "continue_generation":
            assert not s["released"], e
            s["paused_mode"] = None
        elif e["event"] == "generate":
            assert not s["released"] and s["paused_mode"] is None, (
                f"a call sent to a parked server: {e}"
            )
        elif e["event"] == "start":
            state[e["port"]] = {"paused_mode": None, "released": False}
