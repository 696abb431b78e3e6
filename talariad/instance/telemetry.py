"""An instance's telemetry (`InstanceTelemetry`, built only by `InstanceCore.telemetry`). The
router reads it through `router.snapshot.router_snapshot`."""

from __future__ import annotations

from dataclasses import dataclass

from talariad.types import KVLocation, ModelLoad, RoundMeasurement


@dataclass(frozen=True, slots=True)
class InstanceTelemetry:
    """Versioned snapshot of one instance (§4.1). The instance process encodes it as the internal
    API's `Telemetry` (`engine.events.telemetry_message`), field for field."""

    instance: str
    version: int
    pool: str
    """hot | cold (`Pool`'s value)."""
    models: list[str]
    active_model: str | None
    loaded_models: list[str]
    queued: dict[str, int]
    running: int
    sessions: list[KVLocation]
    round_remaining_s: float
    kv_occupancy: float
    hbm_free_bytes: int | None
    """None: the executor does not measure its memory (the router then skips its HBM check)."""
    staging_slack_bytes: int | None
    switches: int
    opened_models: list[str]
    """Models opened here at least once: switching them in costs a switch, not a full open."""
    model_load: dict[str, ModelLoad]
    round_load_s: float
    """Predicted length of the next round: what is left of this one plus queued prefill work."""
    deadline_risk_share: float
    """Share of the last rounds whose wall time exceeded γ·T_TTFT."""
    rounds: list[RoundMeasurement]
    """Round measurements since the previous snapshot (bounded), for the router's profile EWMA."""
