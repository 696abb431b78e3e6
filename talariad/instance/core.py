"""InstanceCore: one instance, sans-IO. It wraps the cold-pool scheduler (time-shared cold or pinned
hot) with everything both shells used to do on their own: admission (the output clamp, the refusal
of calls that can never fit, the submit clamp), per-call records, step result -> `finish`, KV
updates, completions with a truthful KV state, round measurements for the router's profile EWMA,
switch and round records, the telemetry snapshot, and the admin API's rotation changes and session
forgetting. It never reads a clock: every entry point takes `now` from its shell.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from talariad.cold_sched import (
    ColdScheduler,
    Completion,
    Decode,
    Idle,
    Prefill,
    SchedKnobs,
    Switch,
)
from talariad.cold_sched.snapshot import (
    deadline_risk_share,
    queued_suffix_tokens,
    round_load_s,
    round_remaining_s,
)
from talariad.types import (
    KVState,
    LatencyProfile,
    ModelLoad,
    Pool,
    RoundMeasurement,
    SwitchRecord,
)

from .calls import CallOrder, InstanceCall, Refusal
from .contract import (
    CallOutput,
    Executor,
    ExecutorState,
    KVLocation,
    MemoryStats,
    StepPlan,
    StepResult,
)
from .rounds import RoundRecorder
from .telemetry import InstanceTelemetry

ROUND_REPORTS = 32
"""Round measurements kept between two reads (a reader that polls less often than rounds close
gets the latest ones)."""


@dataclass(slots=True)
class Done:
    """A completed call and where its session's KV lives now."""

    call: InstanceCall
    completion: Completion
    kv_state: KVState
    kv_len: int

    @property
    def finish_reason(self) -> str:
        return self.call.finish_reason or (
            "stop" if self.call.generated < self.call.max_tokens else "length"
        )

    @property
    def cached_tokens(self) -> int:
        cached = self.call.cached_tokens
        return self.completion.cached_tokens if cached is None else cached


