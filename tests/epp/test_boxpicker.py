"""The pool's picker driven directly with `EPPRequest`s over boxes fed synthetic snapshots:
branch continuity, spreading by load, a lost box's sessions moving, overload and bad bodies
answered in the API's shapes."""

from __future__ import annotations

import dataclasses
import json

import pytest

from talariad.epp.boxpicker import HEADER_CALL_MAX_S, BoxPicker
from talariad.epp.contract import EPPRequest, ImmediateAnswer, Pick
from talariad.gateway.pool import box_target
from talariad.router import Router, RouterKnobs
from talariad.router.snapshot import router_snapshot
from talariad.types import LatencyProfile
from talariad.wire.box import BoxModel, BoxSnapshot
from talariad.wire.messages import Telemetry

MODEL = "m"
BOXES = {"a": "10.0.0.1:8000", "b": "10.0.0.2:8000"}


def _snap(round_load_s: float = 0.0) -> BoxSnapshot:
    """A box of one hot instance, as its daemon publishes it."""
    t = Telemetry(
        instance="i0",
        version=1,
        pool="hot",
        models=[MODEL],
        active_model=MODEL,
        loaded_models=[MODEL],
        opened_models=[MODEL],
        round_load_s=round_load_s,
        hbm_free_bytes=None,
    )
    box = Router(RouterKnobs(), {})
    box.observe(router_snapshot(t, t.models, 0.0, True), 0.0)
    target = box_target(box, 0.0, {"i0"})
    return BoxSnapshot(version=1, target=target, models=[BoxModel(name=MODEL, aliases=["al"])])


def _picker(overload: str = "queue", round_load_s: float = 0.0) -> BoxPicker:
    p = BoxPicker(Router(RouterKnobs(overload=overload), {}))
    for name, ep in BOXES.items():
        p.box_seen(name, ep, _snap(round_load_s), 0.0)
    return p


class Session:
    """An agent: each turn resends the conversation with one more exchange."""

    def __init__(self, sid: str, words: int = 10) -> None:
        self.sid, self.msgs, self.n = sid, [{"role": "system", "content": "tool " * words}], 0

    def request(self, path: str = "/v1/chat/completions", model: str = MODEL) -> EPPRequest:
        self.n += 1
        self.msgs.append({"role": "user", "content": f"turn {self.n} of {self.sid}"})
        body = {"model": model, "messages": self.msgs, "max_tokens": 64}
        if path == "/v1/messages":
            body = {"model": model, "messages": self.msgs[1:], "max_tokens": 64}
        call_id = f"{self.sid}-{self.n}"
        heads = {"x-session-id": self.sid}
        return EPPRequest(call_id, "POST", path, heads, json.dumps(body).encode())

    def answered(self) -> None:
        self.msgs.append({"role": "assistant", "content": f"answer {self.n}"})


def _box(p: BoxPicker, pick) -> str:
    assert isinstance(pick, Pick), pick
    return next(n for n, ep in p.endpoints.items() if ep == pick.endpoint)


def _turn(p: BoxPicker, s: Session, now: float, path: str = "/v1/chat/completions") -> str:
    req = s.request(path)
    box = _box(p, p.pick(req, now))
    p.served(req.call_id, p.endpoints[box], 200, now + 0.01)
    p.finished(req.call_id, True, now + 0.02)
    s.answered()
    return box


def test_every_call_of_a_session_branch_goes_to_one_box():
    p = _picker()
    s = Session("s1")
    boxes = {_turn(p, s, 0.1 * i, path) for i, path in enumerate(["/v1/chat/completions"] * 6)}
    assert len(boxes) == 1
    assert p.explain("s1-6").kind.value == "lease_hit"
    assert {c.instance for c in p.explain("s1-1").candidates} == set(BOXES)


def test_a_return_that_beats_envoys_end_report_still_hits_its_lease():
    p = _picker()
    s = Session("s1")
    first = s.request()
    home = _box(p, p.pick(first, 0.1))
    p.served(first.call_id, p.endpoints[home], 200, 0.11)
    s.answered()  # the client has the answer; Envoy's end-of-stream report is still on its way
    again = s.request()
    assert _box(p, p.pick(again, 0.12)) == home
    assert p.explain(again.call_id).kind.value == "lease_hit"
    p.finished(first.call_id, True, 0.13)  # the late report changes nothing
    assert p.status(0.13)["boxes"][0]["in_flight"] + p.status(0.13)["boxes"][1]["in_flight"] == 1


