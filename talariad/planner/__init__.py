"""Demand-driven placement as a sans-IO core: which models a box pins hot and which it time-shares
cold, re-planned from windows of session demand (DESIGN §10, docs/planner.md).

The daemon (real time) and the simulator (virtual time) drive the same `Planner`.
"""

from talariad.planner.core import (
    Assignment,
    DemandMeter,
    DemandWindow,
    ModelDemand,
    Move,
    MoveCost,
    Planner,
    PlannerKnobs,
    Proposal,
    Role,
    Seat,
    assignments,
    expected_delay,
    moved_models,
)

__all__ = [
    "Assignment",
    "DemandMeter",
    "DemandWindow",
    "ModelDemand",
    "Move",
    "MoveCost",
    "Planner",
    "PlannerKnobs",
    "Proposal",
    "Role",
    "Seat",
    "assignments",
    "expected_delay",
    "moved_models",
]
