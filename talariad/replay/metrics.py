"""What one run of one configuration produced (`RunResult`) and the row metrics computed from it.

The simulator (and a real-mode replay client) fills a `RunResult`; `row_metrics` turns it into
the numbers of one report row. Percentiles are nearest-rank (App. A): for N observations p_q is
the observation at rank ceil(qN/100).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from talariad.types import SwitchPath
from talariad.types import SwitchRecord as SwitchRecord  # a run result lists them

GIB = 1 << 30


def nearest_rank(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0 < q <= 100) by nearest rank; None for no observations."""
    if not 0 < q <= 100:
        raise ValueError(f"percentile q must be in (0, 100], got {q}")
    xs = sorted(values)
    if not xs:
        return None
    return xs[max(math.ceil(q * len(xs) / 100), 1) - 1]


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One served call. Times are seconds on the run's clock (virtual in the simulator)."""

    session_id: str
    call_idx: int
    model: str
    instance: str
    intended_s: float  # intended enqueue time: previous response + gap (schedule-aware TTFT origin)
    first_token_s: float
    done_s: float
    same_instance: bool | None = None  # returning calls: served where the previous call was
    model_resident: bool | None = None  # the model was resident on the chosen instance at placement
    opened_model: bool = False  # placement had to open (load) the model on the chosen instance
    avoidable_open: bool = False  # ... although another instance already had it resident (§5.3)
    kv_source: str = "none"  # device | host | recompute | none
    parked_times: int = 0  # slot ends it was still decoding at (parked, resumed in a later slot)
    park_cost_s: float = 0.0  # predicted restore + recompute time its resumptions cost
    reserved: bool | None = None  # returning calls: a lease was installed for this return
    lease_hit: bool = False  # ... and the router placed it through the lease (§5.4)
    call_id: str = ""  # real mode: the response id, for the daemon's routing explanation

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.intended_s

    @property
    def returning(self) -> bool:
        return self.call_idx > 0


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """One model-session: SCT runs from its first call's intended enqueue to its last response."""

    session_id: str
    model: str
    start_s: float
    end_s: float
    alone_s: float | None = None  # its single-tenant time (talariad.replay.bounds)

    @property
    def sct_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """One cold-pool round; wall = active + switch (App. A's exclusive decomposition)."""

    index: int
    instance: str
    wall_s: float
    active_s: float
    switch_s: float
    hbm_bytes: int = 0  # peak device bytes in use during the round (per GPU of the TP group)


@dataclass(slots=True)
class RunResult:
    """Everything one configuration's run produced. `policy`, `load` and `tau_s` label runs for
    the router (Fig. 8) and reservation-timeout (Fig. 9) plots."""

    config: str
    sessions: list[SessionRecord] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)
    switches: list[SwitchRecord] = field(default_factory=list)
    rounds: list[RoundRecord] = field(default_factory=list)
    hbm_peak_bytes: int = 0
    sp_admitted: int = 0  # SP return-handling events admitted into the active slot
    sp_parked: int = 0  # ... and deferred to a later opportunity or slot
    policy: str | None = None
    load: str | None = None
    tau_s: float | None = None
    wall_clock_s: float | None = None  # how long the run itself took (simulator speed)
    rank_bounds: list[float] | None = None  # strict bound on the k-th finisher (all start at 0)
    unmeasured: frozenset[str] = frozenset()
    """Row metrics this run could not measure (a real-mode replay without the admin API); the
    report prints `-` for them: rounds, switches, switch_share, hbm_peak, sp, avoidable_opens, parks."""

    def ttfts(self, returning_only: bool = False) -> list[float]:
        return [c.ttft_s for c in self.calls if c.returning or not returning_only]

    @property
    def avoidable_opens(self) -> int:
        return sum(c.avoidable_open for c in self.calls)

    @property
    def model_opens(self) -> int:
        return sum(c.opened_model for c in self.calls)


def _rate(flags: list[bool | None]) -> float | None:
    known = [f for f in flags if f is not None]
    return sum(known) / len(known) if known else None


def _p(values: list[float]) -> tuple[float | None, float | None]:
    return nearest_rank(values, 50), nearest_rank(values, 95)


@dataclass(frozen=True, slots=True)
class PathStats:
    count: int
    p50_s: float | None
    p95_s: float | None
    share: float  # fraction of all switches that took this path


