"""The simulator's command line (`python -m talariad.sim`) and its trace subsets."""

import json

import pytest

from talariad.replay.trace import Trace, write_jsonl
from talariad.sim.__main__ import main, router_subset

from .conftest import growing


def test_router_subset_shape(small_trace):
    sub = router_subset(small_trace, calls=12, sessions=4)
    assert len(sub) == 4 and sub.n_calls == 12


def test_cli_compare_writes_json(tmp_path, capsys):
    trace = Trace([growing("a:q", "qwen3-235b", 3), growing("b:g", "glm5-nvfp4", 3)])
    path = write_jsonl(trace, tmp_path / "t.jsonl")
    out = tmp_path / "r.json"
    rc = main(
        ["compare", "--trace", str(path), "--json", str(out), "--no-progress", "--width", "250"]
    )
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["config"] for r in rows] == [
        "Talaria",
        "no-SP",
        "no-HKVR",
        "H2D-only",
        "Round-only",
        "fair-share",
    ]
    assert all(r["calls"] == 6 for r in rows)
    for field in (
        "sct_p50_s",
        "sct_p95_s",
        "ttft_p50_s",
        "ttft_p95_s",
        "rounds",
        "switch_share",
        "slowdown_p50",
        "slowdown_p95",
        "switches",
    ):
        assert all(field in r for r in rows), field
    assert all(r["slowdown_p50"] >= 1.0 - 1e-9 for r in rows)  # nothing beats its lower bound
    assert "Round-only / Talaria" in capsys.readouterr().out


def test_cli_bad_input_exits_2(tmp_path, capsys):
    assert main(["compare", "--trace", str(tmp_path / "missing.jsonl")]) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"session_id": "x"}\n')
    assert main(["compare", "--trace", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "missing.jsonl" in err and "bad.jsonl:1" in err
    with pytest.raises(SystemExit) as e:
        main(["compare", "--suite", "nope"])
    assert e.value.code == 2


@pytest.mark.parametrize(
    "text, words",
    [
        ("- a\n- b\n", "expected a mapping"),
        ("box: [\n", "invalid YAML"),
        (
            "box: {gpus: 8, tp: 8, hbm_per_gpu_gib: 10, host_memory_gib: 10, switch_ms_pooled: 5}\nmodels: {m: {}}\n",
            "malformed",
        ),
    ],
)
def test_cli_bad_profile_file_is_one_line_exit_2(tmp_path, capsys, text, words):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    assert main(["compare", "--profiles", str(bad), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and str(bad) in err[0]


def test_cli_rejects_a_useless_width(capsys):
    assert main(["compare", "--width", "-5"]) == 2
    assert "--width" in capsys.readouterr().err
