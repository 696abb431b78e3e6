"""The oracle lower bound on a session's completion time.

Each session alone on the box, its model always active, full prefix reuse, no queueing:
SCT_oracle = sum over calls of (prefill of the non-reusable tail + output_tokens x one decode
step at batch 1) + the gaps between calls. Prefill of 0 new tokens costs nothing (the profile's
rule); nothing is restored, switched or queued.
"""

from __future__ import annotations

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


def oracle_call_s(call: TraceCall, prof: LatencyProfile) -> float:
    """Service time of one call alone, charged as every engine runs it: the prefill of the new tail
    (at least one token: a fully cached prompt still recomputes its last token) yields the first
    output token, then one decode step per further token."""
    return prof.prefill_s(max(call.new_tokens, 1)) + max(call.output_tokens - 1, 0) * prof.decode_s(1)


def oracle_sct(session: Session, profiles: ProfileLookup) -> float:
    get = _lookup(profiles)
    service = sum(oracle_call_s(c, get(c.model)) for c in session)
    return service + sum(c.gap_s for c in session[1:])


def oracle_bounds(trace: Trace, profiles: ProfileLookup) -> dict[str, float]:
    """Oracle SCT per session id."""
    return {s[0].session_id: oracle_sct(s, profiles) for s in trace}