def test_a_second_session_spreads_by_load():
    p = _picker()
    big = Session("big", words=20_000)  # about 25k prompt tokens in flight on its box
    first = _box(p, p.pick(big.request(), 0.1))
    other = _box(p, p.pick(Session("small").request(), 0.2))
    assert other != first


def test_a_lost_boxs_sessions_move_to_a_healthy_box():
    p = _picker()
    s = Session("s1")
    home = _turn(p, s, 0.1)
    assert _turn(p, s, 0.2) == home
    p.box_lost(home, 0.3)
    moved = _turn(p, s, 0.4)
    assert moved != home
    assert _turn(p, s, 0.5) == moved  # and it stays on its new box
    status = {b["name"]: b for b in p.status(0.5)["boxes"]}
    assert status[home]["state"] == "down" and status[moved]["state"] == "healthy"


def test_served_elsewhere_settles_the_lease_where_it_was_served():
    p = _picker()
    s = Session("s1")
    req = s.request()
    picked = _box(p, p.pick(req, 0.1))
    other = next(b for b in BOXES if b != picked)
    p.served(req.call_id, BOXES[other], 200, 0.11)
    p.finished(req.call_id, True, 0.12)
    s.answered()
    assert [le.instance for le in p.router.leases()] == [other]
    assert _turn(p, s, 0.2) == other


def test_a_pick_lists_a_fallback_box_that_takes_the_lease_if_it_serves():
    p = _picker()
    s = Session("s1")
    req = s.request()
    pick = p.pick(req, 0.1)
    assert isinstance(pick, Pick) and pick.fallback in BOXES.values()
    assert pick.fallback != pick.endpoint
    assert pick.destination == f"{pick.endpoint},{pick.fallback}"
    # the pick refused the call and Envoy's retry went to the fallback: the lease follows it
    p.served(req.call_id, pick.fallback, 200, 0.11)
    p.finished(req.call_id, True, 0.12)
    s.answered()
    again = s.request()
    lease = p.pick(again, 0.2)
    assert isinstance(lease, Pick) and lease.endpoint == pick.fallback
    assert p.explain(again.call_id).kind.value == "lease_hit"
    assert lease.fallback == pick.endpoint  # a lease weighs only its box: the other one
    p.finished(again.call_id, True, 0.21)
    s.answered()
    # a lost box is listed neither first nor as the fallback
    p.box_lost(_box(p, pick), 0.3)
    alone = p.pick(s.request(), 0.4)
    assert (
        isinstance(alone, Pick) and alone.fallback is None and alone.destination == lease.endpoint
    )


def test_a_failed_call_installs_no_lease():
    p = _picker()
    req = Session("s1").request()
    p.pick(req, 0.1)
    p.served(req.call_id, None, 500, 0.11)
    p.finished(req.call_id, True, 0.12)
    assert p.router.leases() == () and p.router.in_flight() == {}


def test_no_box_with_room_is_429_with_retry_after():
    p = _picker("reject", round_load_s=60.0)
    for path in ("/v1/chat/completions", "/v1/messages"):
        r = p.pick(Session("s1").request(path), 0.1)
        assert isinstance(r, ImmediateAnswer) and r.status == 429, r
        assert int(r.headers["retry-after"]) >= 1
        body = json.loads(r.body)
        if path == "/v1/messages":
            assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
        else:
            assert body["error"]["type"] == "rate_limit_exceeded"
    assert p.router.held() == ()  # nothing left held: the picker cannot hold a call


def test_under_queue_a_full_round_budget_waits_in_the_cheapest_boxs_queue():
    """The talaria policy's `queue` rule, lifted: the box's own router holds the call."""
    p = _picker("queue", round_load_s=60.0)
    assert isinstance(p.pick(Session("s1").request(), 0.1), Pick)
    assert p.router.held() == ()


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/v1/chat/completions", b"{not json"),
        ("/v1/chat/completions", b'{"model": "m"}'),
        ("/v1/completions", b""),
        ("/v1/responses", b"[1, 2]"),
        ("/v1/messages", b'{"model": "m", "messages": "nope"}'),
    ],
)
def test_a_malformed_body_is_400_in_its_apis_shape(path, raw):
    r = _picker().pick(EPPRequest("c1", "POST", path, {}, raw), 0.1)
    assert isinstance(r, ImmediateAnswer) and r.status == 400
    body = json.loads(r.body)
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    else:
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]