class InstanceCore:
    def __init__(
        self,
        name: str,
        pool: Pool | str,
        models: list[str],
        knobs: SchedKnobs,
        profiles: dict[str, LatencyProfile],
        *,
        executor: ExecutorState | None = None,
        max_context: dict[str, int] | None = None,
        prewarm: bool = False,
        scheduler: ColdScheduler | None = None,
        recorder: RoundRecorder | None = None,
        history: int | None = None,
    ) -> None:
        """executor: its `ExecutorState` members are called (sync; `admit` also encodes with it);
        None in pure tests.
        prewarm: every model counts as switched in once (the paper's runs exclude warm-up).
        scheduler: one already built for these models and knobs (scripted scheduler tests).
        recorder: keeps per-slot and per-switch records of every finished action (admin API).
        history: switch records and closed rounds kept (a daemon's instance runs for weeks); None
        keeps them all (the simulator reports a whole run)."""
        self.name, self.pool, self.models = name, Pool(pool), list(models)
        self.configured = list(models)
        """The models the config gives this instance; `models` is the rotation served now."""
        self.recorder = recorder
        self.profiles, self.executor = profiles, executor
        mode = "pinned" if self.pool is Pool.HOT else "time_shared"
        self.sched = scheduler or ColdScheduler(knobs, profiles, self.models, mode=mode)
        self.sched.rounds.keep(history)
        self.max_context = max_context or {}
        self.calls: dict[str, InstanceCall] = {}
        self.opened: set[str] = set(self.models) if prewarm or mode == "pinned" else set()
        """Models switched in here at least once: switching one in again is no full open."""
        self.switches: deque[SwitchRecord] = deque(maxlen=history)
        self.switch_count = 0
        self.version = 0
        """Bumped on every change (a shell republishes telemetry when it moved)."""
        self.published = 0
        self._meas: dict[str, RoundMeasurement] = {}
        self._batch_ids: list[str] = []
        self._abandoned: set[str] = set()
        self._batch: dict[str, InstanceCall] = {}
        self._rounds_sent = 0
        self._round_seq = 0
        self.round_reports: deque[RoundMeasurement] = deque(maxlen=ROUND_REPORTS)
        self._telemetry_seq = 0  # the last round report a telemetry snapshot carried

    # ---- calls ------------------------------------------------------------------------------

    def admit(self, order: CallOrder, now: float) -> InstanceCall | Refusal:
        """A call from the internal API: encode it, lower its output limit to what fits when it asks
        to (`clamp_max_tokens`), and queue it; the client's error when it is not served here.
        Needs an `Executor` (it encodes `order.request`)."""
        executor: Executor = self.executor
        model = order.model
        if model not in self.models:
            message = f"instance {self.name} does not serve model {model!r} now"
            return Refusal("model_not_loaded", None, message, status=503)
        try:
            prompt = executor.encode(order.request)
        except ValueError as err:  # a conversation the model's chat template refuses
            return Refusal("invalid_value", "messages", str(err))
        max_tokens = order.max_tokens
        if order.clamp_max_tokens and prompt:  # at least one token
            max_tokens = max(1, min(max_tokens, self.room(model, len(prompt))))
        refusal = self.refusal(model, len(prompt), max_tokens)
        if refusal is not None:
            return refusal
        session = order.session_id or f"call-{order.call_id}"
        call = InstanceCall(
            order.call_id,
            session,
            model,
            len(prompt),
            max_tokens,
            now,
            request=order.request,
            prompt=prompt,
        )
        try:
            self.submit(call, executor.reusable(session, model, prompt), now)
        except ValueError as err:  # anything else the scheduler finds it can never fit
            return Refusal("invalid_value", None, str(err))
        return call

    def refusal(self, model: str, prompt_tokens: int, max_tokens: int) -> Refusal | None:
        """A call that can never be served here, as the client's error."""
        if prompt_tokens <= 0:
            return Refusal("invalid_value", "messages", "the prompt is empty")
        need, limit = prompt_tokens + max_tokens, self.max_context.get(model)
        if limit is not None and need > limit:
            return Refusal(
                "context_length_exceeded",
                "max_tokens",
                f"this model's maximum context is {limit} tokens; the call needs {need} "
                f"({prompt_tokens} prompt + {max_tokens} max_tokens)",
                limit,
                prompt_tokens,
            )
        cap = self.sched.knobs.kv_capacity_tokens
        if need > cap:
            return Refusal(
                "context_length_exceeded",
                "max_tokens",
                f"the call needs {need} tokens of KV cache ({prompt_tokens} prompt + "
                f"{max_tokens} max_tokens); this instance holds at most {cap}",
                cap,
                prompt_tokens,
            )
        return None

    def room(self, model: str, prompt_tokens: int) -> int:
        """Output tokens that fit after a prompt of `prompt_tokens` (context and KV capacity)."""
        limit = min(
            self.max_context.get(model, self.sched.knobs.kv_capacity_tokens),
            self.sched.knobs.kv_capacity_tokens,
        )
        return limit - prompt_tokens

    def submit(self, call: InstanceCall, reusable: int, now: float) -> None:
        """Queue a call; `reusable`: prompt tokens its session's earlier context covers. The prefix
        the scheduler plans with is clamped to what this instance's ledger still holds (ValueError:
        the scheduler finds the call can never fit)."""
        entry = self.sched.ledger.get(call.session_id, call.model)
        reuse = max(min(reusable, entry.kv_len, call.prompt_tokens - 1), 0)
        state = entry.state if reuse > 0 else KVState.MISSING
        call.claimed_prefix = reusable
        self.submit_resolved(call, reuse, state, entry.kv_len > 0, now)

    def submit_resolved(
        self, call: InstanceCall, prefix: int, state: KVState, continuation: bool, now: float
    ) -> None:
        """Queue a call whose reusable prefix and its location are already known (`submit`
        resolves them against the ledger; a scripted test states them). The scheduler holds
        the call's record itself (a `SchedCall`), not a copy."""
        call.prefix_tokens, call.prefix_state = prefix, state
        call.arrived_at, call.is_continuation = now, continuation
        self.sched.submit(call, now)
        call.progress = self.sched.table.records[call.call_id]
        self.calls[call.call_id] = call
        self.version += 1

    def cancel(self, call_id: str, now: float) -> bool:
        """Drop a call whose client left: True if it was dropped now, False if it is in the action
        in flight (it then ends at that action's finish)."""
        call = self.calls.get(call_id)
        if call is None:
            return True
        if self.sched.cancel(call_id, now):
            del self.calls[call_id]
            self.version += 1
            if self.executor is not None:
                self.executor.release(call)
            return True
        call.abandoned = True
        self._abandoned.add(call_id)
        return False

    # ---- steps ------------------------------------------------------------------------------

    def next_plan(self, now: float) -> StepPlan | Idle:
        action = self.sched.next_action(now)
        kind = action.__class__  # the action classes are final
        if kind is Idle:
            return action
        if kind is Switch:  # only a switch needs the round it opens (its HBM footprint)
            rnd = self.sched.rounds.next_index()
            return StepPlan(action, {}, self.calls, self.sched.ledger, rnd)
        ids = action.call_ids
        if ids != self._batch_ids:  # decode steps repeat one batch: build its view once
            self._batch_ids, self._batch = list(ids), {cid: self.calls[cid] for cid in ids}
        return StepPlan(action, self._batch, self.calls, self.sched.ledger, -1)

    def finish(
        self, plan: StepPlan, result: StepResult, now: float, measured_s: float
    ) -> list[Done]:
        """The executor ran `plan` in `measured_s`, ending at `now`."""
        action = plan.action
        kind = action.__class__
        self.version += 1
        if kind is Switch:
            self._finish_switch(action, result, now, measured_s)
            if self.recorder is not None:
                self.recorder.on_action(action, measured_s, self.sched, now, result.switch_report)
            return []
        outs = result.calls
        if kind is Prefill:
            for item in action.calls:
                out = outs.get(item.call_id) if outs else None
                self._label(plan.calls[item.call_id], item, out)
        if outs is None:  # every call emitted one token and nothing else (a modelled step)
            tokens = None
            finished = self._abandoned.intersection(plan.calls) if self._abandoned else None
        else:
            finished, tokens = self._outputs(plan, outs)
        done = self.sched.finish(action, now, measured_s, tokens=tokens, finished=finished or None)
        self._measure(action, measured_s)
        if result.kv_updates:
            self._apply(result.kv_updates, now)
        if self.recorder is not None:
            self.recorder.on_action(action, measured_s, self.sched, now)
        return [self._complete(c, now) for c in done] if done else done

    def finish_decodes(
        self, plan: StepPlan, end: float, seconds: float, until: float
    ) -> tuple[float | None, float | None]:
        """The simulator's shortcut (the daemon never calls it): finish(plan, ...) then
        next_plan(...) over a run of identical decode steps that complete no call
        (`ColdScheduler.finish_decodes`). Returns (the time reached, None when no step was
        finished; the end of the decode now in flight, or None when next_plan decides next).
        A recorder or an abandoned call needs every step: then it finishes none."""
        if self.recorder is not None or self._abandoned or plan.action.__class__ is not Decode:
            return None, end
        steps, reached, nxt = self.sched.finish_decodes(plan.action, end, seconds, until)
        if not steps:
            return None, end
        self.version += steps
        model = plan.action.model
        m = self._meas.get(model) or self._meas.setdefault(model, RoundMeasurement(model))
        m.decode_steps += steps
        for _ in range(steps):  # the same float sum as one `_measure` per step
            m.decode_s += seconds
        return reached, nxt

    def _outputs(self, plan: StepPlan, outs: dict[str, CallOutput]) -> tuple[set, dict]:
        """Fold each call's output into its record: (calls that ended, tokens per call)."""
        finished, tokens = set(), {}
        for cid, call in plan.calls.items():
            out = outs.get(cid)
            tokens[cid] = 0 if out is None else out.tokens
            if out is not None:
                if out.text:
                    call.out.append(out.text)
                if out.finish_reason:
                    call.finish_reason = out.finish_reason
                    call.stop_sequence = out.stop_sequence
            if call.abandoned or (out is not None and (out.finish_reason or out.error)):
                finished.add(cid)
        return finished, tokens

    def _label(self, call: InstanceCall, item, out: CallOutput | None) -> None:
        """First admission: how much of the prompt was reused and where it came from."""
        if call.generated:
            return
        if out is not None and out.cached_tokens is not None:
            call.cached_tokens = out.cached_tokens
        if out is not None and out.kv_source is not None:
            call.kv_source = out.kv_source
        elif item.restore_tokens:
            call.kv_source = "host"
        elif item.cached_device_tokens:
            call.kv_source = "device"
        else:
            call.kv_source = "recompute" if call.claimed_prefix > 0 else "none"

    def _finish_switch(
        self, action: Switch, result: StepResult, now: float, seconds: float
    ) -> None:
        path = result.switch_path or action.path
        if result.switch_failed is not None:  # nothing opened: the target's slot is skipped
            self.sched.finish(action, now, seconds, switch_failed=True)
            self._apply(result.kv_updates, now)
            return
        self.sched.finish(action, now, seconds, switch_path=path)
        self.sched.set_staging(result.staging)
        self.opened.add(action.to_model)
        self.opened.difference_update(result.evicted)
        self.switch_count += 1
        if action.from_model is not None or seconds > 0:
            self.switches.append(
                SwitchRecord(
                    now - seconds, self.name, action.from_model, action.to_model, path, seconds
                )
            )
            m = self._meas.get(action.to_model) or self._meas.setdefault(
                action.to_model, RoundMeasurement(action.to_model)
            )
            m.switch_path, m.switch_s = path, seconds
        self._apply(result.kv_updates, now)

    def _apply(self, updates: list[KVLocation], now: float) -> None:
        for u in updates:
            self.sched.set_kv_state(u.session_id, u.model, u.state, u.kv_len, now)

    def _complete(self, c: Completion, now: float) -> Done:
        call = self.calls.pop(c.call_id)
        self._abandoned.discard(c.call_id)
        update = self.executor.remember(call) if self.executor is not None else None
        if update is not None:
            self._apply([update], now)
        entry = self.sched.ledger.get(c.session_id, c.model)
        return Done(call, c, entry.state, entry.kv_len)

    # ---- measurements for the router's profile EWMA ------------------------------------------

    def _measure(self, action: Prefill | Decode, seconds: float) -> None:
        m = self._meas.get(action.model) or self._meas.setdefault(
            action.model, RoundMeasurement(action.model)
        )
        if action.__class__ is Decode:
            m.decode_steps += 1
            m.decode_s += seconds
            return
        restore_tokens = sum(i.restore_tokens for i in action.calls)
        restore_s = self.profiles[action.model].restore_s(restore_tokens)
        m.prefill_tokens += sum(i.recompute_tokens for i in action.calls)
        m.prefill_s += seconds - restore_s
        m.restored_tokens += restore_tokens
        m.restore_s += restore_s

    def round_measurements(self) -> list[RoundMeasurement]:
        """Per-model measurements since the last closed round (pinned: since the last read)."""
        closed = self.sched.rounds.count
        if self.sched.mode == "time_shared" and closed == self._rounds_sent:
            return []
        self._rounds_sent = closed
        out = []
        for _, m in sorted(self._meas.items()):
            self._round_seq += 1
            m.seq = self._round_seq
            out.append(m)
        self._meas = {}
        self.round_reports.extend(out)
        return out

    def rounds(self, now: float, limit: int) -> dict:
        """The latest `limit` round records (with per-slot phases) and switch records (admin API;
        empty without a recorder)."""
        if self.recorder is None:
            return {"instance": self.name, "rounds": [], "switches": []}
        return {"instance": self.name, **self.recorder.report(self.sched, now, limit)}

    # ---- admin actions ----------------------------------------------------------------------

    def set_rotation(self, model: str, serve: bool) -> str | None:
        """Load (serve=True) or unload a configured model at run time; the reason it cannot, or
        None. Unloading the active model of an idle instance switches it away at its next step,
        so its weights leave the device."""
        s = self.sched
        if model not in self.configured:
            return f"model {model!r} is not configured on instance {self.name}"
        if (model in self.models) == serve:
            return None
        if s.mode == "pinned":
            return f"{self.name} is a hot instance; pin another model instead"
        if not serve:
            busy = len(s.table.waiting[model]) + sum(
                s.table.records[c].call.model == model for c in s.table.running
            )
            if busy:
                return f"{busy} calls of {model!r} are queued or running on {self.name}; drain it first"
            if len(self.models) == 1:
                return f"{model!r} is the last model of {self.name}"
            if s.active == model:
                s.retire(model, next(m for m in self.models if m != model))
        if self.executor is not None:
            (self.executor.load if serve else self.executor.unload)(model)
        keep = set(self.models) | {model} if serve else set(self.models) - {model}
        self.models = [m for m in self.configured if m in keep]
        if not serve:
            self.opened.discard(model)
        self.version += 1
        return None

    def forget(self, session: str) -> bool:
        """Drop a session's context and KV here (the ledger, the executor's pages and host
        copies); True if there was any."""
        dropped = self.sched.ledger.drop(session)
        freed = self.executor.forget(session) if self.executor is not None else None
        return bool(dropped) if freed is None else freed

    # ---- telemetry --------------------------------------------------------------------------

    def telemetry(
        self, now: float, memory: MemoryStats | None = None, sessions: bool = True
    ) -> InstanceTelemetry:
        """A fresh, versioned snapshot (every read is a new observation). `sessions=False`: leave
        the session list empty (a caller that sends changes reads `session_rows` instead)."""
        s = self.sched
        self.published += 1
        self.round_measurements()
        if memory is None and self.executor is not None:
            memory = self.executor.memory()
        kv_occ = memory.kv_occupancy if memory is not None else None
        if kv_occ is None:
            kv_occ = s.table.kv_used() / max(s.knobs.kv_capacity_tokens, 1)
        return InstanceTelemetry(
            instance=self.name,
            version=self.published,
            pool=self.pool.value,
            models=list(self.models),
            active_model=s.active,
            loaded_models=[s.active] if s.active else [],
            queued={m: len(s.table.waiting[m]) for m in s.models},
            running=len(s.table.running),
            sessions=[KVLocation(k[0], k[1], state, n) for k, state, n in self.session_rows()]
            if sessions
            else [],
            round_remaining_s=round_remaining_s(s, now) if s.mode == "time_shared" else 0.0,
            kv_occupancy=min(kv_occ, 1.0),
            hbm_free_bytes=memory.hbm_free_bytes if memory is not None else None,
            staging_slack_bytes=memory.staging_slack_bytes if memory is not None else None,
            switches=self.switch_count,
            opened_models=sorted(self.opened),
            model_load={m: self._model_load(m) for m in s.models},
            round_load_s=round_load_s(s),
            deadline_risk_share=deadline_risk_share(s),
            rounds=self._new_reports(),
        )

    def session_rows(self) -> list[tuple[tuple[str, str], KVState, int]]:
        """The sessions `telemetry` lists, as ((session_id, model), state, kv_len) rows, for a
        caller that sends only what changed (`engine/deltas.py`)."""
        return [
            (k, e.state, e.kv_len)
            for k, e in self.sched.ledger.entries.items()
            if e.state is not KVState.MISSING
        ]

    def _new_reports(self) -> list[RoundMeasurement]:
        """Round reports no earlier snapshot carried: telemetry has one reader (the gateway), and a
        lost reply only loses a refinement of the router's EWMA, never a decision."""
        new = [r for r in self.round_reports if r.seq > self._telemetry_seq]
        if new:
            self._telemetry_seq = new[-1].seq
        return new

    def _model_load(self, model: str) -> ModelLoad:
        s = self.sched
        running = len(s.table.running) if model == s.active else 0
        return ModelLoad(
            queued_calls=len(s.table.waiting[model]),
            queued_tokens=queued_suffix_tokens(s, model),
            running=running,
            switch_cost_s=s.predicted_switch_s(model),
            open_cost_s=self.profiles[model].open_s,
        )

    def check_integrity(self) -> None:
        self.sched.check_integrity()
        if set(self.calls) != set(self.sched.table.records):
            raise RuntimeError("instance core: call records and the scheduler's table disagree")
