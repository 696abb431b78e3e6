"""Small pieces of the operator's appliance: the socket rule, JSON numbers, the round recorder,
the worker's rotation, and the replay's admin records."""

from __future__ import annotations

import pytest

from talariad.admin import admin_pb2 as pb
from talariad.admin.client import as_dict
from talariad.admin.sockets import client_socket, daemon_socket
from talariad.replay.admin_records import ADMIN_METRICS, REPLAY_UNMEASURED, fill
from talariad.replay.metrics import CallRecord, RunResult, row_metrics
from talariad.replay.report import table


def test_socket_rule_is_absolute_and_shared():
    env = {"XDG_RUNTIME_DIR": "/run/user/1000"}
    assert daemon_socket(None, env) == client_socket(env) == "/run/user/1000/talaria/admin.sock"
    assert daemon_socket(None, {"RUNTIME_DIRECTORY": "/run/talaria"}) == "/run/talaria/admin.sock"
    env = {"TALARIA_SOCKET": "rel/admin.sock"}
    assert daemon_socket(None, env) == client_socket(env) and client_socket(env).startswith("/")
    assert daemon_socket("x.sock", env).endswith("/x.sock") and daemon_socket(
        "x.sock", env
    ).startswith("/")
    fallback = client_socket({})
    assert fallback.startswith("/") and fallback.endswith("talaria/admin.sock")


def test_json_numbers_are_numbers():
    reply = pb.MemoryReply(
        instance="c",
        capacity_bytes=5,
        layout=[pb.Region(region="w", offset=7, size=3)],
        host_kv_by_model={"m": 9},
    )
    d = as_dict(reply)
    assert (
        d["capacity_bytes"] == 5
        and d["layout"][0]["offset"] == 7
        and d["host_kv_by_model"] == {"m": 9}
    )
    assert d["hbm_free_bytes"] == 0 and d["switches"] == []  # every field printed
    rounds = as_dict(pb.RoundsReply(switches=[pb.SwitchRecord(round_index=-1, staged_bytes=-1)]))
    assert (
        rounds["switches"][0]["round_index"] == -1 and rounds["switches"][0]["staged_bytes"] == -1
    )


class _FakeAdmin:
    def __init__(self, reply):
        self.reply = reply

    def rounds(self, instance, limit):
        return self.reply

    def explain(self, call_id):
        resident_elsewhere = call_id == "chatcmpl-b"
        return pb.Decision(
            call_id=call_id,
            kind="replica_open",
            instance="c",
            candidates=[
                pb.Candidate(instance="c", needs_replica=True),
                pb.Candidate(instance="d", needs_replica=not resident_elsewhere),
            ],
        )


def test_replay_fill_takes_closed_rounds_and_switches_of_the_run():
    reply = pb.RoundsReply(
        rounds=[
            pb.RoundRecord(
                instance="c",
                index=0,
                wall_s=2,
                active_s=1.5,
                switch_s=0.5,
                sp_admitted=2,
                sp_parked=1,
                age_s=9,
            ),
            pb.RoundRecord(instance="c", index=1, wall_s=1, active_s=1, age_s=100),
        ],  # before the run
        switches=[
            pb.SwitchRecord(instance="c", to_model="m", path="d2d", total_ms=20, age_s=8),
            pb.SwitchRecord(instance="c", to_model="n", path="h2d", total_ms=90, age_s=200),
        ],
    )
    opened = [
        CallRecord("s", 0, "m", "c", 0, 1, 2, opened_model=True, call_id=f"chatcmpl-{x}")
        for x in "ab"
    ]
    run = RunResult("real", wall_clock_s=10.0, calls=opened)
    fill(run, _FakeAdmin(reply))
    row = row_metrics(run)
    assert row.avoidable_opens == 1 and row.model_opens == 2
    assert (
        row.rounds == 1
        and row.switch_share == pytest.approx(0.25)
        and (row.sp_admitted, row.sp_parked) == (2, 1)
    )
    assert list(row.switch_by_path) == ["d2d"] and row.switch_by_path["d2d"].p50_s == pytest.approx(
        0.02
    )
    assert row.hbm_peak_gib is None  # nothing sampled: not measured, not 0


def test_unmeasured_columns_print_a_dash():
    from rich.console import Console

    from talariad.replay.report import columns

    run = RunResult("real", unmeasured=ADMIN_METRICS | REPLAY_UNMEASURED)
    console = Console(width=400, record=True)
    console.print(table([run]))
    line = next(x for x in console.export_text().splitlines() if x.startswith("│ real"))
    cells = [c.strip() for c in line.strip("│").split("│")]
    by = dict(zip((c[0] for c in columns(None)), cells, strict=False))
    for name in ("switch share", "rounds", "switches", "HBM peak GiB", "avoidable opens"):
        assert by[name] == "-", name
    assert by["SP adm/parked"] == by["parked calls/times"] == "-/-"
    assert by["park cost s"] == "-"


