"""A router `Decision` as operators read it (`talaria-ctl call explain`): the daemon sends it as
the admin API's `Decision` message, the pool's picker as JSON, both from `decision_fields`."""

from __future__ import annotations

import math

from talariad.router import CandidateCost, Decision


def decision_fields(d: Decision, now: float) -> dict:
    """The fields of the admin API's `Decision` message (admin.proto), each candidate a dict of
    `Candidate`'s; numbers as floats, as that message's doubles hold them."""
    return {
        "call_id": d.call_id,
        "kind": d.kind.value,
        "instance": d.instance or "",
        "policy": d.policy,
        "reason": d.reason,
        "age_s": float(max(0.0, now - d.at)),
        "retry_after_s": float(d.retry_after_s or 0.0),
        "candidates": [_candidate(c) for c in d.candidates],
        "session_id": d.session_id or "",
    }


def _candidate(c: CandidateCost) -> dict:
    return {
        "instance": c.instance,
        "queue_s": float(c.queue_s),
        "prefill_s": float(c.prefill_s),
        "decode_s": float(c.decode_s),
        "kv_recovery_s": float(c.kv_recovery_s),
        "activation_s": float(c.activation_s),
        "total_s": float(c.total_s),
        "feasible": bool(c.feasible),
        "reason": c.reason,
        "kv_state": c.kv_state.value,
        "needs_replica": bool(c.needs_replica),
        "replica_s": float(c.replica_s),
        "contention_s": float(c.contention_s),
    }


def decision_json(d: Decision, now: float) -> dict:
    """`decision_fields` as proto3 JSON writes the message (the daemon's JSON, through
    `admin.client.as_dict`): a number JSON has no literal for (an infinite cost) by its name."""
    fields = decision_fields(d, now)
    out = _json_numbers(fields)
    out["candidates"] = [_json_numbers(c) for c in fields["candidates"]]
    return out


def _json_numbers(fields: dict) -> dict:
    return {k: _number(v) if isinstance(v, float) else v for k, v in fields.items()}


def _number(x: float) -> float | str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x
