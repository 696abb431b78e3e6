"""Cold-pool scheduler core (sans-IO): rounds, slots, SP admission, budgets, telemetry."""

from .budget import SlotPlan, decode_iterations, decode_share_ok, plan_slot, within_round_bound
from .knobs import ABLATIONS, SchedKnobs, ablation
from .messages import Action, Completion, Decode, Idle, Prefill, PrefillItem, SubmittedCall, Switch
from .scheduler import ColdScheduler
from .slot import SlotPhase
from .telemetry import ModelQueue, RiskCounters, RoundSummary, SchedTelemetry, SessionKVView

__all__ = [
    "ABLATIONS",
    "Action",
    "ColdScheduler",
    "Completion",
    "Decode",
    "Idle",
    "ModelQueue",
    "Prefill",
    "PrefillItem",
    "RiskCounters",
    "RoundSummary",
    "SchedKnobs",
    "SchedTelemetry",
    "SessionKVView",
    "SlotPhase",
    "SlotPlan",
    "SubmittedCall",
    "Switch",
    "ablation",
    "decode_iterations",
    "decode_share_ok",
    "plan_slot",
    "within_round_bound",
]
