import dataclasses
import json

import pytest

from talariad.perfmodel.profiles import available, load_profiles, load_set, named_profile
from talariad.replay.__main__ import main
from talariad.types import SwitchPath


def test_a_config_profile_name_resolves_in_whichever_bundled_set_defines_it():
    assert named_profile("tiny") == load_profiles("tiny")["tiny"]
    assert named_profile("qwen3-235b") == load_profiles("paper-tp8")["qwen3-235b"]
    assert named_profile("no-such-model") is None


def test_paper_set_values():
    ps = load_set("paper-tp8")
    assert set(ps.models) == {"qwen3-235b", "glm5-nvfp4", "qwen3.5-122b"}
    assert ps.box.tp == 8 and ps.box.hbm_per_gpu_bytes == 183 * (1 << 30)
    q = ps.models["qwen3-235b"]
    assert q.kv_bytes_per_token_per_gpu == 2 * 94 * 1 * 128 * 2
    assert q.weight_bytes_per_gpu == 235e9 * 2 / 8
    prof = q.profile
    # §2.1 anchor: the slope between the 25K and 100K recompute points
    assert prof.prefill_s(100_000) - prof.prefill_s(25_000) == pytest.approx(10.9 - 4.3)
    assert prof.restore_s_per_token == pytest.approx(48128 / (23.70e9 * 0.5))
    # switch estimates come from the mechanism (App. D Table 2 phases + bytes over the links):
    # fully staged, Qwen3-235B is Table 2's full-D2D total; unstaged, its H2D-only total
    assert prof.switch_s[SwitchPath.D2D] == pytest.approx(0.0355 + 0.0913 + 0.0183, rel=1e-3)
    assert prof.switch_s[SwitchPath.H2D] == pytest.approx(0.0306 + 2.5706, rel=1e-3)
    assert ps.models["glm5-nvfp4"].kv_bytes_per_token_per_gpu == 78 * 576 * 2
    assert ps.models["qwen3.5-122b"].kv_bytes_per_token_per_gpu == 2 * 12 * 1 * 256 * 2
    total_w = sum(m.weight_bytes_per_gpu for m in ps.models.values())
    assert total_w < ps.box.hbm_per_gpu_bytes  # the three models fit one GPU's share together
    for m in ps.models.values():
        p = m.profile
        assert (
            p.switch_s[SwitchPath.D2D] < p.switch_s[SwitchPath.PARTIAL] < p.switch_s[SwitchPath.H2D]
        )
        assert p.open_s == p.switch_s[SwitchPath.H2D] and p.decode_s_per_seq > 0


def test_bad_profile_files_are_clear_errors(tmp_path):
    assert {"paper-tp8", "tiny"} <= set(available())
    with pytest.raises(ValueError, match="unknown profile set"):
        load_set("nope")
    p = tmp_path / "x.yaml"
    p.write_text(
        "box: {gpus: 1, tp: 1, hbm_per_gpu_gib: 1, host_memory_gib: 1}\n"
        "models: {m: {profile: {prefil_s: 1}}}\n"
    )
    with pytest.raises(ValueError, match=r"models.m.profile: unknown field\(s\) \['prefil_s'\]"):
        load_set(str(p))
    p.write_text("box: {gpus: 1}\nmodels: {m: {}}\n")
    with pytest.raises(ValueError, match="box: missing"):
        load_set(str(p))


def test_cli_generate_and_stats(tmp_path, capsys):
    out = tmp_path / "fixed.jsonl"
    assert main(["generate", "fixed", str(out), "--seed", "1"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["calls"] == 960 and stats["sessions"] == 30
    assert main(["stats", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["calls"] == 960
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{}\n")
    assert main(["stats", str(bad)]) == 2
    assert "bad.jsonl:1: field 'session_id': missing" in capsys.readouterr().err


def test_profiles_are_frozen_values():
    prof = load_profiles()["qwen3-235b"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        prof.decode_step_s = 1.0
