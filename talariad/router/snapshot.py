"""The one mapping from an instance's telemetry to what the router reads: an `InstanceSnapshot`
on the router's clock. The simulator maps the instance core's `InstanceTelemetry`; the daemon's
gateway and the picker map the internal API's `Telemetry`, which carries the same fields.

The router names what it reads (`TelemetryView`) rather than importing either: the instance core
and the wire sit beside and above it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from talariad.router.messages import InstanceSnapshot, ModelResidency, ModelState
from talariad.types import KVLocation, ModelLoad, Pool


class TelemetryView(Protocol):
    """The fields of an instance's telemetry the router reads (read-only)."""

    @property
    def instance(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def pool(self) -> str: ...
    @property
    def active_model(self) -> str | None: ...
    @property
    def opened_models(self) -> Sequence[str]: ...
    @property
    def model_load(self) -> Mapping[str, ModelLoad]: ...
    @property
    def sessions(self) -> Sequence[KVLocation]: ...
    @property
    def round_remaining_s(self) -> float: ...
    @property
    def round_load_s(self) -> float: ...
    @property
    def deadline_risk_share(self) -> float: ...
    @property
    def kv_occupancy(self) -> float: ...
    @property
    def hbm_free_bytes(self) -> int | None: ...
    @property
    def staging_slack_bytes(self) -> int | None: ...


def router_snapshot(
    t: TelemetryView,
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