def test_worker_rotation_unload_retires_the_active_model():
    import asyncio

    from talariad.config import parse_config
    from talariad.engine.build import build_worker
    from talariad.wire.messages import GenerateRequest
    from tests.support.worker import call_events

    cfg = parse_config(
        {
            "models": [{"name": "a"}, {"name": "b"}],
            "instances": [{"name": "c", "pool": "cold", "models": ["a", "b"], "time_scale": 0.01}],
        },
        "t",
    )

    async def scenario():
        worker = build_worker(cfg, cfg.instances[0])
        loop = asyncio.create_task(worker.run())
        events = [
            e
            async for e in call_events(
                worker, GenerateRequest(call_id="1", model="a", prompt="x y", max_tokens=2)
            )
        ]
        assert events[-1].type == "done" and worker.core.sched.active == "a"
        assert worker.set_rotation("a", False) is None and worker.core.models == ["b"]
        for _ in range(100):
            await asyncio.sleep(0.01)
            if worker.core.sched.active == "b":
                break
        refused = [
            e
            async for e in call_events(
                worker, GenerateRequest(call_id="2", model="a", prompt="x", max_tokens=1)
            )
        ]
        assert refused[0].type == "error" and refused[0].code == "model_not_loaded"
        assert "last model" in worker.set_rotation("b", False)
        assert "not configured" in worker.set_rotation("z", True)
        assert worker.set_rotation("a", True) is None and worker.core.models == ["a", "b"]
        report = worker.core.rounds(worker.now(), 10)
        assert [w["to_model"] for w in report["switches"]] == ["a", "b"]
        assert report["rounds"][0]["slots"][0]["model"] == "a"
        loop.cancel()
        return worker

    worker = asyncio.run(scenario())
    assert worker.core.sched.active == "b"


def test_ctl_status_shows_the_models_the_router_retired_beside_the_rotation():
    from talaria_ctl.instances import _rotation

    assert _rotation({"rotation": ["a", "b"], "retired": ["b"]}) == "a, b (retired: b)"
    assert _rotation({"rotation": ["a"], "retired": []}) == "a"
    assert _rotation({"rotation": []}) == "-"


def test_readiness_counts_failed_polls_not_seconds():
    """A stalled instance's polls each run to the poll timeout (2 s): it stays ready until the
    N-th of them has failed, however long they took."""
    from talariad.gateway.health import Readiness

    r = Readiness(unready_after=3)
    r.polled("cold0", True, 0.0)
    r.polled("cold0", False, 2.25)
    r.polled("cold0", False, 4.5)
    assert r.ready("cold0") and r.failed_polls("cold0") == 2  # the third poll still runs
    r.polled("cold0", False, 6.75)
    assert not r.ready("cold0")


def _view(name="cold0", **kw):
    from talariad.gateway.health import InstanceView

    base = dict(
        hosts=("tiny-chat", "tiny-code"),
        serving=("tiny-chat", "tiny-code"),
        state="ready",
        ready=True,
        admission="open",
        failed_polls=0,
    )
    return InstanceView(name, **{**base, **kw})


@pytest.mark.parametrize(
    "change, why",
    [
        ({"admission": "drained"}, "cold0 is drained"),
        ({"admission": "draining"}, "cold0 is draining"),
        ({"admission": "cordoned"}, "cold0 is cordoned"),
        ({"serving": ("tiny-chat",)}, "cold0 has tiny-code unloaded"),
        ({"state": "backoff", "ready": False}, "cold0 is not running (backoff)"),
        ({"ready": False, "failed_polls": 3}, "cold0 is unready (3 failed telemetry polls)"),
    ],
)
def test_a_model_whose_instances_cannot_take_calls_is_unavailable_with_the_reason(change, why):
    from talariad.gateway.health import availability

    hot = _view("hot0", hosts=("tiny-chat",), serving=("tiny-chat",))
    views = [hot, _view(**change)]
    code = availability("tiny-code", views)
    assert code.takers == [] and code.why == why
    chat = availability("tiny-chat", views)
    assert "hot0" in chat.takers and chat.why is None
    assert availability("tiny-code", [hot, _view()]).takers == ["cold0"]
    assert availability("ghost", views).why == "no instance serves it"


def test_ctl_memory_layout_rows_never_overlap(tmp_path):
    """Staged chunks lie inside the KV pool: the table shows the pool's pieces around them, so
    every byte of the buffer is in exactly one row."""
    from typer.testing import CliRunner

    from talaria_ctl.main import app
    from tests.tui.fake_admin import serve

    server, _ = serve(str(tmp_path / "admin.sock"))
    try:
        r = CliRunner().invoke(
            app, ["--socket", str(tmp_path / "admin.sock"), "instance", "memory", "cold0"]
        )
    finally:
        server.stop(grace=None)
    assert r.exit_code == 0, r.output
    rows = []
    for line in r.stdout.splitlines():
        cells = line.split()
        if len(cells) == 4 and cells[0].startswith(
            ("weights", "kv_pool", "staged", "graph", "run")
        ):
            rows.append((cells[0], float(cells[1]), float(cells[2])))
    assert [n for n, _, _ in rows] == [
        "weights",
        "kv_pool",
        "staged[0]",
        "staged[1]",
        "graph_pool",
        "runtime",
    ]
    for (_, offset, size), (_, nxt, _) in zip(rows, rows[1:], strict=False):
        assert offset + size == nxt, rows  # each row ends where the next begins
    assert rows[-1][1] + rows[-1][2] == 256.0