def test_gets_go_round_robin_and_no_healthy_box_is_503():
    p = _picker()
    got = {p.pick(EPPRequest(f"g{i}", "GET", "/v1/models", {}), 0.1).endpoint for i in range(4)}
    assert got == set(BOXES.values())
    for name in BOXES:
        p.box_lost(name, 0.2)
    for req in (EPPRequest("g9", "GET", "/v1/models", {}), Session("s").request()):
        r = p.pick(req, 0.3)
        assert isinstance(r, ImmediateAnswer) and r.status == 503 and r.headers["retry-after"]


def test_stale_boxes_take_no_new_calls():
    p = _picker()
    r = p.pick(EPPRequest("g", "GET", "/v1/models", {}), 5.0)  # 5 s without a snapshot
    assert isinstance(r, ImmediateAnswer) and r.status == 503
    # a call when every box is up but late (a starved picker polled late): busy, not down
    late = p.pick(Session("late").request(), 5.0)
    assert isinstance(late, ImmediateAnswer) and late.status == 429, late
    assert late.code == "boxes_late" and late.headers["retry-after"] == "1"


def test_aliases_and_other_apis_place_like_chat():
    p = _picker()
    s = Session("s1")
    req = s.request(model="al")
    assert isinstance(p.pick(req, 0.1), Pick)
    assert p.explain(req.call_id).kind.value in ("cost", "lease_hit")
    r = p.pick(Session("s2").request("/v1/messages"), 0.2)
    assert isinstance(r, Pick)
    unknown = p.pick(Session("s3").request(model="who"), 0.3)  # the box answers 404 itself
    assert isinstance(unknown, Pick) and p.explain("s3-1") is None


def test_a_profile_is_taken_when_its_box_refines_it_not_on_every_poll():
    p = BoxPicker(Router(RouterKnobs(), {}))
    taken = []
    set_profile = p.router.set_profile
    p.router.set_profile = lambda m, prof: taken.append(prof) or set_profile(m, prof)
    snaps = {name: _snap() for name in BOXES}
    snaps["b"].models[0].profile = LatencyProfile(decode_step_s=0.05)  # b refined its own
    for t in range(10):
        for name, ep in BOXES.items():
            p.box_seen(name, ep, snaps[name], 0.1 * t)
    assert len(taken) == 2  # once per box: the two never swap back and forth
    refined = _snap()  # each poll brings a new snapshot
    refined.models[0].profile = LatencyProfile(decode_step_s=0.07)
    p.box_seen("a", BOXES["a"], refined, 2.0)
    assert taken[-1].decode_step_s == 0.07


def test_the_picker_plans_an_unset_output_limit_as_the_boxs_gateway_does():
    p = _picker()
    for name, ep in BOXES.items():
        snap = _snap()
        snap.models[0].max_context, snap.models[0].default_max_tokens = 200, 4096
        p.box_seen(name, ep, snap, 0.2)
    planned = []
    place = p.router.place
    p.router.place = lambda call, now: planned.append(call) or place(call, now)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 400}]}  # ~100 tokens
    p.pick(EPPRequest("c1", "POST", "/v1/chat/completions", {}, json.dumps(body).encode()), 0.3)
    (call,) = planned
    assert call.max_tokens == 200 - call.prompt_tokens  # what fits, not the default 4096


def test_an_idle_box_polled_by_changes_stays_placeable():
    """A box whose instances do not change re-sends the target installed (same basis, no session
    change): it is not installed again at every poll, but often enough not to go stale."""
    p = BoxPicker(Router(RouterKnobs(), {}))
    snap = _snap()
    for i in range(60):  # six seconds of polls, three times the staleness bound
        target = snap.target.model_copy(update={"sessions_base": i or None})
        again = snap.model_copy(update={"sessions_epoch": i + 1, "target": target})
        assert p.box_seen("a", BOXES["a"], again, 0.1 * i)
    assert p.healthy_boxes(5.95) == ["a"] and p.router.placeable("a", MODEL, 5.95)
    assert p.router.instances(5.95)[0].version < 60 / 2  # not every poll installed


# --- lease returns at request headers -----------------------------------------------------------


def _in_flight(p: BoxPicker, box: str, now: float) -> int:
    return next(s.in_flight for s in p.router.instances(now) if s.instance == box)


