"""The instance process's edge between the internal API (`wire.messages`) and the instance core:
a request becomes the core's `CallOrder`; the core's results become stream events and its
`InstanceTelemetry` the `Telemetry` reply. The core itself never sees the wire's types."""

from __future__ import annotations

from dataclasses import fields

from talariad.cold_sched import Prefill
from talariad.instance import CallOrder, CallOutput, Done, InstanceTelemetry, Refusal, StepPlan
from talariad.wire.messages import (
    DoneEvent,
    ErrorEvent,
    GenerateRequest,
    Telemetry,
    TokenEvent,
    Usage,
)

_TELEMETRY_FIELDS = tuple(f.name for f in fields(InstanceTelemetry))


def call_order(req: GenerateRequest) -> CallOrder:
    """What the core reads of a request; the request itself rides along for the executor."""
    return CallOrder(
        req.call_id, req.session_id, req.model, req.max_tokens, req.clamp_max_tokens, req
    )


def telemetry_message(t: InstanceTelemetry) -> Telemetry:
    """The internal API's reply for the core's snapshot: the same fields, not validated again."""
    values = {name: getattr(t, name) for name in _TELEMETRY_FIELDS}
    # given: model_construct fills an omitted factory default via inspect.signature, ~65 µs a field
    return Telemetry.model_construct(**values, sessions_removed=[])


def token_event(plan: StepPlan, call_id: str, out: CallOutput) -> TokenEvent:
    """A piece of text; the call's first also says how long the prompt is and how much of it was
    reused (Anthropic's `message_start` reports both)."""
    call = plan.calls.get(call_id)
    if call is None or call.out:
        return TokenEvent(text=out.text)
    cached = out.cached_tokens if out.cached_tokens is not None else call.cached_tokens
    if cached is None:  # the scheduler's plan
        items = plan.action.calls if isinstance(plan.action, Prefill) else ()
        item = next((i for i in items if i.call_id == call_id), None)
        cached = item.cached_device_tokens + item.restore_tokens if item is not None else 0
    return TokenEvent(text=out.text, prompt_tokens=call.prompt_tokens, cached_tokens=cached)


def done_event(done: Done) -> DoneEvent:
    c = done.completion
    usage = Usage(
        prompt_tokens=c.prompt_tokens,
        completion_tokens=done.call.generated,
        cached_tokens=done.cached_tokens,
        kv_source=done.call.kv_source,
    )
    return DoneEvent(
        finish_reason=done.finish_reason,
        stop_sequence=done.call.stop_sequence,
        usage=usage,
        ttft_s=c.ttft_s,
        kv_state=done.kv_state.value,
        kv_len=done.kv_len,
    )


def refusal_event(r: Refusal) -> ErrorEvent:
    return ErrorEvent(
        status=r.status,
        code=r.code,
        param=r.param,
        message=r.message,
        prompt_tokens=r.prompt_tokens,
        limit=r.limit,
    )
