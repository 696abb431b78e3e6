"""Typed messages between a driver (engine worker or simulator) and the cold-pool scheduler core."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from talariad.types import KVState, SwitchPath


class SchedCall(Protocol):
    """What the scheduler reads of a submitted call, and never changes: a `SubmittedCall`, or the
    instance core's own `InstanceCall` (the core hands its record over instead of a copy)."""

    @property
    def call_id(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def prefix_tokens(self) -> int: ...
    @property
    def prefix_state(self) -> KVState: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def arrived_at(self) -> float: ...
    @property
    def is_continuation(self) -> bool: ...


@dataclass(frozen=True)
class SubmittedCall:
    """One call placed on this instance; prefix_* say how much of the prompt is reusable here.
    The scheduler's own `SchedCall`, for drivers that have no instance core (tests, figure 4)."""

    call_id: str
    session_id: str
    model: str
    prompt_tokens: int
    prefix_tokens: int = 0
    prefix_state: KVState = KVState.MISSING
    max_tokens: int = 256
    arrived_at: float = 0.0
    is_continuation: bool = False


@dataclass(frozen=True)
class PrefillItem:
    """How one call's context is obtained: cached + restore + recompute == its prompt."""

    call_id: str
    restore_tokens: int
    recompute_tokens: int
    cached_device_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.restore_tokens + self.recompute_tokens + self.cached_device_tokens


@dataclass(frozen=True)
class Prefill:
    calls: list[PrefillItem]
    tag: Literal["P", "SP"]
    model: str
    predicted_s: float = 0.0

    @property
    def call_ids(self) -> list[str]:
        return [item.call_id for item in self.calls]


@dataclass(frozen=True)
class Decode:
    """One decode iteration over the running batch; each call emits one token unless told."""

    model: str
    call_ids: list[str]
    predicted_s: float = 0.0


@dataclass(frozen=True)
class Switch:
    """Change the active model at a slot boundary; from_model None means a first open."""

    from_model: str | None
    to_model: str
    path: SwitchPath
    predicted_s: float = 0.0


@dataclass(frozen=True)
class Idle:
    """Nothing to run; ask again at `until` or on the next submit (None: only on submit)."""

    until: float | None = None


Action = Prefill | Decode | Switch | Idle


@dataclass(frozen=True)
class Completion:
    """A finished call and where its session's KV now lives on this instance."""

    call_id: str
    session_id: str
    model: str
    kv_state: KVState
    kv_len: int
    ttft_s: float
    finished_at: float
    first_token_at: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    admitted_by: Literal["P", "SP"]
    parked_times: int = 0
    park_cost_s: float = 0.0
