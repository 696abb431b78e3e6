"""Per-round, per-slot and per-switch records of one instance, for the admin API's Rounds.

The instance core feeds every action it finished to `RoundRecorder.on_action` (the instance process
asks it to keep one; the simulator does not); the round totals come from the scheduler's
`RoundSummary` list. Everything scheduler-shaped is read here, through two small
adapters (`_slot_of`, `_round_dict`), so a telemetry schema change is a local fix.
"""

from __future__ import annotations

from collections import deque

from talariad.cold_sched import Prefill, RoundSummary, Switch
from talariad.types import SWITCH_PHASES

SLOT_PHASES = ("P", "D1", "SP", "D", "Dfin")


def _slot_of(sched) -> tuple[int, str, float, str] | None:
    """(round index, model, opened at, current phase) of the open slot; None outside slots."""
    slot = sched.slot
    if slot is None:
        return None
    return slot.round_index, slot.model, slot.opened_at, slot.phase.value


def _round_dict(r: RoundSummary) -> dict:
    return {
        "index": r.index,
        "started_at": r.started_at,
        "wall_s": r.wall_s,
        "active_s": r.active_s,
        "switch_s": r.switch_s,
        "predicted_s": r.predicted_s,
        "sp_admitted": r.sp_admitted,
        "sp_parked": r.sp_parked,
        "switches": r.switches,
        "open": r.open,
    }


HISTORY = 4096
"""Rounds and switches a running instance keeps for the admin API (older ones are dropped)."""


def _record_key(record: dict) -> tuple:
    """An executor's switch record, named by its target and its own timestamp."""
    return record.get("to_model"), record.get("now"), tuple(record.get("phase_s") or ())


class RoundRecorder:
    """Slot phase durations per round and the latest switch records (bounded)."""

    def __init__(self, keep_rounds: int = HISTORY, keep_switches: int = HISTORY) -> None:
        self.keep_rounds = keep_rounds
        self.slots: dict[int, list[dict]] = {}
        self.switches: deque[dict] = deque(maxlen=keep_switches)
        self._walls: dict[tuple, float] = {}  # executor record key -> the switch's wall time
        self._parked_seen = 0
        self._seq = 0

    def on_action(
        self, action, measured_s: float, sched, now: float, switch: dict | None = None
    ) -> None:
        """`switch`: the executor's measured record of a switch (phase_s, staged/dirty bytes), if any."""
        if isinstance(action, Switch):
            self._switch(action, measured_s, sched, now, switch)
            return
        where = _slot_of(sched)
        parked, self._parked_seen = sched.sp_parked - self._parked_seen, sched.sp_parked
        if where is None:
            return
        index, model, opened_at, phase = where
        slots = self.slots.setdefault(index, [])
        if not slots or (slots[-1]["model"], slots[-1]["opened_at"]) != (model, opened_at):
            slots.append(
                {
                    "model": model,
                    "opened_at": opened_at,
                    "phases": dict.fromkeys(SLOT_PHASES, 0.0),
                    "sp_admitted": 0,
                    "sp_parked": 0,
                }
            )
        slot = slots[-1]
        label = action.tag if isinstance(action, Prefill) else phase
        slot["phases"][label] = slot["phases"].get(label, 0.0) + measured_s
        if isinstance(action, Prefill) and action.tag == "SP":
            slot["sp_admitted"] += len(action.calls)
        slot["sp_parked"] += max(parked, 0)
        while len(self.slots) > self.keep_rounds:
            self.slots.pop(min(self.slots))

    def _switch(
        self, action: Switch, measured_s: float, sched, now: float, measured: dict | None
    ) -> None:
        current = sched.rounds.current
        self._seq += 1
        phases = measured.get("phase_s") if measured else None
        if measured is not None:
            self._walls[_record_key(measured)] = measured_s
            while len(self._walls) > (self.switches.maxlen or 0):
                del self._walls[next(iter(self._walls))]
        self.switches.append(
            {
                "seq": self._seq,
                "round_index": current.index if current is not None else -1,
                "from_model": action.from_model or "",
                "to_model": action.to_model,
                "path": (measured or {}).get("path") or action.path.value,
                "total_s": measured_s,
                "phases": dict(zip(SWITCH_PHASES, phases, strict=False)) if phases else {},
                "staged_bytes": measured["staged_bytes"] if measured else -1,
                "dirty_bytes": measured["dirty_bytes"] if measured else -1,
                "at": now,
            }
        )

    def wall_s(self, record: dict) -> float | None:
        """The wall time the round paid for the switch of an executor's switch record (what a
        switch's total means everywhere); None for a switch no step ran, such as the first open."""
        return self._walls.get(_record_key(record))

    def report(self, sched, now: float, limit: int) -> dict:
        """The latest `limit` rounds (closed, then the open one) and switch records, JSON-ready."""
        summaries = list(sched.rounds.closed)
        if sched.rounds.current is not None:
            summaries.append(sched.rounds.current)
        rounds = []
        for r in summaries[-limit:]:
            row = _round_dict(r)
            row["age_s"] = max(0.0, now - row.pop("started_at"))
            row["slots"] = [
                {k: v for k, v in s.items() if k != "opened_at"}
                for s in self.slots.get(r.index, [])
            ]
            rounds.append(row)
        switches = [
            {**{k: v for k, v in s.items() if k != "at"}, "age_s": max(0.0, now - s["at"])}
            for s in list(self.switches)[-limit:]
        ]
        return {"rounds": rounds, "switches": switches}
