"""Box snapshots as changes (`?since=`), end to end without processes: an instance's session
rows go out as its telemetry deltas (`SessionDeltas`), the box's `RouterShell` merges them and
logs what changed, `PoolEndpoint` answers a token with the changes to the box's session view
since, and the picker (`BoxPicker.box_seen`) merges them into the view it holds. Whatever happens
in between (lost replies, restarts, instances out and back, a log too short, a view over the
bound), the picker's view equals a fresh whole snapshot's, and so does the target its router
installs with O(changes) work."""

from __future__ import annotations

import asyncio
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
        self.shell.merged = self.pool.merged
        self.rows = {n: {} for n in INSTANCES}
        self.deltas = {n: SessionDeltas() for n in INSTANCES}
        self.since: dict[str, int | None] = dict.fromkeys(INSTANCES)
        self.latest: dict[str, Telemetry] = {}
        self.version = 0
        self.down: set[str] = set()  # instances the box takes no calls for
        self.kv: dict[str, float] = dict.fromkeys(INSTANCES, 0.0)  # each one's KV occupancy
        self.gw = SimpleNamespace(
            routing=self.shell,
            directory=SimpleNamespace(snapshot=self.latest.get, age_s=lambda name, now: 0.0),
            cfg=SimpleNamespace(models=[], instances=[SimpleNamespace(name=n) for n in INSTANCES]),
            ready=lambda name: name not in self.down,
            clock=lambda: 0.0,
        )

    def telemetry(self, name: str, lost: bool) -> None:
        """The gateway polls `name` (`lost`: the reply never arrives)."""
        self.version += 1
        t = Telemetry(
            instance=name, version=self.version, pool="hot", models=[], active_model=None,
            loaded_models=[], kv_occupancy=self.kv[name],
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

    def answer(self, since: int | None, etag: str | None, now: float = 0.0) -> BoxSnapshot | float:
        """A conditional poll: the snapshot, or the target's age (a `304`)."""
        got = self.pool.answer(self.gw, now, since, etag)
        return (
            got
            if isinstance(got, float)
            else BoxSnapshot.model_validate_json(got.model_dump_json())
        )


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
    "load": st.tuples(st.sampled_from(INSTANCES), st.sampled_from([0.0, 0.5])),
    "poll": st.tuples(LOST),
    "box restart": st.just(()),
}
KINDS = ["set"] * 4 + ["telemetry"] * 4 + ["poll"] * 3 + ["drop"] * 2
KINDS += ["restart", "box restart", "health", "load"]
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
@example(  # the target changes, no session does: not the same snapshot
    [("set", "i0", A, DEVICE, 1), ("telemetry", "i0", False), ("poll", False)]
    + [("load", "i0", 0.5), ("telemetry", "i0", False), ("poll", False)],
    100,
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
        elif kind == "load":  # the target changes, no session does
            box.kv[args[0]] = args[1]
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
    """A conditional poll, as the poller sends it: a box that answers `304` while anything it
    would send changed fails the comparison with a fresh whole view."""
    since = picker.since("box")
    got = box.answer(since, None if since is None else picker.etag("box"))
    if lost:  # the reply is lost: the picker keeps its view and token
        return
    if isinstance(got, float):
        assert picker.box_same("box", got, 0.0)
    else:
        assert picker.box_seen("box", "10.0.0.1:80", got, 0.0)
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


def _seen(picker: BoxPicker, box: FakeDaemon, now: float, box_now: float = 0.0) -> str:
    """One conditional poll at `now` handed to the picker: "same" (a `304`) or "seen"."""
    since = picker.since("box")
    got = box.answer(since, None if since is None else picker.etag("box"), box_now)
    if isinstance(got, float):
        assert picker.box_same("box", got, now)
        return "same"
    assert picker.box_seen("box", "10.0.0.1:80", got, now)
    return "seen"


def test_an_unchanged_box_answers_with_its_age_only_and_stays_fresh():
    box, picker = FakeDaemon(100, 100), BoxPicker(Router(RouterKnobs(), {}))
    box.rows["i0"][A] = (DEVICE, 3)
    box.telemetry("i0", lost=False)  # i0's reply at the box's 1.0
    assert _seen(picker, box, 0.0, box_now=1.0) == "seen"
    assert picker.etag("box") is not None
    # ten seconds of polls: new telemetry replies that say the same, no session changed; the
    # box's instances heard from just now, so the target stands, installed again by its age
    answers = []
    for step in range(1, 101):
        now = step * 0.1
        if step % 3 == 0:
            box.telemetry("i0", lost=False)  # a new basis, the same content
        answers.append(_seen(picker, box, now, box_now=box.version))
        assert picker.healthy_boxes(now) == ["box"], now
    assert set(answers) == {"same"}
    assert 10 <= picker._versions["box"] <= 21  # renewed every quarter staleness bound, no more
    installed = picker.router._instances.get("box").snapshot
    assert installed.sessions == {A: installed.sessions[A]} and installed.taken_at > 9.0
    picker.router.check_integrity()


def test_an_answering_box_whose_instances_went_quiet_goes_stale():
    """Freshness is the target's age, not the poll's: a box answers, but its instances' last
    telemetry is older than the staleness bound."""
    box, picker = FakeDaemon(100, 100), BoxPicker(Router(RouterKnobs(), {}))
    box.telemetry("i0", lost=False)  # at the box's 1.0
    assert _seen(picker, box, 10.0, box_now=1.0) == "seen"
    for now in (10.5, 11.0, 11.5, 12.0, 12.5):
        assert _seen(picker, box, now, box_now=now - 9.0) == "same"  # its age grows
    assert picker.healthy_boxes(12.5) == []
    assert picker.status(12.5)["boxes"][0]["state"] == "stale"


def test_a_changed_box_is_installed_and_a_lost_view_asked_for_whole():
    box, picker = FakeDaemon(100, 100), BoxPicker(Router(RouterKnobs(), {}))
    box.rows["i0"][A] = (DEVICE, 3)
    box.telemetry("i0", lost=False)
    assert _seen(picker, box, 0.0) == "seen"
    assert _seen(picker, box, 0.1) == "same"
    box.rows["i0"][B] = (HOST, 2)
    box.telemetry("i0", lost=False)
    assert _seen(picker, box, 0.2) == "seen"
    assert set(picker.router._instances.get("box").snapshot.sessions) == {A, B}
    assert picker._versions["box"] == 2
    box.down.add("i0")  # the box takes no call for its only instance: unhealthy
    assert _seen(picker, box, 0.3) == "seen" and picker.healthy_boxes(0.3) == []
    # a picker that let the view go (a box gone and back) asks for it whole, unconditionally
    picker.box_gone("box", 0.4)
    assert not picker.box_same("box", 0.0, 0.4)
    assert picker.since("box") is None and picker.etag("box") is None


def test_an_etag_names_the_whole_state_a_picker_holds():
    """Two pickers on one box: each gets `304` only for what it holds."""
    box = FakeDaemon(100, 100)
    box.telemetry("i0", lost=False)
    first = box.answer(None, None)
    assert isinstance(first, BoxSnapshot) and first.etag
    assert isinstance(box.answer(first.sessions_epoch, first.etag), float)
    assert isinstance(box.answer(first.sessions_epoch, '"0-0"'), BoxSnapshot)
    assert isinstance(box.answer(None, first.etag), BoxSnapshot)  # a whole view asked for
    box.rows["i0"][A] = (DEVICE, 1)
    box.telemetry("i0", lost=False)
    later = box.answer(first.sessions_epoch, first.etag)
    assert isinstance(later, BoxSnapshot) and later.etag != first.etag
    assert [s.session_id for s in later.target.sessions] == ["a"]
    box.kv["i0"] = 0.5  # the target changes, no session does
    box.telemetry("i0", lost=False)
    loaded = box.answer(later.sessions_epoch, later.etag)
    assert isinstance(loaded, BoxSnapshot) and loaded.target.kv_occupancy == 0.5
    assert loaded.target.sessions == [] and loaded.sessions_epoch == later.sessions_epoch


def test_a_held_poll_is_answered_when_the_box_changes_and_not_before():
    box = FakeDaemon(100, 100)
    box.telemetry("i0", lost=False)
    first = box.answer(None, None)
    assert isinstance(first, BoxSnapshot)

    async def run() -> BoxSnapshot | float:
        held = asyncio.create_task(
            box.pool.answer_held(box.gw, first.sessions_epoch, first.etag, 60.0)
        )
        for _ in range(5):
            await asyncio.sleep(0)
        box.telemetry("i0", lost=False)  # a new reply that says the same: held on
        for _ in range(5):
            await asyncio.sleep(0)
        assert not held.done()
        box.rows["i0"][A] = (DEVICE, 2)
        box.telemetry("i0", lost=False)
        return await asyncio.wait_for(held, 10)

    got = asyncio.run(run())
    assert isinstance(got, BoxSnapshot) and got.etag != first.etag
    assert [s.session_id for s in got.target.sessions] == ["a"]
    # nothing changes: the hold ends with the age
    again = asyncio.run(box.pool.answer_held(box.gw, got.sessions_epoch, got.etag, 0.01))
    assert isinstance(again, float)


def test_a_stream_installed_frame_by_frame_holds_the_box_as_a_whole_view_does():
    """A snapshot stream's frames (`PoolEndpoint.stream`), each installed as the poller does:
    the view held is the box's whole one; models are sent once, then only as they change."""
    box, picker = FakeDaemon(100, 100), BoxPicker(Router(RouterKnobs(), {}))
    steps = [("i0", A, DEVICE, 3), ("i1", B, HOST, 2), ("i0", A, HOST, 5), ("i1", C, DEVICE, 1)]
    for name in INSTANCES:  # an instance's first view replaces none: the next would be whole
        box.telemetry(name, lost=False)

    async def run() -> list:
        frames, seen = box.pool.stream(box.gw, None, None, 0.01, 0.0), []
        for step in [None, *steps, None]:  # the last: nothing changed, the target's age
            if step is not None:
                name, key, state, n = step
                box.rows[name][key] = (state, n)
                box.telemetry(name, lost=False)
            line = await anext(frames)
            assert line.endswith(b"\n")
            if line[:1] == b"{":
                frame = BoxSnapshot.model_validate_json(line)
                assert picker.box_seen("box", "10.0.0.1:80", frame, 0.0)
            else:
                frame = float(line)
                assert picker.box_same("box", frame, 0.0)
            seen.append(frame)
        await frames.aclose()
        return seen

    seen = asyncio.run(run())
    assert [type(f) for f in seen] == [BoxSnapshot] * (len(steps) + 1) + [float]
    assert seen[0].models == [] and all(f.models is None for f in seen[1:-1])
    assert all(f.target.sessions_base is not None for f in seen[1:-1])  # as changes
    fresh: dict = {}
    box.snapshot(None).target.merge_into(fresh)
    assert picker._held["box"].sessions == fresh and len(fresh) == 3
    picker.router.check_integrity()


def test_a_frame_with_the_models_before_and_none_held_asks_anew():
    box = FakeDaemon(100, 100)
    box.telemetry("i0", lost=False)
    frame = box.snapshot(None).model_copy(update={"models": None})
    picker = BoxPicker(Router(RouterKnobs(), {}))
    assert not picker.box_seen("box", "10.0.0.1:80", frame, 0.0)
    assert picker.since("box") is None and picker.healthy_boxes(0.0) == []
