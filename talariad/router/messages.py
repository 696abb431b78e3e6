"""Typed messages into and out of the router: calls, instance snapshots, round summaries, decisions.

Units: times in seconds (the shell's clock), sizes in bytes, lengths in tokens.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from talariad.types import KVLocation, KVState, Pool


@dataclass(frozen=True, slots=True)
class CallRequest:
    """One model call as the gateway sees it before routing.

    `prefix_tokens` is how much of the prompt the agent's previous call already covered (the
    reusable prefix); `prompt_tokens - prefix_tokens` is new suffix work on any instance.
    """

    call_id: str
    session_id: str | None
    model: str
    prompt_tokens: int
    prefix_tokens: int = 0
    max_tokens: int = 256
    arrived_at: float | None = None
    """When the call reached the shell (None: when it is placed). A lease is judged at the call's
    arrival, not at its decision: the time a body takes to arrive and wait for the placement is
    not the agent's tool gap."""
    prefix_of: str | None = None
    """The branch whose context holds the reusable prefix when it is not the call's own (a new
    branch of a session sharing its head: tools, system prompt): its place is the prefix's."""

    def judged_at(self, now: float) -> float:
        """The time a lease for this call is judged at: its arrival, never later than `now`."""
        return now if self.arrived_at is None else min(self.arrived_at, now)

    def __post_init__(self) -> None:
        if self.prompt_tokens < 0 or self.max_tokens < 0:
            raise ValueError(f"prompt_tokens and max_tokens must be >= 0 ({self.call_id=})")
        if not 0 <= self.prefix_tokens <= self.prompt_tokens:
            raise ValueError(f"prefix_tokens must be in [0, prompt_tokens] ({self.call_id=})")


class ModelState(str, enum.Enum):
    """A model's state on one instance, as far as activation cost is concerned."""

    ACTIVE = "active"  # its slot is open now (a hot instance's pinned model is always active)
    RESIDENT = "resident"  # in the instance's rotation; switching in costs the advertised switch
    ABSENT = "absent"  # not on the instance; opening it is a full open (a fresh replica)


@dataclass(frozen=True, slots=True)
class ModelResidency:
    """Per-model part of an instance snapshot."""

    state: ModelState
    staged_fraction: float = 0.0
    queued_tokens: int = 0  # prompt tokens waiting for prefill
    queued_calls: int = 0
    running_calls: int = 0  # current decode batch
    switch_cost_s: float | None = None  # measured switch-in cost (already reflects staging)
    open_cost_s: float | None = None  # measured full-open cost on this instance
    slot_wait_s: float | None = None
    """The wait for the model's next slot there; None: read off the snapshot (0 on a hot
    instance, else its round's remainder). A box (`router.boxes`) sets it per model."""


@dataclass(frozen=True, slots=True)
class InstanceSnapshot:
    """Versioned telemetry from one instance (§4.1); a newer version replaces an older one.

    `round_load_s`: its prediction of its next round length R_i (Eq. 3); for a hot instance, the
    time to drain its queue. `deadline_risk` in [0, 1]: the share of recent rounds over γ·TTFT;
    the router inflates its predicted load by it. `allowed_models`: every model it may serve (a
    hot instance: its pinned model). `sessions`: every (session, model) prefix it holds; a pair
    not listed is missing there. `taken_at` is on the router's clock (the shell converts).
    """

    instance: str
    version: int
    taken_at: float
    pool: Pool
    healthy: bool
    allowed_models: frozenset[str]
    models: Mapping[str, ModelResidency] = field(default_factory=dict)
    sessions: Mapping[tuple[str, str], KVLocation] = field(default_factory=dict)
    round_remaining_s: float = 0.0
    round_load_s: float = 0.0
    deadline_risk: float = 0.0
    kv_occupancy: float = 0.0
    hbm_free_bytes: int | None = 0
    """None: the instance does not measure its memory; the HBM check is skipped for it."""
    staging_slack_bytes: int = 0
    restore_s_per_token: float | None = None  # measured H2D restore rate on this instance
    sessions_changed: frozenset[tuple[str, str]] | None = None
    """The pairs whose entry may differ from the instance's installed snapshot (None: any). A
    snapshot whose `sessions` is the installed snapshot's own mapping, updated in place (the
    pool's picker keeps one per box), must name them: the router re-indexes only those."""

    def residency(self, model: str) -> ModelResidency:
        return self.models.get(model, _ABSENT)

    def slot_wait_s(self) -> float:
        """The wait for a model's next slot here when its residency sets none: 0 on a hot
        instance, else what is left of the round."""
        return 0.0 if self.pool is Pool.HOT else self.round_remaining_s


