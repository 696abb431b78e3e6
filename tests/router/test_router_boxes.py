"""Boxes as placement targets (`router.boxes`): what a box's projection keeps of its instances,
and the same `Router` placing calls on boxes."""

from __future__ import annotations

from talariad.router import ModelResidency, ModelState
from talariad.router.boxes import best_prefixes, box_snapshot
from talariad.types import KVState, Pool
from tests.router.router_factories import MODEL, Snaps, call, router

OTHER = "m2"


def _box(snaps: Snaps, name: str, now: float, *instances):
    return box_snapshot(name, snaps.versions.get(name, 0) + 1, now, list(instances))


def test_each_model_reads_the_instance_the_box_would_use():
    snaps = Snaps()
    hot = snaps("hot0", 0.0, pool=Pool.HOT, round_remaining_s=0.0)
    cold = snaps(
        "cold0",
        0.0,
        models={
            MODEL: ModelResidency(ModelState.RESIDENT, queued_tokens=50),
            OTHER: ModelResidency(ModelState.RESIDENT, queued_tokens=7),
        },
        allowed=(MODEL, OTHER),
        round_remaining_s=1.5,
    )
    box = _box(snaps, "box-a", 0.0, hot, cold)
    assert box.allowed_models == {MODEL, OTHER}
    pinned, rotated = box.models[MODEL], box.models[OTHER]
    assert (pinned.state, pinned.slot_wait_s) == (ModelState.ACTIVE, 0.0)
    assert (rotated.state, rotated.queued_tokens, rotated.slot_wait_s) == (
        ModelState.RESIDENT,
        7,
        1.5,
    )


def test_a_session_prefix_counts_at_its_best_place_and_dead_instances_count_for_nothing():
    snaps = Snaps()
    on_host = snaps("i0", 0.0, sessions={"s1": (KVState.HOST, 900)})
    on_device = snaps("i1", 0.0, sessions={"s1": (KVState.DEVICE, 400)})
    dead = snaps("i2", 0.0, sessions={"s2": (KVState.DEVICE, 100)}, healthy=False)
    box = _box(snaps, "box-a", 0.0, on_host, on_device, dead)
    assert box.sessions[("s1", MODEL)].state is KVState.DEVICE
    assert ("s2", MODEL) not in box.sessions
    assert not _box(snaps, "box-b", 0.0, dead).healthy


def test_the_router_sends_a_return_to_the_box_holding_its_prefix():
    snaps, r = Snaps(), router()
    holding = snaps("i0", 0.0, sessions={"s1": (KVState.DEVICE, 4000)})
    r.observe(_box(snaps, "box-a", 0.0, snaps("i1", 0.0)), 0.0)
    r.observe(_box(snaps, "box-b", 0.0, holding), 0.0)
    d = r.place(call("c1", "s1", prompt=5000, prefix=4000), 0.1)
    assert d.instance == "box-b"
    d = r.place(call("c2", "s9", prompt=5000), 0.1)  # a new session: no prefix anywhere
    assert d.instance in {"box-a", "box-b"}


def test_the_best_place_of_some_pairs_is_their_best_place_in_the_whole_view():
    snaps = Snaps()
    held = [
        snaps("i0", 0.0, sessions={"s1": (KVState.HOST, 900), "s2": (KVState.DEVICE, 50)}),
        snaps("i1", 0.0, sessions={"s1": (KVState.DEVICE, 400), "s3": (KVState.HOST, 10)}),
    ]
    whole = best_prefixes(held)
    some = [("s1", MODEL), ("s3", MODEL), ("gone", MODEL)]
    assert best_prefixes(held, some) == {k: whole[k] for k in some if k in whole}


def test_an_installed_snapshot_holds_until_its_last_healthy_report():
    snaps, r = Snaps(), router()
    r.observe(snaps("i0", 1.0), 1.0)
    r.heartbeat("i0", 3.0)  # nothing changed: the snapshot still holds at 3.0
    ((snap, held_at),) = r.installed()
    assert (snap.instance, held_at) == ("i0", 3.0)
    r.heartbeat("i0", 4.0, healthy=False)  # a failed poll says nothing of the snapshot
    assert r.installed()[0][1] == 1.0
