import pytest

from talariad.replay.metrics import CallRecord, RoundRecord, RunResult, SessionRecord, SwitchRecord
from talariad.types import SwitchPath

GIB = 1 << 30


def make_run(config: str, scale: float = 1.0, **labels) -> RunResult:
    """A hand-made run: 4 sessions, 8 calls, 4 switches, 3 rounds; times multiply by `scale`."""
    sessions = [
        SessionRecord(f"s{i}", "m", 0.0, (10.0 + 10 * i) * scale, alone_s=5.0 + i) for i in range(4)
    ]
    calls = []
    for i in range(4):
        calls.append(
            CallRecord(
                f"s{i}",
                0,
                "m",
                "i0",
                0.0,
                0.5 * (i + 1) * scale,
                3.0,
                opened_model=i == 0,
                avoidable_open=i == 1,
                model_resident=i != 0,
            )
        )
        calls.append(
            CallRecord(
                f"s{i}",
                1,
                "m",
                "i0",
                4.0,
                4.0 + 0.1 * (i + 1) * scale,
                6.0,
                same_instance=i != 3,
                model_resident=True,
                kv_source="device",
            )
        )
    switches = [
        SwitchRecord(1.0, "i0", "m", "n", SwitchPath.D2D, 0.1),
        SwitchRecord(2.0, "i0", "n", "m", SwitchPath.D2D, 0.3),
        SwitchRecord(3.0, "i0", "m", "n", SwitchPath.H2D, 2.0 * scale),
        SwitchRecord(4.0, "i0", None, "m", SwitchPath.PARTIAL, 1.0),
    ]
    rounds = [
        RoundRecord(0, "i0", 10.0, 8.0, 2.0, hbm_bytes=150 * GIB),
        RoundRecord(1, "i0", 10.0, 7.0, 3.0, hbm_bytes=177 * GIB),
        RoundRecord(2, "i0", 20.0, 20.0, 0.0),
    ]
    return RunResult(
        config,
        sessions,
        calls,
        switches,
        rounds,
        hbm_peak_bytes=100 * GIB,
        sp_admitted=7,
        sp_parked=9,
        **labels,
    )


@pytest.fixture
def run():
    return make_run("Talaria")
