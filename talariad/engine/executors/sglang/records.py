"""Switch records of an SGLang instance: the phases timed from outside, on the five-phase schema.

The five phases of talariad.memory.switch (App. D) as far as stock SGLang lets us time them:
1 save/teardown = pause + drain + release of the outgoing server; 2 open target weights = resume
(or a fresh start of a crashed server) from the CPU weight backup; 3 KV shell and 4 graph state
happen inside SGLang's resume and cannot be timed apart (None); 5 publish = continue. The memory
check has no phase of its own there and is named separately.
"""

from __future__ import annotations

from talariad.engine.executors.sglang.swap import Step
from talariad.types import SwitchPath

FIVE_PHASES = (
    (Step.PAUSE, Step.DRAIN, Step.RELEASE),
    (Step.RESUME, Step.START),
    (),
    (),
    (Step.CONTINUE,),
)


class SwitchTimer:
    def __init__(self, from_model: str | None, to_model: str | None):
        self.from_model, self.to_model = from_model, to_model
        self.steps: dict[str, float | None] = {}

    def add(self, step: Step, seconds: float, measured: bool = True) -> None:
        """`measured` False: the step ran but had nothing to time (no NVML: no memory check)."""
        prev = self.steps.get(step.value) or 0.0
        self.steps[step.value] = prev + seconds if measured else None

    def record(self, error: str | None) -> dict:
        phases = []
        for group in FIVE_PHASES:
            times = [self.steps[s.value] for s in group if self.steps.get(s.value) is not None]
            phases.append(sum(times) if times else None)
        total = sum(v for v in self.steps.values() if v is not None)
        return {
            "from_model": self.from_model,
            "to_model": self.to_model,
            "path": SwitchPath.H2D.value,
            "ok": error is None,
            "error": error,
            "steps_s": dict(self.steps),
            "phase_s": phases,
            "total_s": total,
        }
