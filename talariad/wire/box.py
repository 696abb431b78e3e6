"""A box's snapshot for the pool's endpoint picker (`GET /pool/snapshot` on the daemon's HTTP
port): the box as one placement target, as the box's router projects it, with its session view
(whole or as changes), and each model's latency profile. The picker installs the target as it
comes: it merges no instance views and recomputes nothing of the projection."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, Field

from talariad.router.messages import InstanceSnapshot, ModelResidency
from talariad.types import KVLocation, LatencyProfile, Pool
from talariad.wire.messages import SessionChanges

SNAPSHOT_PATH = "/pool/snapshot"

STREAM_TYPE = "application/x-ndjson"
"""The content type of `GET /pool/snapshot?stream=1`: the answers a run of held polls would get,
as one response of frames, one a line: a `BoxSnapshot` (a JSON object: the box changed; its
sessions as changes since the frame before) or the target's age (a JSON number: the snapshot last
sent stands, as a `304`'s `AGE_HEADER` says). A box that does not stream (an older daemon, which
ignores the parameter) answers as to a poll, `application/json` or `304`."""


class BoxModel(BaseModel):
    """A model the box serves: its name, the exact aliases and glob patterns a client may send
    for it, its default output limit, its context and its current (EWMA-refined) latency profile."""

    name: str
    aliases: list[str] = Field(default_factory=list)
    default_max_tokens: int = 4096
    max_context: int | None = None
    """Prompt plus output tokens the model takes (None: not said; the output limit is then
    planned as sent)."""
    profile: LatencyProfile = LatencyProfile()
    """On the wire as its fields (pydantic reads the dataclass), its switch table keyed by path."""


PROJECTED = (
    "pool",
    "healthy",
    "round_remaining_s",
    "round_load_s",
    "deadline_risk",
    "kv_occupancy",
    "hbm_free_bytes",
    "staging_slack_bytes",
    "restore_s_per_token",
)
"""The fields of the router's `InstanceSnapshot` a `BoxTarget` carries as they are (besides
them: the allowed models, the per-model residencies and the session view)."""


class BoxTarget(SessionChanges):
    """The box as one placement target: what the box's router projects of its live instances
    (`router.boxes.box_snapshot`, computed by `gateway.pool.box_target`), the box's session view
    (each (session, model) prefix at its best place on the box; whole, or with `sessions_base`
    set the changes since the snapshot the caller named with `?since=`), and the pool-average
    stats the peer policies read (`router.box_policies.BoxStats`)."""

    pool: Pool = Pool.HOT
    healthy: bool = False
    """False: no instance of the box takes calls now."""
    allowed_models: list[str] = Field(default_factory=list)
    models: dict[str, ModelResidency] = Field(default_factory=dict)
    """Per model, the residency, queue and slot wait of the instance the box would use for it."""
    round_remaining_s: float = 0.0
    round_load_s: float = 0.0
    deadline_risk: float = 0.0
    kv_occupancy: float = 0.0
    hbm_free_bytes: int | None = None
    staging_slack_bytes: int = 0
    restore_s_per_token: float | None = None
    age_s: float = 0.0
    """The age of the oldest live instance's telemetry when the snapshot was served: the picker
    counts the target as taken that long before it received it."""
    basis: list[tuple[str, int]] = Field(default_factory=list)
    """(instance, telemetry version) of each live instance the target was computed from: the
    same basis, the same target (a picker re-installs it only for its session changes)."""
    sessions_truncated: bool = False
    """True when the session view was cut to the box's bound (`pool.max_sessions_per_instance`
    per live instance): the prefixes left out are its smallest host-resident ones."""
    queue: float = 0.0
    """Mean waiting calls per live instance (`BoxStats.queue`)."""
    kv_util: float = 0.0
    """Mean KV occupancy per live instance, in [0, 1] (`BoxStats.kv_util`)."""
    instances: int = 0
    """Live instances (`BoxStats.instances`)."""

    def placement_target(
        self,
        box: str,
        version: int,
        taken_at: float,
        sessions: Mapping[tuple[str, str], KVLocation],
        changed: frozenset[tuple[str, str]] | None,
    ) -> InstanceSnapshot:
        """The router's snapshot of the box named `box`: `sessions`, the session view held (this
        message merged into it), `changed` the pairs this message changed (None: any)."""
        return InstanceSnapshot(
            instance=box,
            version=version,
            taken_at=taken_at,
            allowed_models=frozenset(self.allowed_models),
            models=self.models,
            sessions=sessions,
            sessions_changed=changed,
            **{name: getattr(self, name) for name in PROJECTED},
        )


class BoxSnapshot(BaseModel):
    """The whole box: `version` grows with every snapshot the daemon serves (restarts reset it;
    the picker keeps versions of its own)."""

    version: int
    sessions_epoch: int | None = None
    """Names this snapshot's session view; pass it back as `?since=` to get only what changes
    (a target whose `sessions_base` is None was sent whole all the same)."""
    target: BoxTarget = Field(default_factory=BoxTarget)
    models: list[BoxModel] | None = Field(default_factory=list)
    """None only in a snapshot stream's frames after its first: the models of the frame before
    (the box sends them when they change: a profile it refined, a config reload)."""
    max_connections: int | None = None
    """The box's `limits.max_connections`: connections it takes at once (None: an older box,
    the picker's `box_max_connections` then). The picker sends it fewer calls at once."""
    etag: str | None = None
    """Names what this snapshot says (the target but its age and basis, the models, the
    connection limit, the session view by its epoch); sent back as `If-None-Match`, a box whose
    state says the same answers `304 Not Modified` with only its age (`AGE_HEADER`)."""


AGE_HEADER = "x-talaria-age-s"
"""On a `304` to a conditional snapshot poll: the box's `BoxTarget.age_s` now (the target the
caller holds, taken that long ago)."""

CONTENT = frozenset(BoxTarget.model_fields) - {
    "age_s",
    "basis",
    "sessions",
    "sessions_base",
    "sessions_removed",
    "sessions_truncated",
}
"""The fields of a `BoxTarget` its snapshot's `etag` covers as they are (its age moves on, the
basis changes on every telemetry read of an instance, and the session view is named by its
epoch)."""
