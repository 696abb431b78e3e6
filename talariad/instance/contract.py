"""The contract between the instance core and an executor (`sim`, `torch`, `sglang`), modelled on
vLLM v1: a step plan goes in, a result object comes back. Nothing outside these Protocols is
called: `ExecutorState` is what the core calls between steps (synchronously), `Executor` adds
what the instance process calls. The core owns the scheduler, the calls and the session KV
ledger; an executor owns tokens, bytes and time. Design: docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from talariad.types import KVLocation, SwitchPath

if TYPE_CHECKING:
    from talariad.cold_sched import Action
    from talariad.cold_sched.calls import SessionLedger

    from .calls import InstanceCall


@dataclass(slots=True)
class StepPlan:
    """One scheduler action and the records of every call it names. `live` (every call on the
    instance), `ledger` and `round_index` are read-only context for executors that model memory."""

    action: Action
    calls: dict[str, InstanceCall]
    live: Mapping[str, InstanceCall]
    ledger: SessionLedger
    round_index: int
    """For a switch: the round it opens; -1 for other steps."""


@dataclass(slots=True)
class CallOutput:
    """What one call did in one step."""

    text: str = ""
    tokens: int = 1
    cached_tokens: int | None = None
    """Prompt tokens really reused (first admission only); None: the scheduler's plan."""
    kv_source: str | None = None
    """device | host | recompute | none, when the executor knows (first admission only)."""
    finish_reason: str | None = None
    """"stop": the call hit a stop token or string in this step."""
    stop_sequence: str | None = None
    """The client's stop string that ended the call in this step."""
    error: str | None = None
    """The call failed in this step (its server crashed ...): the client gets this error, the call ends."""


@dataclass(slots=True)
class StepResult:
    calls: dict[str, CallOutput] | None = field(default_factory=dict)
    """Per call of the plan; a call absent here emitted nothing. None: every call of the plan
    emitted one token and nothing else (a modelled step)."""
    kv_updates: list[KVLocation] = field(default_factory=list)
    """KV the step moved or dropped (a switch saved KV to host, an eviction dropped it)."""
    switch_path: SwitchPath | None = None
    """For a switch: how the target weights were actually opened."""
    seconds: float | None = None
    """Modelled duration (the `sim` executor); None: the shell measures the wall clock."""
    switch_failed: str | None = None
    """For a switch: why the target could not be opened (the outgoing model was released; the
    target's slot is skipped and its calls stay queued)."""
    staging: str | None = None
    """For a switch: the model whose weights the executor now stages for the next switch (§3.4:
    the switch estimate follows staging); None: the executor does not stage."""
    evicted: tuple[str, ...] = ()
    """For a switch: models whose weights the open pushed out of device memory; a later call
    for one of them opens it again (a full open, not a switch)."""
    switch_report: dict | None = None
    """For a switch: the executor's measured record (path, phase_s, staged_bytes, dirty_bytes) for
    the admin API's switch records; None: it does not measure phases."""


@dataclass(frozen=True, slots=True)
class MemoryStats:
    hbm_free_bytes: int
    staging_slack_bytes: int
    kv_occupancy: float | None = None
    """Device KV in use over its budget, when the executor measures it (else the scheduler's)."""


class ExecutorState(Protocol):
    """What the core calls on an executor between steps, synchronously: the per-session context
    and memory it keeps. The simulator's `SimModel` is one too (it keeps bytes, not tokens)."""

    def remember(self, call: InstanceCall) -> KVLocation | None:
        """Keep a finished call's prompt + output as its session's context; where its KV lives
        (None: where the scheduler's ledger says)."""

    def release(self, call: InstanceCall) -> None:
        """A call dropped before it finished: free what the executor holds for it."""

    def forget(self, session: str) -> bool | None:
        """Drop the session's stored context and KV (device pages, host copies): True if it held
        any, False if none or a call of the session is running (nothing dropped); None: it keeps
        nothing per session (the core's ledger answers)."""

    def load(self, model: str) -> None:
        """`model` is back in the instance's rotation (admin API): it may be staged again."""

    def unload(self, model: str) -> None:
        """`model` left the rotation (it is not active): stop staging it, free its staged bytes."""

    def memory(self) -> MemoryStats | None:
        """HBM free and staging slack as of the last step; None: the executor does not know."""


class Executor(ExecutorState, Protocol):
    kv_capacity_tokens: int | None
    """Prompt + output tokens its KV pool holds (None: no real pool, the scheduler's default)."""

    def encode(self, request) -> list:
        """The prompt's tokens (ValueError: the model's chat template refuses the conversation)."""

    def reusable(self, session: str, model: str, prompt: list) -> int:
        """Tokens of `prompt` this session's stored context on this instance covers."""

    def memory_report(self, last: int = 50) -> dict:
        """The managed HBM layout and latest switch records ({} when the executor has none)."""

    async def start(self) -> None:
        """Bring up what must run before the first call (servers); the process is ready after."""

    async def aclose(self) -> None:
        """Stop what `start` brought up; the instance process awaits it after it stops serving."""

    async def run(self, plan: StepPlan) -> StepResult:
        """Run one planned action; a switch's failure is `switch_failed`, a call's is its error."""
