"""The swap-sequence state machine against an independent model of SGLang's crash rules.

`SGLangModel` encodes reference §0 (what kills a stock server); hypothesis drives the state machine
through random orders of calls, finishes, loads reads, switches, step failures and crashes, and the
model fails the test on any move that would have killed a real server.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talariad.engine.executors.sglang.swap import (
    ALL_TAGS,
    Command,
    Servers,
    Step,
    SwapSequence,
    SwapViolation,
)

MODELS = ["a", "b", "c"]


@dataclass
class Server:
    alive: bool = False
    paused: bool = False
    offloaded: set = field(default_factory=set)
    running: int = 0


class SGLangModel:
    """What a stock SGLang 0.5.23 server does with each request (reference §0.1, §0.4, §0.5)."""

    def __init__(self):
        self.s = {m: Server() for m in MODELS}

    def resident(self):
        return [m for m, x in self.s.items() if x.alive and not x.offloaded]

    def apply(self, cmd: Command):
        x = self.s[cmd.model]
        if cmd.step is Step.START:
            assert not x.alive and not self.resident(), "start while another model is resident: OOM"
            self.s[cmd.model] = Server(alive=True)
            return
        assert x.alive, f"{cmd} to a dead server"
        if cmd.step is Step.PAUSE:
            x.paused = True  # retract: running requests go back to the waiting queue
            x.running = 0
        elif cmd.step is Step.RELEASE:
            assert x.running == 0 and x.paused, "release while busy: the scheduler asserts and dies"
            assert not x.offloaded, "pausing a paused tag: torch_memory_saver exit(1)"
            x.offloaded = set(ALL_TAGS)
        elif cmd.step is Step.RESUME:
            assert x.offloaded == set(ALL_TAGS), (
                "resuming a tag that is not released: KeyError, dies"
            )
            assert self.resident() == [], "resume while another model is resident: OOM exit(1)"
            x.offloaded = set()
        elif cmd.step is Step.CONTINUE:
            assert not x.offloaded
            x.paused = False

    def send(self, model: str):
        x = self.s[model]
        assert x.alive and not x.offloaded and not x.paused, "a call to a released or paused server"
        x.running += 1


events = st.lists(
    st.tuples(
        st.sampled_from(["send", "finish", "switch", "crash", "stale"]),
        st.sampled_from(MODELS),
        st.integers(0, 3),
        st.booleans(),
    ),
    max_size=60,
)


def _switch(servers: Servers, sg: SGLangModel, active: str | None, model: str, k: int, ok: bool):
    """Run one switch to `model` through the swap machine; the model active after it."""
    seq = SwapSequence(servers, active, model)
    resumed = 0
    while (cmd := seq.next_command()) is not None:
        if cmd.step is Step.DRAIN:
            # a stale or busy loads read shows k running: the machine must poll again
            sg.s[cmd.model].running = k
            seq.done(cmd, running=k)
            k = 0  # the next read sees the drained server
            continue
        if cmd.step is Step.MEMORY:
            seq.done(cmd, ok=ok, error="not enough free memory")
            continue
        sg.apply(cmd)
        resumed += cmd.step is Step.RESUME
        seq.done(cmd)
    assert resumed <= 1, "a switch never resumes twice"
    assert len(servers.resident()) <= 1
    if seq.failed:
        assert not servers[model].serving or sg.s[model].alive
        return None if not servers[model].serving else model
    assert servers[model].serving
    return model


@settings(max_examples=300, deadline=None)
@given(events, st.sampled_from(MODELS))
def test_random_orders_never_kill_a_server(evs, first):
    servers, sg = Servers(MODELS), SGLangModel()
    # park every model but `first`, which must be started after the others are released
    order = [m for m in MODELS if m != first] + [first]
    for m in order:
        sg.apply(Command(Step.START, m))
        servers.started(m)
        if m != first:
            servers.pause(m), sg.apply(Command(Step.PAUSE, m))
            servers.observe(m, 0)
            sg.apply(Command(Step.RELEASE, m)), servers.release(m)
    active: str | None = first
    n = 0
    for kind, model, k, ok in evs:
        if kind == "send":
            n += 1
            try:
                servers.send(model, f"c{n}")
            except SwapViolation:
                assert not servers[model].serving
                continue
            sg.send(model)
        elif kind == "finish":
            x = sg.s[model]
            if x.running and servers[model].sent:
                x.running -= 1
                servers.finished(model, sorted(servers[model].sent)[0])
        elif kind == "crash":
            servers.died(model)
            sg.s[model] = Server()
            if active == model:
                active = None
        elif kind == "switch":
            active = _switch(servers, sg, active, model, k, ok)
        # invariant after every event: no server is released and accepting calls
        for m in MODELS:
            st_ = servers[m]
            assert not (st_.released and st_.serving)
            assert st_.serving == (sg.s[m].alive and not sg.s[m].offloaded and not sg.s[m].paused)


def _two_up() -> Servers:
    servers = Servers(["a", "b"])
    servers.started("b")
    servers.pause("b"), servers.observe("b", 0), servers.release("b")
    servers.started("a")
    return servers


def test_release_waits_for_running_requests_to_drain():
    servers = _two_up()
    servers.send("a", "c1")
    seq = SwapSequence(servers, "a", "b")
    assert seq.next_command() == Command(Step.PAUSE, "a")
    seq.done(Command(Step.PAUSE, "a"))
    with pytest.raises(SwapViolation, match="paused"):
        servers.send("a", "c2")  # stop admitting
    seq.done(Command(Step.DRAIN, "a"), running=2)
    assert seq.next_command() == Command(Step.DRAIN, "a")  # still running: poll again
    with pytest.raises(SwapViolation, match="may be running"):
        servers.check_release("a")
    seq.done(Command(Step.DRAIN, "a"), running=0)
    assert [c.step for c in _drive(seq)] == [Step.RELEASE, Step.MEMORY, Step.RESUME, Step.CONTINUE]
    assert servers["b"].serving and servers["a"].released == ALL_TAGS and servers["a"].paused


def _drive(seq: SwapSequence) -> list[Command]:
    out = []
    while (cmd := seq.next_command()) is not None:
        out.append(cmd)
        seq.done(cmd, running=0)
    return out


def test_guards_refuse_every_crashing_move():
    servers = _two_up()
    with pytest.raises(SwapViolation, match="not paused"):
        servers.release("a")  # in_place/none: running requests would trip the idle assert
    with pytest.raises(SwapViolation, match="not released"):
        servers.resume("a")  # KeyError in offload_tags.remove
    with pytest.raises(SwapViolation, match="released"):
        servers.send("b", "c1")  # forward pass over unmapped memory
    with pytest.raises(SwapViolation, match="resident"):
        servers.resume("b")  # a would still hold its memory: OOM on resume
    servers.pause("a"), servers.observe("a", 0), servers.release("a")
    with pytest.raises(SwapViolation, match="twice"):
        servers.release("a")
    servers.resume("b")
    with pytest.raises(SwapViolation, match="not released"):
        servers.resume("b")
    with pytest.raises(SwapViolation, match="paused"):
        servers.send("b", "c1")  # resumed but not continued: still paused
    servers.cont("b")
    servers.send("b", "c1")
    with pytest.raises(SwapViolation, match="twice"):
        servers.send("b", "c1")


def test_failed_memory_check_leaves_nothing_resident_and_the_target_released():
    servers = _two_up()
    seq = SwapSequence(servers, "a", "b")
    for cmd in iter(seq.next_command, None):
        seq.done(cmd, ok=cmd.step is not Step.MEMORY, running=0, error="needs 40 GiB, 12 GiB free")
    assert seq.failed and seq.error == "needs 40 GiB, 12 GiB free"
    assert servers.resident() == [] and servers["b"].released and servers["b"].paused
    retry = SwapSequence(servers, None, "b")
    assert [c.step for c in _drive(retry)] == [Step.MEMORY, Step.RESUME, Step.CONTINUE]


def test_a_crashed_parked_server_starts_fresh_and_a_dead_source_fails_the_switch():
    servers = _two_up()
    servers.send("a", "c1")
    assert servers.died("b") == set()
    seq = SwapSequence(servers, "a", "b")
    assert [c.step for c in _drive(seq)] == [
        Step.PAUSE,
        Step.DRAIN,
        Step.RELEASE,
        Step.MEMORY,
        Step.START,
    ]
    assert servers["b"].serving
    seq = SwapSequence(servers, "b", "a")
    seq.done(seq.next_command())  # paused b
    assert servers.died("b") == set()
    assert seq.next_command() is None and "exited" in seq.error
