"""Per-call state and the two ledgers the scheduler owns: the call table (queues, running batch)
and the session KV ledger (where each session's prefix lives for each model on this instance)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from talariad.types import KVState

from .messages import SchedCall


class CallStatus(str, enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class CallProgress:
    call: SchedCall
    status: CallStatus = CallStatus.WAITING
    generated: int = 0
    first_token_at: float | None = None
    admitted_by: str | None = None
    cached_tokens: int = 0
    parked_times: int = 0
    park_cost_s: float = 0.0
    """Predicted restore and recompute time its resumptions after being parked cost."""
    sp_return: bool = False
    """Arrived while its model's slot was open, after P, with a reusable prefix (a return event)."""

    @property
    def kv_reservation(self) -> int:
        """Device KV held while running; reserving the full output up front means no preemption."""
        return self.call.prompt_tokens + self.call.max_tokens

    @property
    def kv_len(self) -> int:
        """Context this call holds on device while it runs: its prompt and what it generated."""
        return self.call.prompt_tokens + self.generated

    @property
    def resumed(self) -> bool:
        return self.generated > 0


class CallTable:
    """Waiting queues per model (FIFO) and the running batch of the active model."""

    def __init__(self, models: list[str]) -> None:
        self.records: dict[str, CallProgress] = {}
        self.waiting: dict[str, list[str]] = {m: [] for m in models}
        self.running: list[str] = []

    def add(self, call: SchedCall) -> CallProgress:
        rec = self.records[call.call_id] = CallProgress(call)
        self.waiting[call.model].append(call.call_id)
        return rec

    def waiting_records(self, model: str) -> list[CallProgress]:
        return [self.records[c] for c in self.waiting[model]]

    def running_records(self) -> list[CallProgress]:
        return [self.records[c] for c in self.running]

    def start(self, call_id: str) -> None:
        self.waiting[self.records[call_id].call.model].remove(call_id)
        self.records[call_id].status = CallStatus.RUNNING
        self.running.append(call_id)

    def finish(self, call_id: str) -> CallProgress:
        self.running.remove(call_id)
        rec = self.records.pop(call_id)
        rec.status = CallStatus.FINISHED
        return rec

    def park_running(self) -> list[CallProgress]:
        """Move the running batch to the front of its model's queue (it is older than the queue)."""
        parked = self.running_records()
        for rec in parked:
            rec.status = CallStatus.WAITING
            rec.parked_times += 1
        if parked:
            model = parked[0].call.model
            self.waiting[model][:0] = [rec.call.call_id for rec in parked]
        self.running = []
        return parked

    def has_work(self, model: str) -> bool:
        """Calls of `model` wait or run here (False for a model this instance does not host)."""
        return bool(self.waiting.get(model)) or any(
            self.records[c].call.model == model for c in self.running
        )

    def kv_used(self) -> int:
        return sum(rec.kv_reservation for rec in self.running_records())

    def check_integrity(self) -> None:
        queued = [c for q in self.waiting.values() for c in q]
        listed = queued + self.running
        if len(listed) != len(set(listed)) or set(listed) != set(self.records):
            raise RuntimeError(
                f"call table: {len(queued)} queued + {len(self.running)} running "
                f"!= {len(self.records)} records (or a call is listed twice)"
            )
        for model, queue in self.waiting.items():
            for c in queue:
                rec = self.records[c]
                if rec.call.model != model or rec.status is not CallStatus.WAITING:
                    raise RuntimeError(f"call table: {c} in {model} queue is {rec.status.value}")
        if len({self.records[c].call.model for c in self.running}) > 1:
            raise RuntimeError("call table: running batch mixes models")


@dataclass(slots=True)
class LedgerEntry:
    state: KVState
    kv_len: int
    updated_at: float = 0.0


