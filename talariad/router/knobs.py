"""The router's policy knobs (paper App. E, §3.3, §4.1), validated where they are declared."""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

OVERLOAD_MODES = ("queue", "reject", "spill")


@dataclass(frozen=True)
class RouterKnobs:
    """Every number the router decides with; all times are seconds."""

    tau_s: float = 1.0
    """Soft-reservation lease lifetime τ: a lease lives on [t_done, t_done + τ). The paper picks
    1 s from its sweep (near the p90 tool gap). 0 disables leases like `reservations=False`."""

    session_home: bool = False
    """A call whose prefix some target holds (its branch's, or for a new branch the head's it
    shares, `CallRequest.prefix_of`) goes to that target while it can take it (the HBM check
    passes, no replica to open, and the round check unless the prefix is on its device: a
    continuation the box admits mid-slot, as a lease) and staying costs at most a round bound
    more than the cheapest target elsewhere, lease or not; else it is placed by cost. The pool's picker
    sets it: moving a session between boxes moves its whole KV, and the load a box's snapshot
    shows is a poll old, so near-equal costs are no reason to move. A box leaves it off: its
    instances share one clock and the cost model weighs their load exactly."""

    replica_gain_decode: bool = False
    """Eq. (2)'s gain also counts the decode contention of the model's running calls on its open
    replicas (`cost.decode_contention_s`), not only its queued prefill. The pool's picker sets it:
    a session placed on a box stays there for its dozens of calls, so a box where the model is
    open already and its decode batch grows with every session sent there is no reason to leave
    an idle box closed; at a box the paper's gain stands (its instances share a round, and a
    replica opened within the box costs its other models' slots)."""

    gamma: float = 0.8
    """Round-admission margin of Eq. (5): a round must stay within γ·TTFT. The paper only requires
    γ < 1; 0.8 leaves a 20 % margin for restore/switch estimation error and stale telemetry."""

    ttft_target_s: float = 10.0
    """TTFT budget the round bound protects (the paper's §2.4 uses 10 s)."""

    admission_unit_s: float = 0.5
    """The most slot budget one live lease charges to its instance. A lease charges its session's
    predicted return: the prefill of a suffix as long as the call it follows, plus the restore of
    a host-resident prefix (`Router.completed`), capped here: 0.5 s is about the session-prefill
    of a typical continuation suffix (a few thousand new tokens on a 100B+ model) plus its
    restore, so a small model's lease no longer fills a hot instance's budget."""

    replica_penalty_s: float = 2.0
    """ν_m of Eq. (2): latency-equivalent penalty against opening a replica for a short burst."""

    replica_penalty_by_model: Mapping[str, float] = field(default_factory=dict)
    """Per-model overrides of `replica_penalty_s`."""

    hbm_price_s_per_gib: float = 0.02
    """Base of μ_j in Eq. (2), seconds per GiB of added HBM footprint on an idle instance; the
    router scales it up with the instance's KV occupancy and missing staging slack."""

    control_window_s: float = 30.0
    """Horizon over which Eq. (2) predicts the gain of a new replica from observed arrivals."""

    retire_window_s: float = 30.0
    """Window of a replica's retirement rule: a model resident on a cold instance stays in that
    instance's rotation while the work placed there for it over this window covers what keeping
    it costs (the right side of Eq. (2) with its full weights); otherwise it retires, and placing
    it there again must pass Eq. (2) like a fresh replica."""

    staleness_s: float = 2.0
    """A snapshot older than this excludes its instance from non-reserved placement."""

    heartbeat_s: float = 2.0
    """Longest silence (no heartbeat, no snapshot) before an instance counts as having missed
    its heartbeat; it is then excluded from non-reserved placement."""

    overload: Literal["queue", "reject", "spill"] = "queue"
    """What happens when no candidate is feasible: hold at the gateway, HTTP 429, or send to
    the cheapest eligible instance ignoring feasibility. Under "queue" the talaria policy sends a
    call that only its serving replicas' round budget or KV room refuses to the cheapest one's
    queue instead of holding it (`TalariaPolicy._waits_where_served`)."""

    queue_limit: int = 256
    """Most calls held at the gateway under `overload="queue"`; beyond it calls are rejected."""

    queue_timeout_s: float = 30.0
    """A held call that is still infeasible after this long is rejected."""

    reservations: bool = True
    """Ablation switch: False installs no lease at all (the paper's τ = 0 point)."""

    residency_terms: bool = True
    """Ablation switch: False drops KV recovery and activation from Eq. (1) and skips Eq. (2)."""

    ewma_alpha: float = 0.2
    """Weight of a new round summary in the per-model latency-profile EWMA."""

    session_idle_s: float = 3600.0
    """A session-table row idle this long is forgotten (SGLang's sticky map uses 4 h; an agent
    session idle for an hour has long lost its KV anyway)."""

    max_sessions: int = 100_000
    """Most session-table rows kept; past it the least recently used row is forgotten."""

    cost_candidates: int | None = None
    """Cost placement scores at most this many targets besides those the call singles out (its
    session's prefix or lease there, the router's own forwards since their snapshot): the
    lowest by the call-independent bound of Eq. (1) (the least loaded), so a pick weighs
    O(this) targets, not O(pool). None: every one the bound cannot rule out (the exact
    ranking). The picker sets it (1,000 boxes); with no more eligible targets than it, the
    ranking is exact."""

    seed: int = 0
    """Seed of the per-router RNG that seeded baseline policies (random, power-of-two) draw from."""

    def __post_init__(self) -> None:
        _check_nonneg(self, "tau_s", "admission_unit_s", "replica_penalty_s", "hbm_price_s_per_gib")
        _check_positive(
            self,
            "ttft_target_s",
            "control_window_s",
            "retire_window_s",
            "staleness_s",
            "heartbeat_s",
        )
        _check_positive(self, "queue_timeout_s", "session_idle_s", "max_sessions")
        if self.cost_candidates is not None and not (
            isinstance(self.cost_candidates, int) and self.cost_candidates >= 1
        ):
            raise ValueError(
                f"cost_candidates must be an integer >= 1, got {self.cost_candidates!r}"
            )
        if not 0.0 < self.gamma < 1.0:
            raise ValueError(f"gamma must satisfy 0 < gamma < 1 (Eq. 5), got {self.gamma!r}")
        if not 0.0 < self.ewma_alpha <= 1.0:
            raise ValueError(f"ewma_alpha must be in (0, 1], got {self.ewma_alpha!r}")
        if self.overload not in OVERLOAD_MODES:
            raise ValueError(f"overload must be one of {OVERLOAD_MODES}, got {self.overload!r}")
        if not isinstance(self.queue_limit, int) or self.queue_limit < 0:
            raise ValueError(f"queue_limit must be an integer >= 0, got {self.queue_limit!r}")
        for model, pen in self.replica_penalty_by_model.items():
            if not _finite(pen) or pen < 0:
                raise ValueError(f"replica_penalty_by_model[{model!r}] must be >= 0, got {pen!r}")
        object.__setattr__(
            self,
            "replica_penalty_by_model",
            types.MappingProxyType(dict(self.replica_penalty_by_model)),
        )

    @property
    def round_budget_s(self) -> float:
        """γ·T_TTFT, the longest round the admission check accepts (Eq. 5)."""
        return self.gamma * self.ttft_target_s

    @property
    def leases_enabled(self) -> bool:
        return self.reservations and self.tau_s > 0.0

    def replica_penalty(self, model: str) -> float:
        return self.replica_penalty_by_model.get(model, self.replica_penalty_s)


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_nonneg(k: RouterKnobs, *names: str) -> None:
    for name in names:
        v = getattr(k, name)
        if not _finite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")


def _check_positive(k: RouterKnobs, *names: str) -> None:
    for name in names:
        v = getattr(k, name)
        if not _finite(v) or v <= 0:
            raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
