"""The instance core (sans-IO): one record per call, the cold-pool scheduler, the executor contract,
KV state, round measurements and the telemetry snapshot. Two shells drive it: the instance process
(`talariad.engine.worker.Worker`, asyncio, real time) and the simulator
(`talariad.sim.instance.SimInstance`, virtual time)."""

from .calls import CallOrder, InstanceCall, Refusal
from .contract import CallOutput, Executor, KVLocation, MemoryStats, StepPlan, StepResult
from .core import Done, InstanceCore
from .telemetry import InstanceTelemetry

__all__ = [
    "CallOrder",
    "CallOutput",
    "Done",
    "Executor",
    "InstanceCall",
    "InstanceCore",
    "InstanceTelemetry",
    "KVLocation",
    "MemoryStats",
    "Refusal",
    "StepPlan",
    "StepResult",
]
