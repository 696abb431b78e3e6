"""Seeded synthetic traces: the paper's §2.1 characterization and its §5.1 fixed-replay shape.

Sessions: depth ~ lognormal(p50 11, p95 49); each continuation appends the previous answer and a
tool observation; with probability 0.968 it reuses the whole previous context, else a uniform
fraction in [0, 0.5) of it (§2.1's "96.8% of continuations reuse more than half of the previous
prefix"). Gaps ~ lognormal(p50 0.39 s, p95 1.32 s). Constants and their sources:
`talariad.perfmodel.dists`; design: docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from talariad.perfmodel import dists
from talariad.replay.trace import Session, Trace, TraceCall

PAPER_MODELS = ("qwen3-235b", "glm5-nvfp4", "qwen3.5-122b")
MAX_CONTEXT_TOKENS = 200_000  # smallest context window of the three models (GLM-5: ~202K)


@dataclass(frozen=True, slots=True)
class Shape:
    """One session's call sequence without gaps or model: prompts, prefixes, outputs."""

    prompts: tuple[int, ...]
    prefixes: tuple[int, ...]
    outputs: tuple[int, ...]


def session_shape(
    rng: np.random.Generator,
    depth: int,
    output: dists.LogNormal = dists.OUTPUT_TOKENS,
    compact: bool = False,
) -> Shape:
    """A growing-context session of up to `depth` calls; at MAX_CONTEXT_TOKENS it ends early (the
    agent stops at its context limit, as mini-swe-agent does) or, with `compact`, starts a fresh
    context (a new first prompt with no reusable prefix, as Claude Code's auto-compaction does)."""
    prompts = [min(dists.FIRST_PROMPT.sample_int(rng), MAX_CONTEXT_TOKENS // 2)]
    prefixes, outputs = [0], [output.sample_int(rng)]
    while len(prompts) < depth:
        context = prompts[-1] + outputs[-1]
        prompt = context + dists.OBSERVATION.sample_int(rng)
        if prompt > MAX_CONTEXT_TOKENS:
            if not compact:
                break
            prompts.append(min(dists.FIRST_PROMPT.sample_int(rng), MAX_CONTEXT_TOKENS // 2))
            prefixes.append(0)
            outputs.append(output.sample_int(rng))
            continue
        prefixes.append(_reused(rng, context))
        prompts.append(prompt)
        outputs.append(output.sample_int(rng))
    return Shape(tuple(prompts), tuple(prefixes), tuple(outputs))


def _reused(rng: np.random.Generator, context: int) -> int:
    if rng.random() < dists.REUSE_OVER_HALF:
        return context
    return int(context * rng.uniform(0.0, 0.5))


def realize(shape: Shape, session_id: str, model: str, gaps: Sequence[float]) -> Session:
    """Calls of one model-session; gaps[k] precedes call k (gaps[0] is ignored)."""
    return [
        TraceCall(session_id, k, model, p, x, o, 0.0 if k == 0 else float(gaps[k]))
        for k, (p, x, o) in enumerate(
            zip(shape.prompts, shape.prefixes, shape.outputs, strict=False)
        )
    ]


def draw_gaps(rng: np.random.Generator, n: int, cap_s: float | None = None) -> list[float]:
    gaps = [float(g) for g in dists.TOOL_GAP_S.sample(rng, n)]
    return gaps if cap_s is None else [min(g, cap_s) for g in gaps]


def characterization(
    n_sessions: int = 445, seed: int = 0, models: Sequence[str] = PAPER_MODELS
) -> Trace:
    """§2.1-shaped trace: 445 sessions by default (the paper's count); session i uses
    models[i % len(models)]."""
    if n_sessions < 1 or not models:
        raise ValueError("characterization needs n_sessions >= 1 and at least one model")
    rng = np.random.default_rng(seed)
    sessions = []
    for i in range(n_sessions):
        shape = session_shape(rng, dists.DEPTH.sample_int(rng))
        gaps = draw_gaps(rng, len(shape.prompts))
        sessions.append(realize(shape, f"s{i:04d}", models[i % len(models)], gaps))
    return Trace(sessions)


# §5.1 / App. A: ten issues, each replayed once on each of three models, 960 calls in total,
# closed loop, gaps capped at 10 s, and the cap affects 20 of the 960 calls.
FIXED_ISSUES = 10
FIXED_CALLS = 960
FIXED_CAPPED = 20
# The paper gives no per-issue depth, only the characterization's (§2.1: p50 11, p95 49, max 187)
# and the replay's total (960 calls = 320 per model). Depths are ten draws from the §2.1 depth
# distribution (truncated at its maximum) conditioned on summing to exactly 320: rejection sampling,
# so the set is one the characterization could have produced, not rescaled to the total. Outputs
# follow `dists.OUTPUT_TOKENS` unscaled (the paper publishes no output lengths); a session that
# reaches the context limit compacts (`session_shape(compact=True)`).
MAX_DEPTH = 187
_DRAWS = 20_000  # candidate depth sets per rejection batch


def fixed_depths(rng: np.random.Generator, n: int = FIXED_ISSUES, total: int = FIXED_CALLS // 3):
    """`n` depths drawn from §2.1's depth distribution, conditioned on summing to `total`."""
    for _ in range(1000):
        draws = np.maximum(np.rint(dists.DEPTH.sample(rng, (_DRAWS, n))), 1).astype(int)
        ok = (draws.sum(axis=1) == total) & (draws.max(axis=1) <= MAX_DEPTH)
        hit = np.flatnonzero(ok)
        if hit.size:
            return [int(d) for d in draws[hit[0]]]
    raise ValueError(f"no {n} depths from the §2.1 distribution sum to {total}")


def fixed_replay(seed: int = 0, models: Sequence[str] = PAPER_MODELS) -> Trace:
    """The fixed-replay shape: issue i has the same call sequence (prompts, prefixes, outputs)
    on every model, with per-model-session gaps; exactly FIXED_CAPPED gaps hit the 10 s cap."""
    if FIXED_CALLS % len(models):
        raise ValueError(f"{FIXED_CALLS} calls cannot split evenly over {len(models)} models")
    rng = np.random.default_rng(seed)
    depths = fixed_depths(rng, FIXED_ISSUES, FIXED_CALLS // len(models))
    shapes = [session_shape(rng, d, compact=True) for d in depths]
    gaps = _capped_gaps(rng, [len(s.prompts) for s in shapes for _ in models])
    sessions, g = [], iter(gaps)
    for i, shape in enumerate(shapes):
        for model in models:
            sessions.append(realize(shape, f"astropy-{i:02d}:{model}", model, next(g)))
    return Trace(sessions)


def _capped_gaps(rng: np.random.Generator, depths: list[int]) -> list[list[float]]:
    """Gaps per model-session; FIXED_CAPPED continuation gaps are drawn from the tail above the
    cap (recorded gaps of 10-60 s) and so replay as exactly 10 s, the rest from the §2.1 model."""
    cap = dists.REPLAY_GAP_CAP_S
    per = [draw_gaps(rng, d, cap_s=cap - 1e-3) for d in depths]
    slots = [(s, k) for s, d in enumerate(depths) for k in range(1, d)]
    for j in rng.choice(len(slots), FIXED_CAPPED, replace=False):
        s, k = slots[j]
        per[s][k] = min(float(rng.uniform(cap, 6 * cap)), cap)
    return per
