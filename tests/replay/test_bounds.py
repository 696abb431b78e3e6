import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talariad.replay.bounds import (
    _least_model_work,
    decode_call_s,
    prefill_call_s,
    rank_bounds,
    single_tenant_bounds,
    single_tenant_s,
)
from talariad.replay.trace import Trace, TraceCall
from talariad.types import LatencyProfile

PROF = LatencyProfile(
    prefill_base_s=0.5, prefill_s_per_token=0.001, decode_step_s=0.02, decode_s_per_seq=0.01
)
FLAT = LatencyProfile(prefill_s_per_token=0.01, decode_step_s=1.0)


def test_single_tenant_time_by_hand():
    s = [
        TraceCall("s", 0, "m", 1000, 0, 10, 0.0),  # prefill 0.5 + 1.0 (1st token); 9 decodes x 0.03
        TraceCall("s", 1, "m", 1500, 1200, 20, 2.0),  # prefill 0.5 + 0.3; 19 decodes x 0.03
        TraceCall(
            "s", 2, "m", 1600, 1600, 5, 1.0
        ),  # all cached: the last token recomputes; 4 x 0.03
    ]
    expected = (1.5 + 0.27) + (0.8 + 0.57) + (0.501 + 0.12) + 2.0 + 1.0
    assert single_tenant_s(s, {"m": PROF}) == pytest.approx(expected)
    assert single_tenant_s(s, lambda m: PROF) == pytest.approx(expected)
    assert prefill_call_s(s[1], PROF) + decode_call_s(s[1], PROF) == pytest.approx(1.37)
    assert single_tenant_bounds(Trace([s]), {"m": PROF}) == {"s": pytest.approx(expected)}


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ValueError, match="'x'"):
        single_tenant_s([TraceCall("s", 0, "x", 10, 0, 1, 0.0)], {"m": PROF})


def one_call(sid: str, model: str, prompt: int, out: int) -> list[TraceCall]:
    return [TraceCall(sid, 0, model, prompt, 0, out, 0.0)]


def test_rank_bounds_overlap_decode_within_a_model_and_never_across_models():
    # each session alone: prefill 1 s + 9 decode steps = 10 s
    same = Trace([one_call(f"a{i}", "A", 100, 10) for i in range(3)])
    # one model: decodes overlap, prefills add up -> 3 prefills + one decode = 12 s for all three
    assert rank_bounds(same, {"A": FLAT}) == pytest.approx([10.0, 11.0, 12.0])
    mixed = Trace([one_call("a", "A", 100, 10), one_call("b", "B", 100, 10)])
    # two models never overlap: finishing both takes 20 s of box time
    assert rank_bounds(mixed, {"A": FLAT, "B": FLAT}) == pytest.approx([10.0, 20.0])


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.floats(0, 10), st.floats(0, 10)), min_size=1, max_size=6))
def test_least_model_work_is_the_minimum_over_every_subset(sessions):
    least = _least_model_work(sessions)
    for j in range(1, len(sessions) + 1):
        brute = min(
            sum(p for p, _ in c) + max(d for _, d in c) for c in itertools.combinations(sessions, j)
        )
        assert least[j] == pytest.approx(brute)
