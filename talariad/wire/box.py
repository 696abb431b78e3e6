"""A box's snapshot for the pool's endpoint picker (`GET /pool/snapshot` on the daemon's HTTP
port): each instance's latest telemetry with its session view (whole or as changes), and each model's latency
profile, so the picker's `Router` places calls on boxes with the facts a box's router has."""

from __future__ import annotations

from pydantic import BaseModel, Field

from talariad.types import LatencyProfile, SwitchPath
from talariad.wire.messages import Telemetry

SNAPSHOT_PATH = "/pool/snapshot"


class ProfileFacts(BaseModel):
    """`LatencyProfile` on the wire (its switch table keyed by the path's name)."""

    prefill_base_s: float = 0.0
    prefill_s_per_token: float = 1e-4
    decode_step_s: float = 0.03
    decode_s_per_seq: float = 0.0
    restore_s_per_token: float = 1e-5
    switch_s: dict[SwitchPath, float] | None = None
    fallback_s: float | None = None
    open_s: float = 3.0
    weight_bytes: int = 0
    kv_bytes_per_token: int = 0

    @classmethod
    def of(cls, p: LatencyProfile) -> ProfileFacts:
        return cls(**{name: getattr(p, name) for name in cls.model_fields})

    def profile(self) -> LatencyProfile:
        return LatencyProfile(**{name: getattr(self, name) for name in type(self).model_fields})


class BoxModel(BaseModel):
    """A model the box serves: its name, the exact aliases and glob patterns a client may send
    for it, its default output limit and its current (EWMA-refined) latency profile."""

    name: str
    aliases: list[str] = Field(default_factory=list)
    default_max_tokens: int = 4096
    profile: ProfileFacts = ProfileFacts()


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
