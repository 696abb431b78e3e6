"""An instance's telemetry (`InstanceTelemetry`, built only by `InstanceCore.telemetry`) and the
one mapping from it to what the router reads: an `InstanceSnapshot` on the router's clock. The
simulator maps the core's snapshot; the daemon's gateway maps the internal API's `Telemetry`,
which carries the same fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from talariad.router import (
    InstanceSnapshot,
    ModelResidency,
    ModelState,
)
from talariad.types import KVLocation, ModelLoad, Pool, RoundMeasurement

if TYPE_CHECKING:
    from talariad.wire.messages import Telemetry


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


def router_snapshot(
    t: Telemetry | InstanceTelemetry,
    allowed: list[str],
    taken_at: float,
    healthy: bool,
    sessions: dict | None = None,
) -> InstanceSnapshot:
    """The router's view of one snapshot (the core's, or the internal API's reply: same fields);
    `sessions`: the merged session view when the reply carries only changes (default: its own
    list)."""
    models = {}
    opened = set(t.opened_models)
    for m in allowed:
        load = t.model_load.get(m)
        state = (
            ModelState.ACTIVE
            if m == t.active_model
            else ModelState.RESIDENT
            if m in opened
            else ModelState.ABSENT
        )
        if load is None:
            models[m] = ModelResidency(state)
            continue
        models[m] = ModelResidency(
            state,
            0.0,
            load.queued_tokens,
            load.queued_calls,
            load.running,
            load.switch_cost_s,
            load.open_cost_s,
        )
    if sessions is None:
        sessions = {(s.session_id, s.model): s for s in t.sessions}
    return InstanceSnapshot(
        instance=t.instance,
        version=t.version,
        taken_at=taken_at,
        pool=Pool(t.pool),
        healthy=healthy,
        allowed_models=frozenset(allowed),
        models=models,
        sessions=sessions,
        round_remaining_s=t.round_remaining_s,
        round_load_s=t.round_load_s,
        deadline_risk=t.deadline_risk_share,
        kv_occupancy=t.kv_occupancy,
        hbm_free_bytes=t.hbm_free_bytes,
        staging_slack_bytes=t.staging_slack_bytes or 0,
        restore_s_per_token=None,  # measured restores refine the router's profile (round reports)
    )
