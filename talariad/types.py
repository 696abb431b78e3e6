"""Small value types shared by the router, the cold-pool scheduler, the substrate and the engines."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class KVState(str, enum.Enum):
    """Where a session's reusable prefix lives on one instance (the router-visible state, §4.3)."""

    DEVICE = "device"
    HOST = "host"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class KVLocation:
    """Where a session's prefix for a model lives on one instance, and its length in tokens: what
    an executor reports, the ledger lists, telemetry carries and the router reads."""

    session_id: str
    model: str
    state: KVState
    kv_len: int


@dataclass(slots=True)
class RoundMeasurement:
    """What one instance measured for one model over one closed round (a pinned instance: since
    the last read): the instance core fills it, telemetry carries it, the router's profile EWMA
    reads it (§3.3). A pair left at 0, or a switch left None, carries no information."""

    model: str = ""
    seq: int = 0
    """Increasing per instance: a reader feeds each measurement once."""
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_steps: int = 0
    decode_s: float = 0.0
    restored_tokens: int = 0
    restore_s: float = 0.0
    switch_path: SwitchPath | None = None
    switch_s: float | None = None


@dataclass(frozen=True, slots=True)
class ModelLoad:
    """One model's load on one instance: the instance core fills it, telemetry carries it, the
    router reads it."""

    queued_calls: int = 0
    queued_tokens: int = 0
    """Prompt tokens of calls not yet prefilled."""
    running: int = 0
    switch_cost_s: float | None = None
    """Predicted cost of switching this model in (measured EWMA once it has switched)."""
    open_cost_s: float | None = None


class Pool(str, enum.Enum):
    HOT = "hot"
    COLD = "cold"


class SwitchPath(str, enum.Enum):
    """How a model switch opened the target weights (App. D, phase 2)."""

    D2D = "d2d"
    PARTIAL = "partial"
    H2D = "h2d"


SWITCH_PHASES = ("save/teardown", "open weights", "KV shell", "runtime and graphs", "publish")
"""The five ordered phases of a model switch (App. D), by the paper's names."""


@dataclass(frozen=True, slots=True)
class LatencyProfile:
    """Per-model cost model in seconds; the router and scheduler predict with it, engines refine it.

    Prefill of n new tokens costs `prefill_base_s + prefill_s_per_token * n`; one decode step over a
    batch of b sequences costs `decode_step_s + decode_s_per_seq * b`; restoring n prefix tokens from
    host costs `restore_s_per_token * n`.
    """

    prefill_base_s: float = 0.0
    prefill_s_per_token: float = 1e-4
    decode_step_s: float = 0.03
    decode_s_per_seq: float = 0.0
    restore_s_per_token: float = 1e-5
    switch_s: dict[SwitchPath, float] | None = None
    fallback_s: float | None = None
    """An H2D open when D2D staging is on but nothing usable was staged (wrong target or dirty);
    None: the H2D cost. The paper measures these apart (§5.6: 2011 ms vs H2D-only 1497 ms p50)."""
    open_s: float = 3.0
    weight_bytes: int = 0
    kv_bytes_per_token: int = 0

    def prefill_s(self, new_tokens: int) -> float:
        return (
            0.0 if new_tokens <= 0 else self.prefill_base_s + self.prefill_s_per_token * new_tokens
        )

    def decode_s(self, batch: int) -> float:
        return self.decode_step_s + self.decode_s_per_seq * batch

    def restore_s(self, tokens: int) -> float:
        return self.restore_s_per_token * max(tokens, 0)

    def switch_cost_s(self, path: SwitchPath) -> float:
        if self.switch_s and path in self.switch_s:
            return self.switch_s[path]
        return self.open_s


@dataclass(frozen=True, slots=True)
class SwitchRecord:
    """One logical model switch of an instance (the maximum over TP ranks, as in §5.6); a free
    first activation of a prewarmed instance is not one."""

    at_s: float
    instance: str
    from_model: str | None
    to_model: str
    path: SwitchPath
    latency_s: float


@dataclass(slots=True)
class ToolCall:
    """A function call the model made (rendered back into the template on the next turn): the
    tool parsers make it, a chat message carries it over the wire."""

    id: str
    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    """Parsed JSON arguments; a string for free-form (custom) tools or arguments that are not JSON."""
