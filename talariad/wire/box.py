"""A box's snapshot for the pool's endpoint picker (`GET /pool/snapshot` on the daemon's HTTP
port): each instance's latest telemetry with its session view (whole or as changes), and each model's latency
profile, so the picker's `Router` places calls on boxes with the facts a box's router has."""

from __future__ import annotations

from pydantic import BaseModel, Field

from talariad.types import LatencyProfile
from talariad.wire.messages import Telemetry

SNAPSHOT_PATH = "/pool/snapshot"


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


class BoxInstance(BaseModel):
    """One instance of the box: its latest telemetry (`sessions` its merged view, whole or, with
    `sessions_base` set, the changes since the snapshot the caller named with `?since=`, as the
    instance's own telemetry sends them; `rounds` empty: the profiles carry what they taught),
    whether the box takes its calls, and the telemetry's age when the snapshot was taken."""

    name: str
    healthy: bool
    age_s: float
    telemetry: Telemetry
    sessions_truncated: bool = False
    """True when the session view was cut to the box's bound (`pool.max_sessions_per_instance`):
    the prefixes left out are its smallest host-resident ones."""


class BoxSnapshot(BaseModel):
    """The whole box: `version` grows with every snapshot the daemon serves (restarts reset it;
    the picker keeps versions of its own)."""

    version: int
    sessions_epoch: int | None = None
    """Names this snapshot's session views; pass it back as `?since=` to get only what changes
    (an instance whose `sessions_base` is None was sent whole all the same)."""
    instances: list[BoxInstance] = Field(default_factory=list)
    models: list[BoxModel] = Field(default_factory=list)
