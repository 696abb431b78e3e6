"""The instance core (sans-IO): one record per call, the cold-pool scheduler, the executor contract,
KV state, round measurements and the telemetry snapshot. Two shells drive it: the instance process
(`talariad.engine.worker.Worker`, asyncio, real time) and the simulator
(`talariad.sim.instance.SimInstance`, virtual time)."""

from .calls import InstanceCall, Refusal
from .contract import CallOutput, Executor, KVLocation, MemoryStats, StepPlan, StepResult
from .core import Done, InstanceCore

__all__ = [
    "CallOutput",
    "Done",
    "Executor",
    "InstanceCall",
    "InstanceCore",
    "KVLocation",
    "MemoryStats",
    "Refusal",
    "StepPlan",
    "StepResult",
]