_ABSENT = ModelResidency(ModelState.ABSENT)


class DecisionKind(str, enum.Enum):
    LEASE_HIT = "lease_hit"
    COST = "cost"
    REPLICA_OPEN = "replica_open"
    OVERLOAD_QUEUE = "overload_queue"
    OVERLOAD_REJECT = "overload_reject"
    OVERLOAD_SPILL = "overload_spill"

    @property
    def places(self) -> bool:
        """True when the decision sends the call to an instance now."""
        return self not in (DecisionKind.OVERLOAD_QUEUE, DecisionKind.OVERLOAD_REJECT)


class CandidateCost(NamedTuple):
    """Eq. (1) for one instance, term by term, and whether the feasibility filters kept it.

    `reason` is "ok" for a feasible candidate, else which check failed: "round" (Eq. 5),
    "hbm", "eq2" (replica gain below its cost), "retired" (a resident replica out of the
    instance's rotation whose reopening fails Eq. (2)). Baselines put their own score in `score`.
    NOTE: a NamedTuple, not a frozen dataclass: place() builds one per instance per call and a
    frozen dataclass costs several times more to construct; it is just as immutable and typed.
    """

    instance: str
    queue_s: float
    prefill_s: float
    decode_s: float
    kv_recovery_s: float
    activation_s: float
    total_s: float
    feasible: bool
    reason: str
    kv_state: KVState = KVState.MISSING
    needs_replica: bool = False
    round_load_s: float = 0.0
    score: float | None = None
    replica_s: float = 0.0
    """A candidate that opens (or reopens) a replica: the price of keeping it, μ_j·ΔW_m + ν_m of
    Eq. (2), charged to the call that opens it when candidates are ranked (`rank_s`)."""
    contention_s: float = 0.0
    """On a cold instance where the model has no work yet: the delay this call's slots add to the
    other models' calls there (`CostModel.contenders` calls, each waiting out its service time)."""

    @property
    def rank_s(self) -> float:
        """What Talaria ranks by: Eq. (1), plus the replica price of an open and the delay the
        call's slots impose on other models' calls."""
        return self.total_s + self.replica_s + self.contention_s


class Decision(NamedTuple):
    """The router's answer to `place()`; `instance` is None unless `kind.places`.

    A NamedTuple for the same reason as `CandidateCost` (one per call on the hot path)."""

    call_id: str
    kind: DecisionKind
    instance: str | None
    policy: str
    at: float
    reason: str = ""
    retry_after_s: float | None = None
    candidates: tuple[CandidateCost, ...] = ()
    session_id: str | None = None
    """The call's session branch (`CallRequest.session_id`): what its lease will be for."""


@dataclass(frozen=True, slots=True)
class Lease:
    """A soft reservation (s, m, i, k, t_exp) installed by a completion (§3.3, §4.1)."""

    session_id: str
    model: str
    instance: str
    prefix_handle: str
    kv_len: int
    t_done: float
    t_exp: float
    charge_s: float
    """Admission budget the lease holds on its instance: the predicted work of the session's
    return (`Router.completed`)."""

    def live(self, now: float) -> bool:
        return self.t_done <= now < self.t_exp


@dataclass(frozen=True, slots=True)
class SessionEntry:
    """Read-only view of one session-table row (§4.1)."""

    session_id: str
    instance: str | None
    model: str | None
    kv_len: int
    last_used: float
    lease: Lease | None = None


@dataclass(frozen=True, slots=True)
class InstanceStatus:
    """Read-only view of one instance as the router sees it at some `now` (for ctl and TUI)."""

    instance: str
    version: int
    pool: Pool
    healthy: bool  # passes the health check: lease returns may still go there
    fresh: bool  # snapshot within the staleness bound and no missed heartbeat
    in_flight: int  # calls forwarded and not yet completed or failed
    leases: int  # live leases charging its admission budget
    overlay_work_s: float  # predicted work forwarded since its latest snapshot
    retired: tuple[str, ...] = ()  # resident models the router took out of its rotation


@dataclass(frozen=True, slots=True)
class ExpiryReport:
    """What `Router.expire(now)` dropped: expired leases and held calls past their timeout;
    `pending`: a bounded step left more due (call again)."""

    leases: tuple[Lease, ...] = ()
    timed_out_calls: tuple[str, ...] = ()
    pending: bool = False
