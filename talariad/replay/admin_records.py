"""Real-mode replay: the measurements only the daemon has (rounds, switches, SP admissions, HBM in
use), read from its admin API and added to the replay's `RunResult`.

What it cannot read is named in `RunResult.unmeasured`, and the report prints `-` for it: with no
admin socket, rounds, switches, switch share, HBM peak and avoidable opens (a call that opened its
model although another candidate instance had it resident, from the router's explanation of
each opening call, while the daemon's decision log still holds it).
"""

from __future__ import annotations

import dataclasses
import threading
import time

from talariad.replay.metrics import RoundRecord, RunResult, SwitchRecord
from talariad.types import SwitchPath

ADMIN_METRICS = frozenset(
    {"rounds", "switches", "switch_share", "hbm_peak", "sp", "avoidable_opens"}
)
REPLAY_UNMEASURED = frozenset({"parks"})
"""Never measured in real mode: which calls were parked at a slot end (the daemon keeps no per-call
park record the replay client could read)."""


class HBMSampler:
    """Polls each managed instance's memory while the replay runs; keeps the peak bytes in use."""

    def __init__(self, client, interval_s: float = 0.5) -> None:
        self.client, self.interval_s = client, interval_s
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HBMSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        from talariad.admin.client import Refused, Unreachable

        while not self._stop.is_set():
            try:
                for inst in self.client.status().instances:
                    try:
                        m = self.client.memory(inst.name)
                    except Refused:
                        continue
                    if (
                        m.managed and m.active_model
                    ):  # before the first open there is no pool to read
                        self.peak = max(self.peak, m.capacity_bytes - m.hbm_free_bytes)
                        self.samples += 1
            except Unreachable:
                return
            self._stop.wait(self.interval_s)


def settled_rounds(client, wait_s: float = 5.0):
    """The rounds reply once the last round has closed (an idle instance closes it when its SP
    hold ends), or as it is after `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        reply = client.rounds("", 4096)
        if not any(r.open for r in reply.rounds) or time.monotonic() > deadline:
            return reply
        time.sleep(0.25)


def fill(run: RunResult, client, hbm: HBMSampler | None = None) -> None:
    """Add the records of closed rounds and of switches that started within the run (by age);
    call it right after the run."""
    from talariad.admin.client import Refused, Unreachable

    ended = time.monotonic()
    try:
        reply = settled_rounds(client)
    except (Unreachable, Refused):
        run.unmeasured = run.unmeasured | ADMIN_METRICS
        return
    window = (run.wall_clock_s or 0.0) + (time.monotonic() - ended) + 1.0
    for r in reply.rounds:
        if r.age_s <= window and not r.open:
            run.rounds.append(
                RoundRecord(int(r.index), r.instance, r.wall_s, r.active_s, r.switch_s)
            )
            run.sp_admitted += r.sp_admitted
            run.sp_parked += r.sp_parked
    for w in reply.switches:
        if w.age_s <= window:
            run.switches.append(
                SwitchRecord(
                    (run.wall_clock_s or 0.0) - w.age_s,
                    w.instance,
                    w.from_model or None,
                    w.to_model,
                    SwitchPath(w.path),
                    w.total_ms / 1e3,
                )
            )
    run.switches.sort(key=lambda s: s.at_s)
    if not _avoidable_opens(run, client):
        run.unmeasured = run.unmeasured | {"avoidable_opens"}
    if hbm is not None and hbm.samples:
        run.hbm_peak_bytes = hbm.peak
    else:  # the sim keeps no device memory: there is no HBM to measure
        run.unmeasured = run.unmeasured | {"hbm_peak"}


def _avoidable_opens(run: RunResult, client) -> bool:
    """Mark the opening calls whose decision shows another candidate with the model resident;
    False when some opening call's decision is no longer there to read."""
    from talariad.admin.client import Refused, Unreachable

    for i, call in enumerate(run.calls):
        if not call.opened_model:
            continue
        try:
            decision = client.explain(call.call_id)
        except (Unreachable, Refused):
            return False
        avoidable = any(
            not c.needs_replica for c in decision.candidates if c.instance != decision.instance
        )
        run.calls[i] = dataclasses.replace(call, avoidable_open=avoidable)
    return True
