import gzip
import json

import pytest

from talariad.replay.swebv import GapModel, load_swebv
from talariad.replay.trace import TraceError


def _row(sid, idx, prompt, shared, out=50, interval=None, **kw):
    row = {
        "session_id": sid,
        "thread": "main",
        "call_idx": idx,
        "model": "gemini-3-pro-preview",
        "t_req_s": 0,
        "prompt_tokens": prompt,
        "output_tokens": out,
        "reasoning_tokens": 0,
        "visible_output_tokens": out,
        "provider_cached_tokens": 0,
        "shared_prefix_tokens": shared,
        "text_prefix_shared_frac_prev": None if idx == 0 else 1.0,
        "interval_s": interval,
        "gap_s": None,
        "resolved": True,
    }
    return {**row, **kw}


ROWS = [
    _row("a", 0, 1000, 0),
    _row("a", 1, 1500, 1040, interval=5),
    _row("a", 2, 1600, 9999, interval=0),  # shared prefix larger than the prompt: clipped
    _row("b", 0, 800, 0),
    _row("b", 1, 900, 850, interval=30),
    _row("c", 0, 700, 0),
]


def _write(tmp_path, rows, name="calls.jsonl.gz"):
    p = tmp_path / name
    with gzip.open(p, "wt") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return p


def test_loads_sessions_prefix_and_modelled_gaps(tmp_path):
    t = load_swebv(_write(tmp_path, ROWS), seed=7)
    assert [len(s) for s in t] == [3, 2, 1] and t.n_calls == 6
    a = t.session("a")
    assert [c.prefix_tokens for c in a] == [0, 1040, 1600]
    assert [c.output_tokens for c in a] == [50, 50, 50]
    assert a[0].gap_s == 0.0
    assert all(0 < c.gap_s <= 10.0 for s in t for c in s[1:])
    assert a[2].gap_s <= 1.0  # bounded by the logged interval (0 s at 1 s resolution)
    assert load_swebv(_write(tmp_path, ROWS), seed=7) == t  # seeded
    assert load_swebv(_write(tmp_path, ROWS), seed=8) != t


def test_gap_model_is_capped(tmp_path):
    big = GapModel(cap_s=0.25)
    t = load_swebv(_write(tmp_path, ROWS), gap_model=big)
    assert max(c.gap_s for c in t.calls()) <= 0.25


def test_model_map_assign_and_limit(tmp_path):
    p = _write(tmp_path, ROWS)
    assert load_swebv(p, model_map={"gemini-3-pro-preview": "qwen3-235b"}).models() == [
        "qwen3-235b"
    ]
    t = load_swebv(p, assign_models=["x", "y"])
    assert [s[0].model for s in t] == ["x", "y", "x"]
    assert all(c.model == s[0].model for s in t for c in s)
    assert [s[0].session_id for s in load_swebv(p, limit_sessions=2)] == ["a", "b"]


@pytest.mark.parametrize(
    "bad, field",
    [
        ("{oops", None),
        (
            json.dumps({k: v for k, v in _row("d", 0, 10, 0).items() if k != "prompt_tokens"}),
            "prompt_tokens",
        ),
        (json.dumps(_row("d", 0, 10, -3)), "shared_prefix_tokens"),
        (json.dumps(_row("d", 0, -10, 0)), "prompt_tokens"),
        (json.dumps(_row("a", 5, 10, 0)), "call_idx"),
    ],
)
def test_malformed_real_trace_lines(tmp_path, bad, field):
    p = _write(tmp_path, ROWS[:3] + [bad])
    with pytest.raises(TraceError) as err:
        load_swebv(p)
    assert (err.value.line, err.value.field) == (4, field)
    assert str(p) in str(err.value)
