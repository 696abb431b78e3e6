"""Telemetry sessions as changes: the instance API sends what changed since the gateway's view, the
poller passes its view back, and the router shell's merged view equals the instance's full list."""

from __future__ import annotations

import asyncio
import pathlib

import httpx

from talariad.config import load_config
from talariad.engine.api import build_app
from talariad.engine.build import build_worker, model_profile
from talariad.gateway.instances import InstanceDirectory
from talariad.gateway.routing import RouterShell, router_knobs
from talariad.router.sessions import SessionTable
from talariad.types import KVState
from talariad.wire.messages import ChatMessage, GenerateRequest
from tests.support.worker import call_events

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _setup():
    cfg = load_config(ROOT / "etc" / "talaria.yaml")
    cfg = cfg.model_copy(
        update={
            "instances": [
                i.model_copy(update={"executor": "sim", "time_scale": 0.01}) for i in cfg.instances
            ]
        }
    )
    inst = next(i for i in cfg.instances if i.pool == "hot")
    worker = build_worker(cfg, inst)
    shell = RouterShell.from_config(cfg, {m.name: model_profile(cfg, m.name) for m in cfg.models})
    seen: list[int] = []  # payload bytes per poll
    directory = InstanceDirectory(
        lambda: {inst.name: "http://instance"},
        0.25,
        on_telemetry=shell.observe,
        on_payload=lambda name, n: seen.append(n),
    )
    directory.client.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(worker)))
    return cfg, inst, worker, shell, directory, seen


async def _serve(worker, model: str, sessions: range) -> None:
    for n in sessions:
        req = GenerateRequest(
            call_id=f"c{n}",
            session_id=f"s{n}",
            model=model,
            max_tokens=1,
            messages=[ChatMessage(role="user", content=f"hello {n}")],
        )
        async for _ in call_events(worker, req):
            pass


def _router_view(shell, name):
    inst = shell.router._instances.get(name)
    return {k: (v.state, v.kv_len) for k, v in inst.snapshot.sessions.items()}


def _instance_view(worker):
    return {
        (s.session_id, s.model): (KVState(s.state), s.kv_len) for s in worker.telemetry().sessions
    }


async def test_polls_carry_only_changes_and_the_merged_view_matches_the_instance():
    cfg, inst, worker, shell, directory, sizes = _setup()
    model = inst.models[0]
    loop = asyncio.create_task(worker.run())
    try:
        await _serve(worker, model, range(200))
        await directory.poll_once()  # the first poll: the whole list
        first = directory.snapshot(inst.name)
        assert first.sessions_base is None and len(first.sessions) == 200
        await directory.poll_once()  # nothing changed: no sessions at all
        quiet = directory.snapshot(inst.name)
        assert quiet.sessions_base == first.sessions_epoch and quiet.sessions == []
        assert sizes[1] * 20 < sizes[0]
        await _serve(worker, model, range(200, 205))
        await directory.poll_once()
        delta = directory.snapshot(inst.name)
        assert {s.session_id for s in delta.sessions} == {f"s{n}" for n in range(200, 205)}
        assert _router_view(shell, inst.name) == _instance_view(worker)
    finally:
        loop.cancel()
        await directory.aclose()


async def test_a_consumer_whose_view_is_not_the_latest_gets_the_whole_list():
    cfg, inst, worker, shell, directory, _ = _setup()
    loop = asyncio.create_task(worker.run())
    try:
        await _serve(worker, inst.models[0], range(20))
        await directory.poll_once()
        other = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=directory.client.http._transport.app)
        )
        await other.get(
            "http://instance/internal/telemetry"
        )  # another poller moves the instance's view on
        await directory.poll_once()
        again = directory.snapshot(inst.name)
        assert again.sessions_base is None and len(again.sessions) == 20
        assert _router_view(shell, inst.name) == _instance_view(worker)
        await other.aclose()
    finally:
        loop.cancel()
        await directory.aclose()


def test_the_session_table_forgets_the_least_recently_used_past_its_bound():
    table = SessionTable(max_rows=3)
    for n in range(4):
        table.completed(f"s{n}", "m", "i0", KVState.DEVICE, 100, float(n))
    assert table.get("s0") is None and table.kv_record("s0", "m") is None
    table.touch("s1", "i0", "m", 100, 5.0)  # s1 is now the most recent
    table.completed("s9", "m", "i0", KVState.DEVICE, 100, 6.0)
    assert table.get("s2") is None and table.get("s1") is not None and len(table) == 3


def test_session_bounds_come_from_the_config():
    cfg = load_config(ROOT / "etc" / "talaria.yaml")
    assert cfg.policy.session_idle_s == 3600 and cfg.policy.max_sessions == 100_000
    cfg = cfg.model_copy(
        update={"policy": cfg.policy.model_copy(update={"session_idle_s": 60.0, "max_sessions": 5})}
    )
    knobs = router_knobs(cfg)
    assert knobs.session_idle_s == 60.0 and knobs.max_sessions == 5


def test_session_deltas_report_changes_and_removals_against_the_consumers_view():
    from talariad.engine.deltas import SessionDeltas
    from talariad.wire.messages import KVLocation as Msg
    from talariad.wire.messages import Telemetry

    def tel(*rows):
        return Telemetry(
            instance="i",
            version=1,
            pool="cold",
            models=["m"],
            active_model=None,
            loaded_models=[],
            sessions=[Msg(session_id=s, model="m", state=st, kv_len=n) for s, st, n in rows],
        )

    d = SessionDeltas()
    full = d.apply(tel(("a", "device", 10), ("b", "host", 20)), None)
    assert full.sessions_base is None and len(full.sessions) == 2
    delta = d.apply(
        tel(("a", "device", 10), ("b", "device", 25), ("c", "device", 5)), full.sessions_epoch
    )
    assert delta.sessions_base == full.sessions_epoch and delta.sessions_removed == []
    assert [(s.session_id, s.state, s.kv_len) for s in delta.sessions] == [
        ("b", "device", 25),
        ("c", "device", 5),
    ]
    gone = d.apply(tel(("b", "device", 25)), delta.sessions_epoch)
    assert gone.sessions == [] and sorted(map(tuple, gone.sessions_removed)) == [
        ("a", "m"),
        ("c", "m"),
    ]
    stale = d.apply(tel(("b", "device", 25)), full.sessions_epoch)  # an older view: the whole list
    assert stale.sessions_base is None and [s.session_id for s in stale.sessions] == ["b"]


class _CountingEntries(dict):
    """A ledger's entries that count the walks over all of them."""

    walks = 0

    def items(self):
        type(self).walks += 1
        return super().items()

    def __iter__(self):
        type(self).walks += 1
        return super().__iter__()


async def test_a_call_does_not_walk_every_session_of_the_instance():
    """A sim instance's call costs the same with 10 or 10,000 live sessions: its device KV comes
    from the ledger's running totals, and forgetting a session reads only that session."""
    _, inst, worker, *_ = _setup()
    model = inst.models[0]
    loop = asyncio.create_task(worker.run())
    try:
        await _serve(worker, model, range(50))
        ledger = worker.core.sched.ledger
        ledger.entries = _CountingEntries(ledger.entries)
        await _serve(worker, model, range(50, 60))  # new sessions
        await _serve(worker, model, range(0, 10))  # returns
        assert worker.core.forget("s3") and not worker.core.forget("s3")
        assert _CountingEntries.walks == 0
        assert len(ledger.entries) == 59
        ledger.check_integrity()
    finally:
        loop.cancel()