@dataclass(frozen=True, slots=True)
class RowMetrics:
    """One report row; seconds unless named otherwise; None where there is nothing to measure."""

    config: str
    sessions: int
    calls: int
    sct_p50_s: float | None
    sct_p95_s: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    returning_ttft_p50_s: float | None
    returning_ttft_p95_s: float | None
    switch_by_path: dict[str, PathStats]
    switch_p50_s: float | None
    switch_p95_s: float | None
    switch_share: float | None  # switch time / round wall time
    rounds: int | None  # None: not measured (as every None below)
    hbm_peak_gib: float | None
    avoidable_opens: int | None
    model_opens: int
    same_instance_rate: float | None
    residency_hit_rate: float | None
    unused_lease_rate: float | None  # §5.4's proxy: leased returns not placed through the lease
    sp_admitted: int | None
    sp_parked: int | None
    switches: int | None
    slowdown_p50: float | None  # per-session SCT over its own strict bound (talariad.replay.bounds)
    slowdown_p95: float | None
    parked_calls: int | None  # calls still decoding at a slot end at least once
    parks: int | None  # slot ends at which a call was parked, summed over calls
    park_cost_s: float | None  # predicted restore + recompute time that resuming parked calls cost
    policy: str | None = None
    load: str | None = None
    tau_s: float | None = None
    bound_p50_s: float | None = None
    """The strict multiplexing bound on SCT p50 / p95 (no schedule of this trace on this box does
    better, `talariad.replay.bounds`); None unless every session started at t = 0."""
    bound_p95_s: float | None = None
    switch_mean_s: float | None = None
    switch_total_s: float | None = None  # summed over rounds (Fig. 13's "Switch")
    active_total_s: float | None = None  # round wall minus switch time (Fig. 13's "Active")


def row_metrics(run: RunResult) -> RowMetrics:
    sct50, sct95 = _p([s.sct_s for s in run.sessions])
    ttft50, ttft95 = _p(run.ttfts())
    ret50, ret95 = _p(run.ttfts(returning_only=True))
    sw50, sw95 = _p([s.latency_s for s in run.switches])
    slow50, slow95 = _p(slowdowns(run))
    returning = [c for c in run.calls if c.returning]
    gone = run.unmeasured

    def measured(name: str, value):
        return None if name in gone else value

    return RowMetrics(
        config=run.config,
        sessions=len(run.sessions),
        calls=len(run.calls),
        sct_p50_s=sct50,
        sct_p95_s=sct95,
        ttft_p50_s=ttft50,
        ttft_p95_s=ttft95,
        returning_ttft_p50_s=ret50,
        returning_ttft_p95_s=ret95,
        switch_by_path=switch_paths(run),
        switch_p50_s=sw50,
        switch_p95_s=sw95,
        switch_share=measured("switch_share", switch_share(run)),
        rounds=measured("rounds", len(run.rounds)),
        hbm_peak_gib=measured("hbm_peak", hbm_peak(run) / GIB),
        avoidable_opens=measured("avoidable_opens", run.avoidable_opens),
        model_opens=run.model_opens,
        same_instance_rate=_rate([c.same_instance for c in returning]),
        residency_hit_rate=_rate([c.model_resident for c in run.calls]),
        unused_lease_rate=_rate([not c.lease_hit for c in returning if c.reserved]),
        sp_admitted=measured("sp", run.sp_admitted),
        sp_parked=measured("sp", run.sp_parked),
        switches=measured("switches", len(run.switches)),
        slowdown_p50=slow50,
        slowdown_p95=slow95,
        parked_calls=measured("parks", sum(c.parked_times > 0 for c in run.calls)),
        parks=measured("parks", sum(c.parked_times for c in run.calls)),
        park_cost_s=measured("parks", sum(c.park_cost_s for c in run.calls)),
        policy=run.policy,
        load=run.load,
        tau_s=run.tau_s,
        bound_p50_s=nearest_rank(run.rank_bounds, 50) if run.rank_bounds else None,
        bound_p95_s=nearest_rank(run.rank_bounds, 95) if run.rank_bounds else None,
        switch_mean_s=(
            sum(s.latency_s for s in run.switches) / len(run.switches) if run.switches else None
        ),
        switch_total_s=measured("switch_share", sum(r.switch_s for r in run.rounds)),
        active_total_s=measured("switch_share", sum(r.active_s for r in run.rounds)),
    )


def slowdowns(run: RunResult) -> list[float]:
    """Each session's SCT over its own bound: its single-tenant time and, when every session
    started together, the strict bound of its finishing rank (talariad.replay.bounds)."""
    done = sorted(run.sessions, key=lambda s: s.end_s)
    out = []
    for rank, s in enumerate(done):
        bound = s.alone_s or 0.0
        if run.rank_bounds is not None:
            bound = max(bound, run.rank_bounds[rank])
        if bound > 0:
            out.append(s.sct_s / bound)
    return out


def switch_paths(run: RunResult) -> dict[str, PathStats]:
    out = {}
    for path in SwitchPath:
        lat = [s.latency_s for s in run.switches if s.path is path]
        if lat:
            out[path.value] = PathStats(len(lat), *_p(lat), len(lat) / len(run.switches))
    return out


def switch_share(run: RunResult) -> float | None:
    wall = sum(r.wall_s for r in run.rounds)
    return sum(r.switch_s for r in run.rounds) / wall if wall > 0 else None


def hbm_peak(run: RunResult) -> int:
    return max([run.hbm_peak_bytes, *(r.hbm_bytes for r in run.rounds)])
