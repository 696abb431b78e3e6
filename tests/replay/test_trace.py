import gzip
import json

import pytest

from talariad.replay.trace import Trace, TraceCall, TraceError, read_jsonl, write_jsonl


def _trace() -> Trace:
    a = [TraceCall("a", 0, "m1", 100, 0, 10, 0.0), TraceCall("a", 1, "m1", 150, 110, 5, 0.5)]
    b = [TraceCall("b", 0, "m2", 80, 0, 7, 0.0)]
    return Trace([a, b])


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_round_trip(tmp_path, name):
    path = write_jsonl(_trace(), tmp_path / name)
    back = read_jsonl(path)
    assert back == _trace()
    assert back.n_calls == 3 and back.models() == ["m1", "m2"]
    assert [s[0].session_id for s in back.by_model()["m1"]] == ["a"]
    assert back.session("a")[1].new_tokens == 40
    if name.endswith(".gz"):
        assert gzip.open(path, "rt").readline().startswith("{")


def test_interleaved_sessions_group_by_id(tmp_path):
    lines = [_trace().session("a")[0], _trace().session("b")[0], _trace().session("a")[1]]
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(c.to_json() for c in lines) + "\n\n")
    assert read_jsonl(p) == _trace()


GOOD = {
    "session_id": "s",
    "call_idx": 0,
    "model": "m",
    "prompt_tokens": 10,
    "prefix_tokens": 0,
    "output_tokens": 3,
    "gap_s": 0,
}


@pytest.mark.parametrize(
    "line2, field, words",
    [
        ("{not json", None, "invalid JSON"),
        ("[1, 2]", None, "JSON object"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "model"}), "model", "missing"),
        (
            json.dumps({**GOOD, "session_id": "t", "prompt_tokens": "10"}),
            "prompt_tokens",
            "expected int",
        ),
        (json.dumps({**GOOD, "session_id": "t", "call_idx": True}), "call_idx", "expected int"),
        (json.dumps({**GOOD, "session_id": "t", "output_tokens": -1}), "output_tokens", ">= 0"),
        (json.dumps({**GOOD, "call_idx": 1, "gap_s": -0.5}), "gap_s", ">= 0"),
        (json.dumps({**GOOD, "session_id": "t", "prefix_tokens": 11}), "prefix_tokens", "exceeds"),
        (json.dumps({**GOOD, "call_idx": 2, "gap_s": 1}), "call_idx", "expects call_idx 1"),
        (json.dumps({**GOOD, "session_id": "t", "gap_s": 1.5}), "gap_s", "call 0"),
        (json.dumps({**GOOD, "session_id": ""}), "session_id", "empty"),
    ],
)
def test_malformed_line_names_file_line_field(tmp_path, line2, field, words):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(GOOD) + "\n" + line2 + "\n")
    with pytest.raises(TraceError) as err:
        read_jsonl(p)
    e = err.value
    assert isinstance(e, ValueError)
    assert (e.source, e.line, e.field) == (str(p), 2, field)
    assert f"{p}:2" in str(e) and words in str(e)
    if field:
        assert f"'{field}'" in str(e)
