"""One simulated instance: the virtual-time shell around the instance core (`InstanceCore`) with the
`sim` cost and memory model (`SimModel`) as its executor. It decides nothing itself: it starts the
core's next step, charges what the model says it takes, and hands the result back at its end.

Rotation: a model switched in before (or prewarmed) is a switch away, one never opened is a full
open; `prewarm` makes every model count as opened at t=0 and the first activation free (§5.1).
"""

from __future__ import annotations

from talariad.cold_sched import Idle, SchedKnobs
from talariad.instance import InstanceCall, InstanceCore, StepPlan
from talariad.instance.core import Done
from talariad.perfmodel.memory import SimMemory
from talariad.perfmodel.model import SimModel
from talariad.router import InstanceSnapshot, RoundMeasurement
from talariad.router.snapshot import router_snapshot
from talariad.types import LatencyProfile, Pool


class SimInstance:
    def __init__(
        self,
        name: str,
        pool: Pool,
        models: list[str],
        knobs: SchedKnobs,
        profiles: dict[str, LatencyProfile],
        memory: SimMemory,
        prewarm: bool = True,
    ) -> None:
        self.name, self.pool, self.models = name, pool, list(models)
        self.model = SimModel(
            profiles, memory, self.models, pinned=pool is Pool.HOT, prewarm=prewarm
        )
        self.core = InstanceCore(
            name, pool, self.models, knobs, profiles, executor=self.model, prewarm=prewarm
        )
        self.core.opened &= self.model.loaded  # prewarm opens only what the memory holds
        self.sched = self.core.sched
        self.plan: StepPlan | None = None
        self.end_s = 0.0
        self._seconds = 0.0
        self.published_at = float("-inf")
        self.published_version = -1
        self._fed = 0

    def submit(
        self,
        call_id: str,
        session: str,
        model: str,
        prompt: int,
        prefix: int,
        max_tokens: int,
        now: float,
    ) -> None:
        """`prefix`: the prompt tokens the session's previous call covered (the trace's word)."""
        self.core.submit(
            InstanceCall(call_id, session, model, prompt, max_tokens, now), prefix, now
        )

    def resident(self, model: str) -> bool:
        """A call for `model` placed here now would not open it: its weights are resident (a
        switch away) or a queued call is already opening it."""
        return model in self.core.opened or self.sched.table.has_work(model)

    @property
    def busy(self) -> bool:
        return self.plan is not None

    @property
    def version(self) -> int:
        return self.core.version

    def start(self, now: float) -> tuple[float | None, float | None]:
        """Start the next step: (end time, None), or (None, wake-up time or None) when idle."""
        plan = self.core.next_plan(now)
        if plan.__class__ is Idle:
            return None, plan.until
        self._seconds = self.model.begin(plan, now)
        self.plan, self.end_s = plan, now + self._seconds
        return self.end_s, None

    def finish(self, now: float) -> list[Done]:
        plan, self.plan = self.plan, None
        return self.core.finish(plan, self.model.end(plan, now), now, self._seconds)

    def finish_decodes(self, until: float) -> tuple[float | None, float | None]:
        """finish() then start(), step after step, over the decode in flight and the identical
        ones after it that end before `until` and complete no call (`InstanceCore.finish_decodes`;
        the model charges every such step the same seconds and moves no KV). Returns (the time
        reached, None when no step was finished; the end of the step now in flight, or None
        when start() comes next)."""
        reached, nxt = self.core.finish_decodes(self.plan, self.end_s, self._seconds, until)
        if reached is not None:
            if nxt is None:
                self.plan = None
            else:
                self.end_s = nxt
        return reached, nxt

    def snapshot(self, now: float) -> InstanceSnapshot:
        self.published_at, self.published_version = now, self.core.version
        return router_snapshot(self.core.telemetry(now), self.models, now, True)

    def round_measurements(self) -> list[tuple[str, RoundMeasurement]]:
        """Round measurements not yet handed to the router, oldest first."""
        self.core.round_measurements()
        new = [r for r in self.core.round_reports if r.seq > self._fed]
        self._fed = max((r.seq for r in new), default=self._fed)
        return [(r.model, r) for r in new]

    def check_integrity(self) -> None:
        self.core.check_integrity()
        self.model.check_integrity()
