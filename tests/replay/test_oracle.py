import pytest

from talariad.replay.oracle import oracle_bounds, oracle_call_s, oracle_sct
from talariad.replay.trace import Trace, TraceCall
from talariad.types import LatencyProfile

PROF = LatencyProfile(prefill_base_s=0.5, prefill_s_per_token=0.001, decode_step_s=0.02,
                      decode_s_per_seq=0.01)


def test_oracle_by_hand():
    s = [
        TraceCall("s", 0, "m", 1000, 0, 10, 0.0),  # prefill 0.5 + 1.0 (1st token); 9 decodes x 0.03
        TraceCall("s", 1, "m", 1500, 1200, 20, 2.0),  # prefill 0.5 + 0.3; 19 decodes x 0.03
        TraceCall("s", 2, "m", 1600, 1600, 5, 1.0),  # all cached: the last token recomputes; 4 x 0.03
    ]
    expected = (1.5 + 0.27) + (0.8 + 0.57) + (0.501 + 0.12) + 2.0 + 1.0
    assert oracle_sct(s, {"m": PROF}) == pytest.approx(expected)
    assert oracle_sct(s, lambda m: PROF) == pytest.approx(expected)
    assert oracle_call_s(s[1], PROF) == pytest.approx(1.37)
    assert oracle_bounds(Trace([s]), {"m": PROF}) == {"s": pytest.approx(expected)}


def test_oracle_unknown_model_is_a_clear_error():
    with pytest.raises(ValueError, match="'x'"):
        oracle_sct([TraceCall("s", 0, "x", 10, 0, 1, 0.0)], {"m": PROF})
