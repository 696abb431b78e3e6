"""Lower bounds on session completion that hold on one multiplexed box (§5 comparisons).

- `single_tenant_s`: a session alone on the box, its model always active, full prefix reuse, no
  queueing (prefills of the new tails, decode steps at batch 1, the gaps).
- `rank_bounds`: when all sessions start together, no schedule finishes k of them before the
  slowest of them alone nor before the box has done their work (one model at a time, §3.4),
  both minimised over every k-subset.
A slowdown is SCT over the larger of the session's time alone and its rank's bound.
Design: docs/internals.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from talariad.replay.trace import Session, Trace, TraceCall
from talariad.types import LatencyProfile

ProfileLookup = Callable[[str], LatencyProfile] | Mapping[str, LatencyProfile]


def _lookup(profiles: ProfileLookup) -> Callable[[str], LatencyProfile]:
    if callable(profiles):
        return profiles
    return lambda model: _get(profiles, model)


def _get(profiles: Mapping[str, LatencyProfile], model: str) -> LatencyProfile:
    if model not in profiles:
        raise ValueError(f"no latency profile for model {model!r} (have {sorted(profiles)})")
    return profiles[model]


def prefill_call_s(call: TraceCall, prof: LatencyProfile) -> float:
    """The prefill of the new tail (at least one token: a fully cached prompt still computes its
    last one), which yields the first output token."""
    return prof.prefill_s(max(call.new_tokens, 1))


def decode_call_s(call: TraceCall, prof: LatencyProfile) -> float:
    return max(call.output_tokens - 1, 0) * prof.decode_s(1)


def single_tenant_s(session: Session, profiles: ProfileLookup) -> float:
    get = _lookup(profiles)
    service = sum(prefill_call_s(c, get(c.model)) + decode_call_s(c, get(c.model)) for c in session)
    return service + sum(c.gap_s for c in session[1:])


def single_tenant_bounds(trace: Trace, profiles: ProfileLookup) -> dict[str, float]:
    """Single-tenant time per session id."""
    return {s[0].session_id: single_tenant_s(s, profiles) for s in trace}


def rank_bounds(trace: Trace, profiles: ProfileLookup) -> list[float]:
    """bounds[k - 1]: no schedule of sessions that start together finishes k of them sooner."""
    get = _lookup(profiles)
    alone = sorted(single_tenant_bounds(trace, profiles).values())
    work: dict[str, list[tuple[float, float]]] = {}
    for s in trace:
        prof = get(s[0].model)
        work.setdefault(s[0].model, []).append(
            (sum(prefill_call_s(c, prof) for c in s), sum(decode_call_s(c, prof) for c in s))
        )
    box = _least_box_work(list(work.values()), len(trace))
    return [max(alone[k - 1], box[k]) for k in range(1, len(trace) + 1)]


def _least_box_work(models: list[list[tuple[float, float]]], n: int) -> list[float]:
    """best[k]: the least box time over every k-subset (a knapsack over models of each model's
    least work for j of its sessions)."""
    best = [0.0] + [math.inf] * n
    for sessions in models:
        per_j = _least_model_work(sessions)
        best = [
            min(best[k - j] + per_j[j] for j in range(min(k, len(sessions)) + 1))
            for k in range(n + 1)
        ]
    return best


def _least_model_work(sessions: list[tuple[float, float]]) -> list[float]:
    """least[j]: min over j-subsets of (sum of prefills + the longest decode)."""
    by_decode = sorted(sessions, key=lambda pd: pd[1])
    least = [0.0] + [math.inf] * len(sessions)
    for i, (prefill, decode) in enumerate(by_decode):  # session i has the longest decode
        others = sorted(p for p, _ in by_decode[:i])
        total = prefill + decode
        least[1] = min(least[1], total)
        for j, p in enumerate(others, start=2):
            total += p
            least[j] = min(least[j], total)
    return least
