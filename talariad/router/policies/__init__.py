"""Placement policies behind one registry: Talaria's Algorithm 1 and the peers' baselines."""

from talariad.router.policies import peers, residency, simple, talaria  # noqa: F401  (register)
from talariad.router.policies.base import POLICIES, Choice, ClusterView, Policy

__all__ = ["POLICIES", "Choice", "ClusterView", "Policy"]