def test_a_return_to_a_live_lease_is_placed_at_headers_and_settled_by_the_access_log():
    p = _picker()
    s = Session("h1")
    box = _turn(p, s, 0.0)
    req = s.request()
    pick = p.lease_return(req.at_headers(), 0.2)
    assert isinstance(pick, Pick) and pick.endpoint == BOXES[box] and pick.kind == "lease_hit"
    assert pick.fallback is not None and pick.fallback != pick.endpoint  # a dead box is retried
    assert p.explain(req.call_id).kind.value == "lease_hit"
    assert _in_flight(p, box, 0.2) == 1
    p.logged(req.call_id, BOXES[box], 200, True, 0.3)
    assert _in_flight(p, box, 0.3) == 0
    lease = p.router.lease(p.explain(req.call_id).session_id, MODEL)
    assert lease is not None and lease.t_done == 0.3  # renewed at the call's end
    s.answered()
    # renewed: a return past the first lease's life (it began at 0.02) is placed at headers too
    again = s.request()
    assert isinstance(p.lease_return(again.at_headers(), 0.3 + p.router.knobs.tau_s - 0.1), Pick)


def test_what_is_not_clearly_a_return_is_decided_on_the_body():
    p = _picker()
    s = Session("h2")
    _turn(p, s, 0.0)
    req = s.request()
    heads = req.at_headers()
    assert p.lease_return(dataclasses.replace(heads, headers={}), 0.1) is None  # no session
    shorter = {**heads.headers, "content-length": "10"}  # a sub-agent, a title call
    assert p.lease_return(dataclasses.replace(heads, headers=shorter), 0.1) is None
    chunked = {k: v for k, v in heads.headers.items() if k != "content-length"}
    assert p.lease_return(dataclasses.replace(heads, headers=chunked), 0.1) is None
    assert p.lease_return(dataclasses.replace(heads, path="/v1/models"), 0.1) is None
    late = p.router.knobs.tau_s + 1.0
    assert p.lease_return(heads, late) is None  # the lease has expired
    assert p.lease_return(heads, 0.1) is not None
    # its branch has a call in flight: the next one may be a parallel branch
    assert p.lease_return(s.request().at_headers(), 0.1) is None
    assert all(_in_flight(p, b, 0.1) <= 1 for b in BOXES)


def test_a_session_with_two_live_branches_is_decided_on_the_body():
    p = _picker()
    s = Session("h3", words=200)
    _turn(p, s, 0.0)
    sub = Session("h3", words=200)  # the same session and head, a conversation of its own
    sub.msgs.append({"role": "user", "content": "sub-agent task: list the files"})
    sub_call = sub.request()
    box = _box(p, p.pick(sub_call, 0.05))
    p.served(sub_call.call_id, p.endpoints[box], 200, 0.06)
    p.finished(sub_call.call_id, True, 0.07)
    assert len(p.branches.names("h3", MODEL)) == 2
    main = s.request().at_headers()
    assert int(main.headers["content-length"]) > len(sub_call.body)  # not the length rule
    assert p.lease_return(main, 0.1) is None


def test_a_box_not_serving_every_model_of_the_pool_takes_no_return_at_headers():
    p = _picker()
    other = _snap().model_copy(update={"models": [BoxModel(name="other")]})
    p.box_seen("c", "10.0.0.3:8000", other, 0.0)
    s = Session("h4")
    _turn(p, s, 0.0)
    # the call's model is in its body: a box serving only some models may not serve it
    assert p.lease_return(s.request().at_headers(), 0.1) is None


def test_a_lost_box_takes_no_return_at_headers():
    p = _picker()
    s = Session("h5")
    box = _turn(p, s, 0.0)
    p.box_lost(box, 0.05)
    assert p.lease_return(s.request().at_headers(), 0.1) is None


def test_a_call_placed_at_headers_whose_end_was_never_logged_is_released():
    p = _picker()
    s = Session("h6")
    box = _turn(p, s, 0.0)
    req = s.request()
    assert p.lease_return(req.at_headers(), 0.1) is not None
    assert _in_flight(p, box, 0.2) == 1
    p.box_seen(box, BOXES[box], _snap(), 0.1 + HEADER_CALL_MAX_S + 1)
    assert _in_flight(p, box, 0.2) == 0
    p.logged(req.call_id, BOXES[box], 200, True, 500.0)  # a late entry changes nothing


