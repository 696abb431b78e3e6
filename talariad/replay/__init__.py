"""Trace format, loaders, generators, the lower bounds, and the report/plot tooling of replays."""

from talariad.replay.bounds import rank_bounds, single_tenant_bounds, single_tenant_s
from talariad.replay.metrics import (
    CallRecord,
    RoundRecord,
    RowMetrics,
    RunResult,
    SessionRecord,
    SwitchRecord,
    nearest_rank,
    row_metrics,
)
from talariad.replay.trace import Trace, TraceCall, TraceError, read_jsonl, write_jsonl

__all__ = [
    "CallRecord",
    "RoundRecord",
    "RowMetrics",
    "RunResult",
    "SessionRecord",
    "SwitchRecord",
    "Trace",
    "TraceCall",
    "TraceError",
    "nearest_rank",
    "rank_bounds",
    "read_jsonl",
    "single_tenant_bounds",
    "single_tenant_s",
    "row_metrics",
    "write_jsonl",
]
