"""Round bookkeeping: which models had a slot this round, the Eq. (3) prediction, the measured
wall = active + switch decomposition, and the switch-cost estimates refined from measurements."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from talariad.types import LatencyProfile, SwitchPath

from .telemetry import RiskCounters, RoundSummary

_EWMA = 0.5  # weight of the newest measured switch; switch cost moves with staging coverage (§3.4)


def rotation(models: list[str], active: str | None) -> list[str]:
    """Every model in rotation order, starting after `active` (which comes last)."""
    start = models.index(active) + 1 if active in models else 0
    return models[start:] + models[:start]


def staging_target(
    models: list[str], active: str | None, has_work: Callable[[str], bool]
) -> str | None:
    """The model the rotation will switch to next, so the one worth staging now: the first after
    `active` with work; with none, simply the next one (None: nothing else to stage)."""
    others = [m for m in rotation(models, active) if m != active]
    return next((m for m in others if has_work(m)), others[0] if others else None)


class RoundLog:
    def __init__(self, round_bound_s: float, risk: RiskCounters) -> None:
        self.bound_s = round_bound_s
        self.risk = risk
        self.closed: deque[RoundSummary] = deque()
        """The latest closed rounds, oldest first (all of them unless `keep` bounds them)."""
        self.count = 0
        """Rounds closed so far (the next round's index)."""
        self.current: RoundSummary | None = None

    def keep(self, rounds: int | None) -> None:
        """Keep only the latest `rounds` closed rounds (a long-running instance); None: all."""
        self.closed = deque(self.closed, maxlen=rounds)

    def round_for(self, model: str, now: float) -> RoundSummary:
        """The round of a slot of `model` opening now: a model already served starts a new round."""
        if self.current is None or model in self.current.models:
            self.close(now)
            self.current = RoundSummary(index=self.count, started_at=now)
        return self.current

    def close(self, now: float) -> None:
        if self.current is None:
            return
        self.current.ended_at = now
        if self.current.wall_s > self.bound_s + 1e-9:
            self.risk.round_overrun += 1
        self.closed.append(self.current)
        self.count += 1
        self.current = None

    def next_index(self) -> int:
        return self.current.index if self.current else self.count


class SwitchCosts:
    """Predicted switch time per (target model, path): the profile, then an EWMA of measurements
    kept apart per path, so a fallback's cost never hides behind the D2D estimate."""

    def __init__(self, profiles: dict[str, LatencyProfile]) -> None:
        self.profiles = profiles
        self.measured: dict[tuple[str, SwitchPath], float] = {}
        self.last_path: dict[str, SwitchPath] = {}

    def predict(self, to_model: str, path: SwitchPath, first_open: bool = False) -> float:
        if first_open:
            return self.profiles[to_model].open_s
        if (to_model, path) in self.measured:
            return self.measured[(to_model, path)]
        return self.profiles[to_model].switch_cost_s(path)

    def record(self, to_model: str, path: SwitchPath, measured_s: float) -> None:
        self.last_path[to_model] = path
        old = self.measured.get((to_model, path))
        self.measured[(to_model, path)] = (
            measured_s if old is None else old + _EWMA * (measured_s - old)
        )

    def view(self) -> dict[str, float]:
        return {f"{m}:{p.value}": s for (m, p), s in sorted(self.measured.items())}
