"""Telemetry of the cold-pool scheduler: round summaries (App. A "Timing telemetry": wall = active +
switch, phase counters kept apart as diagnostic subviews), deadline-risk counters and the snapshot
the router and the dashboard read."""

from __future__ import annotations

from dataclasses import dataclass, field

from talariad.types import KVLocation

PHASES = ("P", "D1", "D", "SP", "Dfin", "restore", "hold")


@dataclass
class RiskCounters:
    """Shortfalls are counted, never hidden (§3.4: best-effort prefill is not silent deferral)."""

    round_bound: int = 0
    """Slots whose plan breaks Eq. (4)/(5): decode reservations plus switches > gamma*T_TTFT."""
    round_overrun: int = 0
    """Rounds whose measured wall exceeded gamma*T_TTFT."""
    prefill_shortfall: int = 0
    """Admissions forced past an exhausted prefill budget so that a queue head is not starved."""
    deferred: int = 0
    """Calls still waiting when a slot of their model closed (they wait one more round)."""
    tpot_infeasible: set[str] = field(default_factory=set)
    """Models whose profiled decode step is >= T_TPOT (Eq. 4 cannot hold)."""


@dataclass
class RoundSummary:
    index: int
    started_at: float
    ended_at: float | None = None
    models: list[str] = field(default_factory=list)
    active_s: float = 0.0
    switch_s: float = 0.0
    phase_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    """Measured time per phase inside slots; diagnostic, may overlap, not summed into wall."""
    switches: int = 0
    decode_steps: int = 0
    p_admitted: int = 0
    sp_admitted: int = 0
    sp_parked: int = 0
    decode_parked: int = 0
    deferred: int = 0
    predicted_s: float = 0.0
    """The Eq. (3) prediction: the slot budgets planned in this round plus predicted switches."""

    @property
    def wall_s(self) -> float:
        return self.active_s + self.switch_s

    @property
    def open(self) -> bool:
        return self.ended_at is None


@dataclass(frozen=True)
class ModelQueue:
    waiting: int
    sp_eligible: int
    parked: int
    running: int
    oldest_wait_s: float


@dataclass(frozen=True)
class SchedTelemetry:
    now: float
    mode: str
    active_model: str | None
    slot_phase: str | None
    slot_remaining_s: float
    round_index: int
    round_remaining_s: float
    """Predicted time until this round ends; 0 when no slot is open."""
    queues: dict[str, ModelQueue]
    sp_admitted: int
    sp_parked: int
    decode_parked: int
    risk_round_bound: int
    risk_round_overrun: int
    risk_prefill_shortfall: int
    risk_deferred: int
    ttft_at_risk: int
    """Calls waiting longer than gamma*T_TTFT right now."""
    tpot_infeasible: list[str]
    kv_used_tokens: int
    kv_capacity_tokens: int
    sessions: list[KVLocation]
    measured_switch_s: dict[str, float]
    phase_totals_s: dict[str, float]
    """Measured seconds per phase since start (both modes; pinned mode has no rounds)."""
