"""Trace format, loaders, generators, the oracle bound, and the report/plot tooling of replays."""

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
from talariad.replay.oracle import oracle_bounds, oracle_sct
from talariad.replay.trace import Trace, TraceCall, TraceError, read_jsonl, write_jsonl

__all__ = [
    "CallRecord", "RoundRecord", "RowMetrics", "RunResult", "SessionRecord", "SwitchRecord",
    "Trace", "TraceCall", "TraceError", "nearest_rank", "oracle_bounds", "oracle_sct",
    "read_jsonl", "row_metrics", "write_jsonl",
]
