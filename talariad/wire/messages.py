"""Typed messages between the gateway and an instance process: the call stream's frames and the
internal HTTP API's bodies."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from talariad.types import KVLocation, ModelLoad, RoundMeasurement, ToolCall


class ChatMessage(BaseModel):
    role: str
    """system, user, assistant or tool (a tool's result)."""
    content: str
    tool_calls: list[ToolCall] = Field(default_factory=list)
    """assistant: the tool calls it made."""
    tool_call_id: str | None = None
    """tool: the call this result answers."""
    name: str | None = None
    """tool: the tool's name."""

    def template_dict(self) -> dict[str, Any]:
        """The Hugging Face chat-template form of this message."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


class Query(BaseModel):
    """A report the gateway asks an instance for on its call stream (`wire/stream.py`), answered
    with one JSON frame: what the internal API's `GET /internal/<query>` answers with these
    parameters (`since`, `limit`: its query parameters; None: not given)."""

    query: Literal["telemetry", "rounds", "memory", "process"]  # first: a frame starts `{"query":`
    since: int | None = None
    limit: int | None = Field(None, ge=1, le=4096)


class GenerateRequest(BaseModel):
    """One model call forwarded by the gateway; `messages` are rendered by the engine's template."""

    call_id: str
    session_id: str | None = None
    model: str
    messages: list[ChatMessage] = Field(default_factory=list)
    prompt: str | None = None
    """Raw prompt for /v1/completions; used instead of `messages` when set."""
    tools: list[dict[str, Any]] = Field(default_factory=list)
    """Tool definitions in the chat-template form `{"type": "function", "function": {name, description,
    parameters}}`; rendered into the prompt by the model's template."""
    max_tokens: int = Field(default=256, ge=1)
    clamp_max_tokens: bool = False
    """Lower `max_tokens` to what fits the context instead of refusing the call."""
    ignore_eos: bool = False
    """Generate `max_tokens` unless a stop string fires: the model's end of turn is ignored (vLLM's
    `ignore_eos`; a replay reproduces recorded output lengths with it)."""
    temperature: float = Field(default=0.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: list[str] = Field(default_factory=list)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    """Prompt tokens served from a reusable prefix (device or host) instead of recomputed."""
    kv_source: Literal["device", "host", "recompute", "none"]
    """Where the reused prefix came from; `none` when the call had nothing to reuse."""


class TokenEvent(BaseModel):
    type: Literal["token"] = "token"
    text: str
    prompt_tokens: int | None = None
    """Set on a call's first token: the exact prompt length (Anthropic's `message_start` reports it)."""
    cached_tokens: int | None = None
    """Set on a call's first token: prompt tokens served from a reused prefix."""


class DoneEvent(BaseModel):
    type: Literal["done"] = "done"
    finish_reason: Literal["stop", "length"]
    stop_sequence: str | None = None
    """The client's stop string that ended the call, when one did."""
    usage: Usage
    kv_state: Literal["device", "host", "missing"]
    kv_len: int
    ttft_s: float
    """Time from arrival at the instance to the first token."""


class ErrorEvent(BaseModel):
    type: Literal["error"] = "error"
    message: str
    status: int = 503
    """HTTP status the gateway answers with: 4xx when the call itself can never be served."""
    code: str | None = None
    param: str | None = None
    prompt_tokens: int | None = None
    """context_length_exceeded: the prompt's length in tokens."""
    limit: int | None = None
    """context_length_exceeded: the most tokens (prompt + max_tokens) the call may take."""


StreamEvent = TokenEvent | DoneEvent | ErrorEvent
"""One line of an instance's generate stream."""


class SessionChanges(BaseModel):
    """A session view on the wire, whole or as changes: an instance's (its telemetry) or a box's
    (`wire.box.BoxTarget`)."""

    sessions: list[KVLocation] = Field(default_factory=list)
    sessions_base: int | None = None
    """None: `sessions` is the whole list. Else `sessions` holds only entries that changed since the
    view named `sessions_base`, and `sessions_removed` the (session, model) pairs it no longer has."""
    sessions_removed: list[tuple[str, str]] = Field(default_factory=list)

    def merge_into(self, view: dict[tuple[str, str], KVLocation]) -> list[tuple[str, str]] | None:
        """Apply these sessions to `view`, the view they were sent against, in place
        (O(changes)). Returns the (session, model) pairs changed or removed; None when the
        message carried the whole list, which replaced `view`."""
        if self.sessions_base is None:
            view.clear()
        changed = [tuple(key) for key in self.sessions_removed]
        for key in changed:
            view.pop(key, None)
        for s in self.sessions:
            key = (s.session_id, s.model)
            view[key] = s  # the message's own record
            changed.append(key)
        return None if self.sessions_base is None else changed  # type: ignore[return-value]


class Telemetry(SessionChanges):
    """Versioned instance snapshot the gateway's router reads (§4.1): the instance core's
    `InstanceTelemetry` (same field names), plus the session-delta fields its process adds."""

    instance: str
    version: int
    pool: Literal["hot", "cold"]
    models: list[str]
    active_model: str | None
    loaded_models: list[str]
    queued: dict[str, int] = Field(default_factory=dict)
    running: int = 0
    round_remaining_s: float = 0.0
    kv_occupancy: float = 0.0
    hbm_free_bytes: int | None = None
    """None: the executor does not measure its memory (the router then skips its HBM check)."""
    staging_slack_bytes: int | None = None
    switches: int = 0
    opened_models: list[str] = Field(default_factory=list)
    """Models opened here at least once: switching them in costs a switch, not a full open."""
    model_load: dict[str, ModelLoad] = Field(default_factory=dict)
    round_load_s: float = 0.0
    """Predicted length of the next round: what is left of this one plus queued prefill work."""
    deadline_risk_share: float = 0.0
    """Share of the last rounds whose wall time exceeded γ·T_TTFT."""
    sessions_epoch: int | None = None
    """Names this snapshot's session view; pass it back as `?since=` to get only what changes."""
    rounds: list[RoundMeasurement] = Field(default_factory=list)
    """Round measurements since the previous snapshot (bounded); the gateway feeds them to the
    router's profile EWMA."""
