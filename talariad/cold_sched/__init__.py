"""Cold-pool scheduler core (sans-IO): rounds, slots, SP admission, budgets, telemetry."""

from .budget import SlotPlan, decode_iterations, plan_slot
from .knobs import ABLATIONS, SchedKnobs, ablation
from .messages import (
    Action,
    Completion,
    Decode,
    Idle,
    Prefill,
    PrefillItem,
    SchedCall,
    SubmittedCall,
    Switch,
)
from .scheduler import ColdScheduler
from .slot import SlotPhase
from .telemetry import KVLocation, ModelQueue, RiskCounters, RoundSummary, SchedTelemetry

__all__ = [
    "ABLATIONS",
    "Action",
    "ColdScheduler",
    "Completion",
    "Decode",
    "Idle",
    "KVLocation",
    "ModelQueue",
    "Prefill",
    "PrefillItem",
    "RiskCounters",
    "RoundSummary",
    "SchedCall",
    "SchedKnobs",
    "SchedTelemetry",
    "SlotPhase",
    "SlotPlan",
    "SubmittedCall",
    "Switch",
    "ablation",
    "decode_iterations",
    "plan_slot",
]