@dataclass
class SessionLedger:
    """(session, model) -> where that prefix lives here; the substrate corrects it via set().
    Every change goes through set() or drop(), or keeps `device_tokens` right itself (the
    scheduler's per-step path), so the device KV it totals is read in O(models)."""

    entries: dict[tuple[str, str], LedgerEntry] = field(default_factory=dict)
    device_tokens: dict[str, int] = field(init=False, repr=False, compare=False)
    """Per model, the kv_len summed over its DEVICE entries."""
    # session -> models with an entry
    _models_of: dict[str, list[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.device_tokens, self._models_of = {}, {}
        for (session, model), entry in self.entries.items():
            self._models_of.setdefault(session, []).append(model)
            if entry.state is KVState.DEVICE:
                self.device_tokens[model] = self.device_tokens.get(model, 0) + entry.kv_len

    def set(self, session: str, model: str, state: KVState, kv_len: int, now: float) -> None:
        if state.__class__ is not KVState:  # hot path: every decode step sets every running call
            state = KVState(state)
        if state is KVState.MISSING:  # a prefix that lives nowhere is no entry (see `get`)
            self._remove(session, model)
            return
        kv_len = max(kv_len, 0)
        entry = self.entries.get((session, model))
        delta = kv_len if state is KVState.DEVICE else 0
        if entry is None:
            self.entries[(session, model)] = LedgerEntry(state, kv_len, now)
            self._models_of.setdefault(session, []).append(model)
        else:  # in place: readers copy the fields out, none keeps an entry
            if entry.state is KVState.DEVICE:
                delta -= entry.kv_len
            entry.state, entry.kv_len, entry.updated_at = state, kv_len, now
        if delta:
            self.device_tokens[model] = self.device_tokens.get(model, 0) + delta

    def _remove(self, session: str, model: str) -> None:
        entry = self.entries.pop((session, model), None)
        if entry is None:
            return
        if entry.state is KVState.DEVICE and entry.kv_len:
            self.device_tokens[model] -= entry.kv_len
        models = self._models_of[session]
        models.remove(model)
        if not models:
            del self._models_of[session]

    def drop(self, session: str) -> int:
        """Forget every prefix of `session` here; how many entries there were."""
        models = self._models_of.pop(session, ())
        for model in models:
            entry = self.entries.pop((session, model))
            if entry.state is KVState.DEVICE and entry.kv_len:
                self.device_tokens[model] -= entry.kv_len
        return len(models)

    def get(self, session: str, model: str) -> LedgerEntry:
        return self.entries.get((session, model), LedgerEntry(KVState.MISSING, 0))

    def reusable(self, session: str, model: str, host_kv: bool) -> LedgerEntry:
        """The prefix as the scheduler may use it: host copies count only with host KV enabled."""
        entry = self.get(session, model)
        if entry.state is KVState.HOST and not host_kv:
            return LedgerEntry(KVState.MISSING, 0, entry.updated_at)
        return entry

    def demote(
        self, model: str, to: KVState, now: float, keep: frozenset[str] = frozenset()
    ) -> None:
        """A switch away from `model` releases its device KV: it is saved to host or lost, except
        for the sessions in `keep` (calls parked mid-decode, whose rows stay on device)."""
        for key, entry in list(self.entries.items()):
            if key[1] == model and entry.state is KVState.DEVICE and key[0] not in keep:
                self.set(key[0], model, to, entry.kv_len, now)

    def check_integrity(self) -> None:
        """Raise RuntimeError if the per-model device totals or the session index disagree."""
        fresh = SessionLedger(dict(self.entries))
        if {m: n for m, n in self.device_tokens.items() if n} != {
            m: n for m, n in fresh.device_tokens.items() if n
        }:
            raise RuntimeError(f"ledger: device tokens {self.device_tokens} != entries' sums")
        if {s: sorted(m) for s, m in self._models_of.items()} != {
            s: sorted(m) for s, m in fresh._models_of.items()
        }:
            raise RuntimeError("ledger: the session index disagrees with the entries")
