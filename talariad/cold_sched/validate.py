"""Validation of the scheduler's setup and of submitted calls (ValueError naming the field)."""

from __future__ import annotations

from collections.abc import Mapping

from talariad.types import KVState, LatencyProfile

from .knobs import SchedKnobs
from .messages import SchedCall

MODES = ("pinned", "time_shared")


def validate_setup(profiles: Mapping[str, LatencyProfile], models: list[str], mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} must be one of {MODES}")
    if not models or len(set(models)) != len(models):
        raise ValueError(f"models={models!r} must be a non-empty list of distinct names")
    if mode == "pinned" and len(models) != 1:
        raise ValueError(f"models={models!r}: pinned mode serves exactly one model")
    missing = [m for m in models if m not in profiles]
    if missing:
        raise ValueError(f"profiles has no LatencyProfile for models {missing}")


def validate_call(
    call: SchedCall, models: list[str], knobs: SchedKnobs, live: Mapping[str, object]
) -> None:
    def bad(field: str, why: str) -> ValueError:
        return ValueError(
            f"{type(call).__name__}.{field}={getattr(call, field)!r} (call {call.call_id!r}) {why}"
        )

    if call.call_id in live:
        raise bad("call_id", "is already queued or running")
    if call.model not in models:
        raise bad("model", f"is not served here (models: {models})")
    if call.prompt_tokens < 1:
        raise bad("prompt_tokens", "must be >= 1")
    if call.max_tokens < 1:
        raise bad("max_tokens", "must be >= 1")
    if not 0 <= call.prefix_tokens <= call.prompt_tokens:
        raise bad("prefix_tokens", "must be in [0, prompt_tokens]")
    if not isinstance(call.prefix_state, KVState):
        raise bad("prefix_state", "must be a KVState")
    if call.prompt_tokens + call.max_tokens > knobs.kv_capacity_tokens:
        raise bad(
            "prompt_tokens", f"+ max_tokens exceeds kv_capacity_tokens={knobs.kv_capacity_tokens}"
        )
