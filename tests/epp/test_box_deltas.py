"""Box snapshots as changes (`?since=`), end to end without processes: an instance's session
rows go out as its telemetry deltas (`SessionDeltas`), the box's `RouterShell` merges them and
logs what changed, `PoolEndpoint` answers a token with the changes since, and the picker's
`merge_views` applies them. Whatever happens in between (lost replies, restarts, a log too short,
a view over the bound), the picker's views equal a fresh whole snapshot's, and so does the box's
projection its router installs with O(changes) work."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import example, given, settings
from hypothesis import strategies as st

from talariad.engine.deltas import SessionDeltas
from talariad.epp.boxpicker import BoxPicker
from talariad.epp.poller import BoxViews, merge_views, project
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
        self.gw = SimpleNamespace(
            routing=self.shell,
            directory=SimpleNamespace(snapshot=self.latest.get, age_s=lambda name, now: 0.0),
            cfg=SimpleNamespace(models=[], instances=[SimpleNamespace(name=n) for n in INSTANCES]),
            ready=lambda name: True,
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
    "poll": st.tuples(LOST),
    "box restart": st.just(()),
}
KINDS = ["set"] * 4 + ["telemetry"] * 4 + ["poll"] * 3 + ["drop"] * 2 + ["restart", "box restart"]
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
    box, picker = FakeDaemon(max_sessions, max_changes), Picker()
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
        elif kind == "box restart":  # a new daemon: its log knows no old token
            box = FakeDaemon(max_sessions, max_changes)
        else:
            picker.poll(box, lost=args[0])
    picker.poll(box, lost=False)
    whole = box.snapshot(None)
    fresh = BoxViews()
    assert merge_views(fresh, whole, None)
    assert picker.held.instances == fresh.instances
    assert picker.installed.sessions == project("box", 1, whole, 0.0).sessions
    picker.router.check_integrity()


class Picker:
    """The picker's side: the views it holds of the box, its token, its router."""

    def __init__(self) -> None:
        self.held, self.since, self.version = BoxViews(), None, 0
        self.router, self.installed = Router(RouterKnobs(), {}), None

    def poll(self, box: FakeDaemon, lost: bool) -> None:
        snap = box.snapshot(self.since)
        if lost:  # the reply is lost: the picker keeps its views and token
            return
        assert merge_views(self.held, snap, self.since)
        self.since, self.version = snap.sessions_epoch, self.version + 1
        self.installed = project("box", self.version, snap, 0.0, self.held)
        assert self.router.observe(self.installed, 0.0)
        self.router.check_integrity()  # its index of who holds which session, among others


def test_a_quiet_box_sends_no_sessions():
    box = FakeDaemon(100, 100)
    box.rows["i0"][("s", "m1")] = (KVState.DEVICE, 3)
    box.telemetry("i0", lost=False)
    first = box.snapshot(None)
    assert [len(i.telemetry.sessions) for i in first.instances] == [1]
    again = box.snapshot(first.sessions_epoch)
    assert again.instances[0].telemetry.sessions == []
    assert again.instances[0].telemetry.sessions_base == first.sessions_epoch


def test_a_change_to_views_not_held_asks_for_them_whole():
    box = FakeDaemon(100, 100)
    box.rows["i0"][("s", "m1")] = (KVState.DEVICE, 3)
    box.telemetry("i0", lost=False)
    token = box.snapshot(None).sessions_epoch
    assert not merge_views(BoxViews(), box.snapshot(token), token)


def test_a_box_resending_the_replies_installed_is_not_projected_again():
    box, picker, held = FakeDaemon(100, 100), BoxPicker(Router(RouterKnobs(), {})), BoxViews()
    since = None

    def poll(now: float) -> None:
        nonlocal since
        snap = box.snapshot(since)
        assert merge_views(held, snap, since)
        since = snap.sessions_epoch
        picker.box_seen("box", "10.0.0.1:80", snap, now, held)

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
