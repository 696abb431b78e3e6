"""Session-aware placement as a sans-IO core: sessions and leases, the Eq. (1) cost model,
feasibility and Eq. (2), overload handling, and the peers' policies as baselines.

The gateway (real time) and the simulator (virtual time) drive the same `Router`.
"""

from talariad.router.knobs import RouterKnobs
from talariad.router.messages import (
    CallRequest,
    CandidateCost,
    Decision,
    DecisionKind,
    ExpiryReport,
    InstanceSnapshot,
    InstanceStatus,
    KVLocation,
    Lease,
    ModelResidency,
    ModelState,
    SessionEntry,
)
from talariad.router.policies import POLICIES
from talariad.router.router import Router
from talariad.types import RoundMeasurement

__all__ = [
    "POLICIES",
    "CallRequest",
    "CandidateCost",
    "Decision",
    "DecisionKind",
    "ExpiryReport",
    "InstanceSnapshot",
    "InstanceStatus",
    "Lease",
    "ModelResidency",
    "ModelState",
    "RoundMeasurement",
    "Router",
    "RouterKnobs",
    "SessionEntry",
    "KVLocation",
]
