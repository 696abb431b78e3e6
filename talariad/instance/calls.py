"""One record per call inside an instance (as nano-vllm's `Sequence`): what the shells, the core and
the executor know about a call, from submission to completion."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from talariad.types import KVState

if TYPE_CHECKING:
    from talariad.cold_sched.calls import CallProgress
    from talariad.wire.messages import GenerateRequest


@dataclass(frozen=True, slots=True)
class CallOrder:
    """A call an instance is asked to run, as its core reads it (`InstanceCore.admit`). The
    instance process builds it from the internal API's request (`engine.events.call_order`);
    `request` rides along for the executor alone, which encodes its prompt and samples."""

    call_id: str
    session_id: str | None
    model: str
    max_tokens: int
    clamp_max_tokens: bool
    """Lower `max_tokens` to what fits the context instead of refusing the call."""
    request: GenerateRequest


@dataclass(slots=True, eq=False)
class InstanceCall:
    """The core's record of a call; it is also what the scheduler holds (a `SchedCall`)."""

    call_id: str
    session_id: str
    model: str
    prompt_tokens: int
    max_tokens: int
    """The output limit decided at admission (the request's, lowered to what fits when it asks)."""
    arrived_at: float = 0.0
    """When it was submitted (`InstanceCore.submit_resolved` sets it)."""
    request: GenerateRequest | None = None
    """The internal API's request as the gateway sent it, for the executor (daemon shell); None
    in the simulator. The core never reads it."""
    prompt: list = field(default_factory=list)
    """The encoded prompt (daemon shell; the simulator only knows its length)."""
    out: list[str] = field(default_factory=list)
    """Text pieces emitted so far (one per step that emitted something)."""
    progress: CallProgress | None = None
    """The scheduler's record of the call (`cold_sched.calls.CallProgress`): its counts are the
    only ones kept."""
    kv_source: str = "none"
    """Where the reused prefix came from: device, host, recompute (had one, lost it) or none."""
    cached_tokens: int | None = None
    """Prompt tokens the executor really reused; None: the scheduler's plan."""
    finish_reason: str | None = None
    """"stop" when the executor saw a stop token or string; None: decided at completion."""
    stop_sequence: str | None = None
    """The client's stop string that ended the call, when one did."""
    claimed_prefix: int = 0
    """Prompt tokens the session's earlier context covers (whatever the instance still holds)."""
    abandoned: bool = False
    """The client left while the call was in the running batch: it ends at its next step."""
    state: object = None
    """Executor-private state (sampler, block table, planned words ...): only its executor reads it."""
    prefix_tokens: int = 0
    """Prompt tokens the scheduler plans to reuse (set at submission)."""
    prefix_state: KVState = KVState.MISSING
    """Where that prefix lives (set at submission)."""
    is_continuation: bool = False
    """The session had context here at submission."""

    @property
    def generated(self) -> int:
        """Tokens emitted so far."""
        return 0 if self.progress is None else self.progress.generated


@dataclass(frozen=True, slots=True)
class Refusal:
    """A call that is not served here, as the client's error (HTTP 400: it never can be)."""

    code: str
    param: str | None
    message: str
    limit: int | None = None
    """context_length_exceeded: the most tokens (prompt + max_tokens) the call may take."""
    prompt_tokens: int | None = None
    """context_length_exceeded: the prompt's length in tokens."""
    status: int = 400
    """503: not now (the model left this instance's rotation), another instance may serve it."""
