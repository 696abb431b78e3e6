"""The swap-sequence state machine of a cold SGLang instance (sans-IO; reference §0, §7).

`Servers` tracks each model's server as the controller knows it and refuses every move that would
crash a stock SGLang server. `SwapSequence` derives the safe steps of one switch A -> B (pause,
drain, release A; memory check; resume and continue B, or start it when its process is down).
The shell executes each `Command` and reports back with `done()`; nothing here reads a clock,
sleeps or opens a socket. Design: docs/internals.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

ALL_TAGS = frozenset({"kv_cache", "weights", "cuda_graph"})
"""What `release_memory_occupation {}` (tags null) releases in SGLang 0.5.23 (reference §0.7)."""


class SwapViolation(RuntimeError):
    """A move that would crash a stock SGLang server (the state machine's own guard)."""


@dataclass
class ServerState:
    model: str
    up: bool = False
    """The server process answered /health since its last start."""
    paused: bool = False
    """pause_generation sent and continue_generation not yet."""
    released: frozenset[str] = frozenset()
    """Memory-saver tags released and not resumed; resuming any other tag kills the server."""
    sent: set[str] = field(default_factory=set)
    """Calls sent to this server that have not finished."""
    running: int | None = None
    """num_running_reqs of the last /v1/loads read since the pause (None: not read yet)."""

    @property
    def serving(self) -> bool:
        """May receive calls: up, not paused, nothing released."""
        return self.up and not self.paused and not self.released


class Servers:
    """Per-model server states with guarded transitions (one instance's GPU group)."""

    def __init__(self, models: list[str]):
        self.state = {m: ServerState(m) for m in models}

    def __getitem__(self, model: str) -> ServerState:
        return self.state[model]

    def resident(self) -> list[str]:
        return [m for m, s in self.state.items() if s.up and not s.released]

    # -- process lifecycle -----------------------------------------------------------------

    def started(self, model: str) -> None:
        """A fresh process is up: all memory resident, not paused, nothing sent."""
        self.state[model] = ServerState(model, up=True)

    def died(self, model: str) -> set[str]:
        """The process exited; returns the calls that were in flight on it."""
        lost = set(self.state[model].sent)
        self.state[model] = ServerState(model)
        return lost

    # -- calls -----------------------------------------------------------------------------

    def send(self, model: str, call_id: str) -> None:
        s = self.state[model]
        if not s.serving:
            raise SwapViolation(
                f"call {call_id} to {model}'s server while it is "
                f"{'down' if not s.up else 'released' if s.released else 'paused'}"
            )
        if call_id in s.sent:
            raise SwapViolation(f"call {call_id} sent twice to {model}'s server (duplicate rid)")
        s.sent.add(call_id)

    def finished(self, model: str, call_id: str) -> None:
        self.state[model].sent.discard(call_id)

    # -- control requests ------------------------------------------------------------------

    def pause(self, model: str) -> None:
        s = self.state[model]
        if not s.up:
            raise SwapViolation(f"pause of {model}'s server while it is down")
        s.paused, s.running = True, None

    def observe(self, model: str, running: int) -> None:
        """A /v1/loads read of num_running_reqs, taken after the pause."""
        s = self.state[model]
        if s.paused:
            s.running = running

    def release(self, model: str) -> None:
        self.check_release(model)
        self.state[model].released = ALL_TAGS

    def check_release(self, model: str) -> None:
        s = self.state[model]
        if not s.up or not s.paused:
            raise SwapViolation(f"release of {model}'s server while it is not paused")
        if s.running is None or s.running > 0:
            raise SwapViolation(
                f"release of {model}'s server while it may be running requests "
                f"(last seen {s.running})"
            )
        if s.released:
            raise SwapViolation(
                f"release of {model}'s server twice ({', '.join(sorted(s.released))})"
            )

    def resume(self, model: str) -> None:
        self.check_resume(model)
        self.state[model].released = frozenset()

    def check_resume(self, model: str) -> None:
        s = self.state[model]
        if not s.up or s.released != ALL_TAGS:
            raise SwapViolation(f"resume of {model}'s server whose memory is not released")
        if others := [m for m in self.resident() if m != model]:
            raise SwapViolation(f"resume of {model}'s server while {', '.join(others)} is resident")

    def cont(self, model: str) -> None:
        self.check_cont(model)
        s = self.state[model]
        s.paused, s.running = False, None

    def check_cont(self, model: str) -> None:
        s = self.state[model]
        if not s.up or s.released:
            raise SwapViolation(f"continue of {model}'s server while its memory is released")

    def check_start(self, model: str) -> None:
        if self.state[model].up:
            raise SwapViolation(f"start of {model}'s server while it is up")
        if others := self.resident():
            raise SwapViolation(f"start of {model}'s server while {', '.join(others)} is resident")


# -- the sequence of one switch --------------------------------------------------------------


class Step(str, enum.Enum):
    PAUSE = "pause"
    DRAIN = "drain"
    RELEASE = "release"
    MEMORY = "memory_check"
    RESUME = "resume"
    START = "start"
    CONTINUE = "continue"


@dataclass(frozen=True)
class Command:
    step: Step
    model: str


class SwapSequence:
    """The safe steps of one switch from `from_model` to `to_model`: every other resident server
    is parked first (normally just `from_model`)."""

    def __init__(self, servers: Servers, from_model: str | None, to_model: str | None):
        """to_model None: only park (pause, drain, release) what is resident."""
        self.servers, self.from_model, self.to_model = servers, from_model, to_model
        self.error: str | None = None
        self._plan = self._steps()
        self._i = 0

    def _steps(self) -> list[Command]:
        b, out = self.to_model, []
        # park whatever holds memory: the outgoing model, and any server a failed switch left up
        for a in sorted(self.servers.resident(), key=lambda m: m != self.from_model):
            if a != b:
                out += [Command(Step.PAUSE, a), Command(Step.DRAIN, a), Command(Step.RELEASE, a)]
        if b is None:
            return out
        target = self.servers[b]
        if target.serving:
            return out
        if not target.up:  # a crashed parked server starts fresh, sized against what is free now
            return out + [Command(Step.MEMORY, b), Command(Step.START, b)]
        if target.released:
            out += [Command(Step.MEMORY, b), Command(Step.RESUME, b)]
        return out + [Command(Step.CONTINUE, b)]

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def finished(self) -> bool:
        return self.failed or self._i >= len(self._plan)

    def next_command(self) -> Command | None:
        """The next step to run, checked safe against the servers' state now; None when the
        switch is complete or failed."""
        if self.finished:
            return None
        cmd = self._plan[self._i]
        if cmd.step not in (Step.START, Step.MEMORY) and not self.servers[cmd.model].up:
            self.error = f"{cmd.model}'s server exited during the switch"
            return None
        guard = {
            Step.RELEASE: self.servers.check_release,
            Step.RESUME: self.servers.check_resume,
            Step.START: self.servers.check_start,
            Step.CONTINUE: self.servers.check_cont,
        }.get(cmd.step)
        if guard is not None:
            guard(cmd.model)
        return cmd

    def done(
        self, cmd: Command, ok: bool = True, running: int | None = None, error: str | None = None
    ) -> None:
        """The shell ran `cmd`. DRAIN reports num_running_reqs in `running` (the step repeats until
        it is 0); a step that did not succeed fails the switch with `error`."""
        if self.finished or cmd != self._plan[self._i]:
            raise SwapViolation(f"done({cmd}) out of order")
        if not ok:
            self.error = error or f"{cmd.step.value} of {cmd.model} failed"
            return
        s = self.servers
        match cmd.step:
            case Step.PAUSE:
                s.pause(cmd.model)
            case Step.DRAIN:
                if running is None:
                    raise SwapViolation("drain done without a running count")
                s.observe(cmd.model, running)
                if running > 0:
                    return  # poll again
            case Step.RELEASE:
                s.release(cmd.model)
            case Step.RESUME:
                s.resume(cmd.model)
            case Step.START:
                s.started(cmd.model)
            case Step.CONTINUE:
                s.cont(cmd.model)
        self._i += 1
