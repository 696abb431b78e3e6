"""The one mapping from an instance's telemetry (`wire.messages.Telemetry`, built only by
`InstanceCore.telemetry`) to what the router reads: an `InstanceSnapshot` on the router's clock and
`RoundMeasurement`s for its profile EWMA. The daemon's gateway and the simulator both use it."""

from __future__ import annotations

from talariad.router import (
    InstanceSnapshot,
    ModelResidency,
    ModelState,
)
from talariad.types import Pool
from talariad.wire.messages import Telemetry


def router_snapshot(
    t: Telemetry, allowed: list[str], taken_at: float, healthy: bool, sessions: dict | None = None
) -> InstanceSnapshot:
    """The router's view of one telemetry reply; `sessions`: the merged session view when the
    reply carries only changes (default: the reply's own list)."""
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
