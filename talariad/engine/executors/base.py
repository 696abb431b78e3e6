"""The contract between the instance worker and an executor (`sim` now, `torch` and `sglang` later).

The worker owns the scheduler and the calls; an executor owns tokens and time: it encodes
prompts, knows how much of a prompt a session can reuse, and runs one scheduler action.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Protocol

from talariad.cold_sched import Action
from talariad.engine.messages import GenerateRequest
from talariad.types import KVState, SwitchPath


def common_prefix(a: Sequence, b: Sequence) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class LiveCall:
    """A call the worker has submitted: its request, encoded prompt and the text produced so far."""

    req: GenerateRequest
    prompt: list
    out: list = field(default_factory=list)
    state: object = None
    """Executor-private per-call state (planned words, sampler, block table ...)."""
    kv_source: str = "none"
    """Where the reused prefix came from: device, host, recompute (had one, lost it) or none."""
    cached_tokens: int | None = None
    """Prompt tokens the executor really reused, when it knows better than the scheduler's plan
    (a restore the substrate declined or cut to whole pages); None: the plan's number."""
    finish_reason: str | None = None
    """Set by an executor that knows why the call ended (stop token or string: "stop")."""


@dataclass
class StepResult:
    text: dict[str, str] = field(default_factory=dict)
    """The piece of text each call emitted in this action (absent: it emitted nothing)."""
    stopped: set[str] = field(default_factory=set)
    """Calls that hit a stop condition (stop token or string) in this action."""
    path: SwitchPath | None = None
    """For a switch: how the target weights were actually opened."""
    kv_updates: list[tuple[str, str, KVState, int]] = field(default_factory=list)
    """(session, model, state, kv_len) the substrate really holds after this action (a switch
    saved KV to host page-aligned, an eviction dropped it); the worker tells the scheduler."""


class Executor(Protocol):
    def encode(self, req: GenerateRequest) -> list: ...

    def reusable(self, session: str, model: str, prompt: list) -> int:
        """Tokens of `prompt` this session's stored context on this instance covers."""

    def remember(self, session: str, model: str, call: LiveCall) -> None:
        """Keep a finished call's prompt + output as the session's context for its next call."""

    async def run(self, action: Action, calls: dict[str, LiveCall]) -> StepResult: ...
