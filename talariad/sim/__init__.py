"""Virtual-time simulator over the same router and cold-pool scheduler cores the daemon runs,
with `sim` executor costs from the profiles in `talariad.sim.profiles`."""

from talariad.sim.configs import ABLATIONS, InstanceSpec, SimConfig, suite
from talariad.sim.costs import action_seconds
from talariad.sim.simulator import Simulator, simulate

__all__ = ["ABLATIONS", "InstanceSpec", "SimConfig", "Simulator", "action_seconds", "simulate", "suite"]