def test_a_lease_the_router_finds_unusable_at_headers_leaves_nothing_behind():
    p = _picker()
    s = Session("h7")
    box = _turn(p, s, 0.0)
    branch = p.explain("h7-1").session_id
    # the box's snapshot no longer holds the branch's prefix: the router discards the lease
    assert p.router.lease(branch, MODEL) is not None
    p.box_seen(box, BOXES[box], _snap(), 0.05)  # a whole snapshot without the session
    req = s.request()
    assert p.lease_return(req.at_headers(), 0.1) is None
    # the router placed it by cost ("lease prefix missing"), and that placement was undone
    assert p.explain(req.call_id).kind.value == "cost"
    assert all(_in_flight(p, b, 0.1) == 0 for b in BOXES) and p.router.held() == ()


def _capped_picker(max_connections: int) -> BoxPicker:
    """Boxes whose snapshots publish `max_connections` (the picker's default would be 512)."""
    p = BoxPicker(Router(RouterKnobs(overload="spill"), {}))
    for name, ep in BOXES.items():
        snap = _snap().model_copy(update={"max_connections": max_connections})
        p.box_seen(name, ep, snap, 0.0)
    return p


def test_a_box_gets_no_more_calls_than_its_connection_limit_takes_and_then_the_pool_is_429():
    p = _capped_picker(10)  # 10 connections, 8 kept for polls and checks: 2 calls a box
    assert p.capacity("a") == p.capacity("b") == 2
    picks = [p.pick(Session(f"s{i}").request(), 0.1 + i * 0.01) for i in range(4)]
    boxes = [_box(p, pick) for pick in picks]
    assert sorted(boxes) == ["a", "a", "b", "b"]
    assert picks[3].fallback is None  # no box with room left to fall back on
    full = p.pick(Session("late").request(), 0.2)
    assert isinstance(full, ImmediateAnswer) and full.status == 429, full
    assert full.headers["retry-after"] == "1" and full.code == "pool_full"
    assert "connection limit (4 calls at once)" in json.loads(full.body)["error"]["message"]
    assert sum(b["in_flight"] for b in p.status(0.2)["boxes"]) == 4  # the refusal holds nothing
    p.finished("s0-1", True, 0.3)  # one ends: its box takes the next
    assert _box(p, p.pick(Session("next").request(), 0.4)) == boxes[0]


def test_a_placement_on_a_full_box_moves_to_one_with_room():
    p = _capped_picker(10)  # two calls a box
    s = Session("s1")
    home = _turn(p, s, 0.1)  # its lease is on `home`
    other = next(b for b in BOXES if b != home)
    opened, now = [], 0.2
    while not p.full(home):  # other sessions' calls fill `home`
        req = Session(f"x{len(opened)}").request()
        opened.append((req.call_id, _box(p, p.pick(req, now))))
        now += 0.01
    for call_id, box in opened:
        if box == other:
            p.finished(call_id, True, now)
    returning = s.request()
    assert _box(p, p.pick(returning, now + 0.01)) == other
    explained = p.explain(returning.call_id)
    assert explained.instance == other and f"{home} at its connection limit" in explained.reason


def test_a_box_that_publishes_no_limit_takes_the_configured_one():
    p = BoxPicker(Router(RouterKnobs(), {}), box_max_connections=12)
    p.box_seen("a", BOXES["a"], _snap(), 0.0)
    assert p.capacity("a") == 4


def test_a_session_whose_text_the_picker_let_go_keeps_its_lease():
    # the picker keeps a few sessions' text (`conversation_bytes`); the boxes hold their KV and
    # the router their leases, and a branch's name comes again from its content: a session past
    # the text bound still returns to its lease, at headers and on its body
    p = BoxPicker(Router(RouterKnobs(), {}), conversation_bytes=4096)
    for name, ep in BOXES.items():
        p.box_seen(name, ep, _snap(), 0.0)
    first = Session("first", words=200)
    box = _turn(p, first, 0.0)
    branch = p.explain("first-1").session_id
    for i in range(6):  # each ~1 KB of text: the first session's goes
        _turn(p, Session(f"other{i}", words=200), 0.01 * (i + 1))
    assert p.branches.names("first", MODEL) == []
    req = first.request()
    pick = p.lease_return(req.at_headers(), 0.2)
    assert isinstance(pick, Pick) and pick.endpoint == BOXES[box] and pick.kind == "lease_hit"
    p.logged(req.call_id, BOXES[box], 200, True, 0.3)
    first.answered()
    for i in range(6):
        _turn(p, Session(f"more{i}", words=200), 0.3 + 0.01 * (i + 1))
    again = first.request()
    assert _box(p, p.pick(again, 0.4)) == box
    assert p.explain(again.call_id).kind.value == "lease_hit"
    assert p.explain(again.call_id).session_id == branch
