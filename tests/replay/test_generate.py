import numpy as np
import pytest

from talariad.perfmodel import dists
from talariad.replay.__main__ import trace_stats
from talariad.replay.generate import PAPER_MODELS, characterization, fixed_replay


@pytest.fixture(scope="module")
def char():
    return characterization(445, seed=0)


def _near(value, target, rel):
    assert abs(value - target) <= rel * target, (value, target)


def test_characterization_matches_section_2_1(char):
    st = trace_stats(char)
    assert st["sessions"] == 445
    _near(st["depth"]["p50"], 11, 0.2)
    _near(st["depth"]["p95"], 49, 0.2)
    _near(st["gap_s"]["p50"], 0.39, 0.1)
    _near(st["gap_s"]["p95"], 1.32, 0.1)
    _near(st["prompt_tokens"]["p50"], 25_000, 0.2)
    _near(st["prompt_tokens"]["p95"], 105_000, 0.25)
    _near(st["reuse_over_half"], 0.968, 0.01)
    assert st["models"] == list(PAPER_MODELS)


def test_prompts_grow_within_sessions(char):
    for s in char:
        assert all(
            b.prompt_tokens > a.prompt_tokens + a.output_tokens - 1
            for a, b in zip(s, s[1:], strict=False)
        )
        assert all(
            c.prefix_tokens <= a.prompt_tokens + a.output_tokens
            for a, c in zip(s, s[1:], strict=False)
        )


def test_generators_are_seeded(char):
    assert characterization(445, seed=0) == char
    assert characterization(445, seed=1) != char
    assert fixed_replay(3) == fixed_replay(3)


def test_fixed_replay_shape_is_exact():
    t = fixed_replay(seed=0)
    assert len(t) == 30 and t.n_calls == 960
    assert {m: len(v) for m, v in t.by_model().items()} == {m: 10 for m in PAPER_MODELS}
    gaps = [c.gap_s for c in t.calls() if c.call_idx > 0]
    assert max(gaps) == dists.REPLAY_GAP_CAP_S
    assert sum(g == dists.REPLAY_GAP_CAP_S for g in gaps) == 20
    issue0 = [t.session(f"astropy-00:{m}") for m in PAPER_MODELS]
    shapes = [[(c.prompt_tokens, c.prefix_tokens, c.output_tokens) for c in s] for s in issue0]
    assert shapes[0] == shapes[1] == shapes[2]  # same calls on every model, gaps differ


def test_lognormal_rejects_bad_quantiles():
    with pytest.raises(ValueError, match="p50"):
        dists.LogNormal(5, 2)


def test_fixed_replay_depths_come_from_the_characterization():
    from talariad.replay.generate import MAX_DEPTH, fixed_depths

    for seed in range(3):
        depths = fixed_depths(np.random.default_rng(seed))
        assert len(depths) == 10 and sum(depths) == 320 and max(depths) <= MAX_DEPTH
    t = fixed_replay(seed=1)
    outs = sorted(c.output_tokens for c in t.calls())
    assert outs[len(outs) // 2] < 1.2 * dists.OUTPUT_TOKENS.p50  # unscaled outputs
    for s in t:  # a context past the limit compacts: a fresh prompt with nothing to reuse
        assert all(c.prompt_tokens <= 200_000 for c in s)
