"""A scripted-clock driver for the scheduler tests: it runs the instance core around the test's
scheduler, each step for its predicted duration in virtual time, and releases each session's next
call a gap after the last completes. Calls carry their prefix as the test scripts it."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from talariad.cold_sched import (
    ColdScheduler,
    Completion,
    Decode,
    Idle,
    Prefill,
    SubmittedCall,
    Switch,
)
from talariad.instance import InstanceCall, InstanceCore, StepResult
from talariad.types import KVState, LatencyProfile, Pool, SwitchPath

PROFILE = LatencyProfile(
    prefill_s_per_token=1e-4,
    decode_step_s=0.03,
    restore_s_per_token=1e-5,
    switch_s={SwitchPath.D2D: 0.15, SwitchPath.PARTIAL: 1.0, SwitchPath.H2D: 2.6},
    open_s=3.0,
)


@dataclass(frozen=True)
class Turn:
    """One call of a closed-loop session: `gap_s` after the previous call completes (or at `at`)."""

    prompt_tokens: int
    max_tokens: int
    gap_s: float = 0.4


@dataclass
class Session:
    session_id: str
    model: str
    turns: list[Turn]
    start_at: float = 0.0
    first_prefix: int = 0
    """A prefix the first call finds on device (a shared system prompt): new session, reuse."""


@dataclass
class Step:
    start: float
    end: float
    action: object
    active: str | None


@dataclass
class VirtualDriver:
    sched: ColdScheduler
    sessions: list[Session] = field(default_factory=list)
    calls: list[SubmittedCall] = field(default_factory=list)
    now: float = 0.0
    steps: list[Step] = field(default_factory=list)
    completions: dict[str, Completion] = field(default_factory=dict)
    submitted: dict[str, SubmittedCall] = field(default_factory=dict)
    observe: Callable[[ColdScheduler, object], None] | None = None
    """Called with each non-idle action right after next_action() chose it (invariants)."""

    def __post_init__(self) -> None:
        pool = Pool.HOT if self.sched.mode == "pinned" else Pool.COLD
        s = self.sched
        self.core = InstanceCore("driver", pool, s.models, s.knobs, s.profiles, scheduler=s)
        self._heap: list[tuple[float, int, object]] = []
        self._seq = 0
        self._next_turn = {s.session_id: 0 for s in self.sessions}
        self._by_id = {s.session_id: s for s in self.sessions}
        for call in self.calls:
            self._push(call.arrived_at, call)
        for s in self.sessions:
            self._push(s.start_at, (s.session_id, 0))

    def _push(self, at: float, item: object) -> None:
        heapq.heappush(self._heap, (at, self._seq, item))
        self._seq += 1

    def submit(self, call: SubmittedCall, now: float) -> None:
        """Queue a scripted call through the instance core, its prefix as the test states it."""
        self.submitted[call.call_id] = call
        record = InstanceCall(
            call.call_id,
            call.session_id,
            call.model,
            call.prompt_tokens,
            call.max_tokens,
            call.arrived_at,
        )
        self.core.submit_resolved(
            record, call.prefix_tokens, call.prefix_state, call.is_continuation, now
        )

    def _release(self, until: float) -> None:
        """Submit everything that arrives up to `until`, each at its own arrival time."""
        while self._heap and self._heap[0][0] <= until + 1e-12:
            at, _, item = heapq.heappop(self._heap)
            call = item if isinstance(item, SubmittedCall) else self._turn_call(at, *item)
            now = max(at, self._last_event)
            self.submit(call, now)
            self._last_event = now

    def _turn_call(self, at: float, session_id: str, k: int) -> SubmittedCall:
        s = self._by_id[session_id]
        turn = s.turns[k]
        prev = self.completions.get(f"{session_id}#{k - 1}")
        prefix, state = min(s.first_prefix, turn.prompt_tokens), KVState.DEVICE
        if prev is not None:
            entry = self.sched.ledger.get(
                session_id, s.model
            )  # what the instance telemetry reports
            prefix, state = min(prev.kv_len, turn.prompt_tokens), entry.state
        return SubmittedCall(
            f"{session_id}#{k}", session_id, s.model, turn.prompt_tokens, prefix, state,
            turn.max_tokens, at, is_continuation=k > 0,
        )  # fmt: skip

    def duration(self, action: object) -> float:
        return action.predicted_s

    def run(self, max_steps: int = 100_000, until: float | None = None) -> None:
        self._last_event = self.now
        for _ in range(max_steps):
            self._release(self.now)
            plan = self.core.next_plan(self.now)
            action = plan if isinstance(plan, Idle) else plan.action
            if isinstance(action, Idle):  # wake at action.until or at the next arrival
                wake = min([t for t in (action.until, self._next_arrival()) if t is not None],
                           default=None)  # fmt: skip
                if wake is None or (until is not None and wake > until):
                    return
                self.now = max(self.now, wake)
                continue
            if self.observe is not None:
                self.observe(self.sched, action)
            start, dur = self.now, self.duration(action)
            self.now = start + dur
            self._release(self.now)
            self.steps.append(Step(start, self.now, action, self.sched.active))
            result = StepResult(calls=None)  # one token per call
            for done in self.core.finish(plan, result, self.now, dur):
                self._on_complete(done.completion)
            self._last_event = self.now
            self.core.check_integrity()
            if until is not None and self.now >= until:
                return
        raise AssertionError("driver did not settle")

    def _next_arrival(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def _on_complete(self, done: Completion) -> None:
        self.completions[done.call_id] = done
        sid, _, k = done.call_id.partition("#")
        if sid in self._by_id and int(k) + 1 < len(self._by_id[sid].turns):
            turn = self._by_id[sid].turns[int(k) + 1]
            self._push(done.finished_at + turn.gap_s, (sid, int(k) + 1))

    # ---- views used by the assertions --------------------------------------------------------

    def actions(self, kind: type) -> list[Step]:
        return [st for st in self.steps if isinstance(st.action, kind)]

    def prefill_of(self, call_id: str) -> Step:
        return next(st for st in self.actions(Prefill) if call_id in st.action.call_ids)

    def decode_steps_of(self, model: str) -> list[Step]:
        return [st for st in self.actions(Decode) if st.action.model == model]

    def switches(self) -> list[Switch]:
        return [st.action for st in self.actions(Switch)]
