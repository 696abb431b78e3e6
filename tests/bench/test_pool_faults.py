"""bench/pool_faults.py's accounting: each failed call counted once, in the column its time and
answer put it in, and a column a row does not measure is null, not 0."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import pool_faults  # noqa: E402
import pool_load  # noqa: E402


def call(sent: float, ended: float, status: str, error: str | None = None, session: int = 0):
    c = pool_load.Call(session, 0, f"c{sent}", False, sent, None, ended=ended, status=status)
    c.error, c.box = error, "box0" if status == "200" else None
    return c


def row(calls, fault_at):
    return pool_faults.Row("x", calls, fault_at, pool_faults.Extra(), 80.0, 90.0, 1.0, 10.0)


def test_failures_are_split_by_when_they_were_sent_and_what_came_back():
    calls = [
        call(9.0, 11.0, "cut"),  # on its way when the fault came
        call(9.5, 10.5, "500"),  # the same, answered 500 after the fault
        call(11.0, 11.1, "503", pool_faults.UNREACHABLE),  # no box took it
        call(9.0, 9.2, "503", pool_faults.UNREACHABLE),  # before the fault, but no box took it
        call(12.0, 12.5, "500"),  # sent after the fault
        call(5.0, 6.0, "500"),  # failed before the fault: in no column
        call(12.0, 12.3, "200"),
    ]
    cols, before = pool_faults.classify(row(calls, 10.0))
    assert cols == {"failed_in_flight": 2, "failed_not_at_box": 2, "failed_after": 1}
    assert before == 1


def test_a_row_without_a_fault_measures_no_in_flight_column():
    calls = [call(1.0, 2.0, "500"), call(1.0, 1.5, "200")]
    cols, before = pool_faults.classify(row(calls, None))
    assert cols == {"failed_in_flight": None, "failed_not_at_box": 0, "failed_after": 1}
    out, _ = pool_faults.summarize(row(calls, None), sessions=1)
    assert tuple(out) == pool_faults.ROW_FIELDS
    assert out["status_5xx"] == 1 and out["sessions_one_box"] == 1
