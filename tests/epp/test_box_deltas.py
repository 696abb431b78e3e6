"""Box snapshots as changes (`?since=`), end to end without processes: an instance's session
rows go out as its telemetry deltas (`SessionDeltas`), the box's `RouterShell` merges them and
logs what changed, `PoolEndpoint` answers a token with the changes to the box's session view
since, and the picker (`BoxPicker.box_seen`) merges them into the view it holds. Whatever happens
in between (lost replies, restarts, instances out and back, a log too short, a view over the
bound), the picker's view equals a fresh whole snapshot's, and so does the target its router
installs with O(changes) work."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from hypothesis import example, given, settings
from hypothesis import strategies as st

from talariad.engine.deltas import SessionDeltas
from talariad.epp.boxpicker import BoxPicker
from talariad.gateway.pool import PoolEndpoint, SessionLog
from talariad.gateway.routing import RouterShell
from talariad.router import Router, RouterKnobs
from talariad.types import KVState
from talariad.wire.box import BoxSnapshot
from talariad.wire.messages import Telemetry
from tests.support.props import examples

INSTANCES = ("i0", "i1")


class FakeDaemon:
    """The daemon's side: instances with session rows, the shell that merges their telemetry,
    the pool endpoint that serves it."""

    def __init__(self, max_sessions: int, max_changes: int) -> None:
        self.shell = RouterShell(Router(RouterKnobs(), {}))
        self.pool = PoolEndpoint("t", max_sessions)
        self.pool.log = SessionLog(max_changes)
        self.shell.merged = self.pool.log.record
        self.rows = {n: {} for n in INSTANCES}
        self.deltas = {n: SessionDeltas() for n in INSTANCES}
        self.since: dict[str, int | None] = dict.fromkeys(INSTANCES)
        self.latest: dict[str, Telemetry] = {}
        self.version = 0
        self.down: set[str] = set()  # instances the box takes no calls for
        self.gw = SimpleNamespace(
            routing=self.shell,
            directory=SimpleNamespace(snapshot=self.latest.get, age_s=lambda name, now: 0.0),
            cfg=SimpleNamespace(models=[], instances=[SimpleNamespace(name=n) for n in INSTANCES]),
            ready=lambda name: name not in self.down,
        )

    def telemetry(self, name: str, lost: bool) -> None:
        """The gateway polls `name` (`lost`: the reply never arrives)."""
        self.version += 1
        t = Telemetry(
            instance=name, version=self.version, pool="hot", models=[], active_model=None,
            loaded_models=[],
        )  # fmt: skip
        rows = [(k, state, n) for k, (state, n) in self.rows[name].items()]
        t = self.deltas[name].apply(t, self.since[name], rows)
        if lost:
            return
        self.since[name] = t.sessions_epoch
        self.latest[name] = t
        self.shell.observe(t, float(self.version))

    def restart(self, name: str) -> None:
        """The instance restarts: its sessions are gone, its telemetry starts a new view."""
        self.rows[name], self.deltas[name] = {}, SessionDeltas()

    def snapshot(self, since: int | None) -> BoxSnapshot:
        snap = self.pool.snapshot(self.gw, 0.0, since)
        return BoxSnapshot.model_validate_json(snap.model_dump_json())  # as on the wire


KEYS = st.tuples(st.sampled_from(["a", "b", "c", "d", "e"]), st.sampled_from(["m1", "m2"]))
LOST = st.sampled_from([False, False, False, True])  # a reply lost now and then
ARGS = {
    "set": st.tuples(
        st.sampled_from(INSTANCES),
        KEYS,
        st.sampled_from([KVState.DEVICE, KVState.HOST]),
        st.integers(1, 4),
    ),
    "drop": st.tuples(st.sampled_from(INSTANCES), KEYS),
    "telemetry": st.tuples(st.sampled_from(INSTANCES), LOST),
    "restart": st.tuples(st.sampled_from(INSTANCES)),
    "health": st.tuples(st.sampled_from(INSTANCES)),
    "poll": st.tuples(LOST),
    "box restart": st.just(()),
}
KINDS = ["set"] * 4 + ["telemetry"] * 4 + ["poll"] * 3 + ["drop"] * 2
KINDS += ["restart", "box restart", "health"]
STEPS = st.sampled_from(KINDS).flatmap(lambda k: ARGS[k].map(lambda args: (k, *args)))


A, B, C = ("a", "m1"), ("b", "m1"), ("c", "m1")
DEVICE, HOST = KVState.DEVICE, KVState.HOST


@settings(max_examples=examples(300), deadline=None)
@example(  # a removal goes out as a change
    [("set", "i0", A, DEVICE, 1), ("set", "i0", B, DEVICE, 1), ("telemetry", "i0", False)]
    + [("poll", False), ("drop", "i0", A), ("telemetry", "i0", False), ("poll", False)],
    100,
    8,
)
@example(  # a view cut to the bound, then back under it: sent whole, not as changes to the cut
    [("set", "i0", A, DEVICE, 2), ("set", "i0", B, DEVICE, 2), ("set", "i0", C, HOST, 1)]
    + [("telemetry", "i0", False), ("poll", False), ("drop", "i0", A), ("telemetry", "i0", False)],
    2,
    8,
)
@given(
    st.lists(STEPS, min_size=10, max_size=80), st.sampled_from([2, 5, 100, 100]), st.integers(1, 8)
)
def test_merged_changes_equal_a_fresh_whole_view(steps, max_sessions, max_changes):
    box, picker = FakeDaemon(max_sessions, max_changes), BoxPicker(Router(RouterKnobs(), {}))
    for step in steps:
        kind, args = step[0], step[1:]
        if kind == "set":
            name, key, state, n = args
            box.rows[name][key] = (state, n)
        elif kind == "drop":
            box.rows[args[0]].pop(args[1], None)
        elif kind == "telemetry":
            box.telemetry(*args)
        elif kind == "restart":
            box.restart(args[0])
        elif kind == "health":  # the instance goes out of the box's service, or comes back
            box.down ^= {args[0]}
        elif kind == "box restart":  # a new daemon: its log knows no old token
            box = FakeDaemon(max_sessions, max_changes)
        else:
            _poll(picker, box, lost=args[0])
    _poll(picker, box, lost=False)
    whole = box.snapshot(None).target
    fresh: dict = {}
    whole.merge_into(fresh)
    assert picker._held["box"].sessions == fresh
    installed = picker.router._instances.get("box").snapshot
    expected = whole.placement_target("box", installed.version, installed.taken_at, fresh, None)
    assert installed == dataclasses.replace(expected, sessions_changed=installed.sessions_changed)
    picker.router.check_integrity()


def _poll(picker: BoxPicker, box: FakeDaemon, lost: bool) -> None:
    snap = box.snapshot(picker.since("box"))
    if lost:  # the reply is lost: the picker keeps its view and token
        return
    assert picker.box_seen("box", "10.0.0.1:80", snap, 0.0)
    picker.router.check_integrity()  # its index of who holds which session, among others


def test_a_quiet_box_sends_no_sessions():
    box = FakeDaemon(100, 100)
    box.rows["i0"][("s", "m1")] = (KVState.DEVICE, 3)
    box.telemetry("i0", lost=False)
    first = box.snapshot(None)
    assert len(first.target.sessions) == 1 and first.target.sessions_base is None
    again = box.snapshot(first.sessions_epoch)
    assert again.target.sessions == [] and again.target.sessions_removed == []
    assert again.target.sessions_base == first.sessions_epoch


def test_a_prefix_counts_at_its_best_place_on_the_box():
    box = FakeDaemon(100, 100)
    box.rows["i0"][A] = (HOST, 4)
    box.rows["i1"][A] = (DEVICE, 2)
    for name in INSTANCES:
        box.telemetry(name, lost=False)
    first = box.snapshot(None)
    assert [(s.state, s.kv_len) for s in first.target.sessions] == [(DEVICE, 2)]
    del box.rows["i1"][A]
    box.telemetry("i1", lost=False)
    delta = box.snapshot(first.sessions_epoch)
    assert [(s.state, s.kv_len) for s in delta.target.sessions] == [(HOST, 4)]
    box.down.add("i0")  # the box takes no call for i0: its prefixes count for nothing
    again = box.snapshot(delta.sessions_epoch)
    assert again.target.sessions_base is None and again.target.sessions == []
    assert again.target.basis == [("i1", box.version)] and again.target.instances == 1


def test_a_change_to_a_view_not_held_asks_for_it_whole():
    box = FakeDaemon(100, 100)
    box.rows["i0"][("s", "m1")] = (KVState.DEVICE, 3)
    box.telemetry("i0", lost=False)
    token = box.snapshot(None).sessions_epoch
    picker = BoxPicker(Router(RouterKnobs(), {}))
    assert not picker.box_seen("box", "10.0.0.1:80", box.snapshot(token), 0.0)
    assert picker.since("box") is None and picker.healthy_boxes(0.0) == []


def test_a_box_resending_the_target_installed_does_not_install_it_again():
    box, picker = FakeDaemon(100, 100), BoxPicker(Router(RouterKnobs(), {}))

    def poll(now: float) -> None:
        assert picker.box_seen("box", "10.0.0.1:80", box.snapshot(picker.since("box")), now)

    box.rows["i0"][A] = (DEVICE, 3)
    box.telemetry("i0", lost=False)
    poll(0.0)
    poll(0.1)  # the same reply of i0, nothing changed
    assert picker._versions["box"] == 1
    box.telemetry("i0", lost=False)  # a new reply, the same sessions
    poll(0.2)
    box.rows["i0"][B] = (DEVICE, 3)
    box.telemetry("i0", lost=False)
    poll(0.3)
    assert picker._versions["box"] == 3
    assert picker.healthy_boxes(0.3) == ["box"]
