"""The gateway's shell around the sans-IO router: telemetry in, decisions out, overload waits.

Instance telemetry becomes versioned `InstanceSnapshot`s stamped with the gateway's clock; the
router's decisions come back with their explanation; a call the router holds under the `queue`
overload policy waits here (bounded by the router's queue timeout) and is retried whenever a
call completes or new telemetry arrives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from talariad.calls.branches import PrefixBranches
from talariad.calls.placement import Placement
from talariad.config import TalariaConfig
from talariad.knobs import config_router_knobs as router_knobs
from talariad.router import CallRequest, Decision, DecisionKind, KVLocation, Router
from talariad.router.snapshot import router_snapshot as snapshot
from talariad.types import KVState, LatencyProfile
from talariad.wire.messages import Telemetry

__all__ = [
    "ModelUnavailable",
    "RouterShell",
    "router_knobs",
    "snapshot",
]


class ModelUnavailable(Exception):
    """No instance can take the model's calls now (drained, cordoned, unloaded, dead, unready):
    the call is refused at once instead of waiting out the queue timeout."""


class RouterShell:
    """The router in real time, over the placement shell the pool's picker runs too
    (`calls.placement`): `router` places, `branches` name the session branch of a call and how
    much of its prompt the branch's context covers; a branch the index evicts is forgotten by
    the router at once and on the instances through `evicted` (the gateway's)."""

    def __init__(self, router: Router, branches: PrefixBranches | None = None) -> None:
        if branches is None:  # the config's defaults
            branches = PrefixBranches(max_branches=4)
        self.placement = Placement(router, branches)
        self.placement.evicted = lambda branch: self.evicted(branch)
        self.router, self.branches = router, branches
        self._changed = asyncio.Event()
        self._sessions: dict[str, dict[tuple[str, str], KVLocation]] = {}  # per instance, merged
        self._fed: dict[str, int] = {}

    @classmethod
    def from_config(cls, cfg: TalariaConfig, profiles: dict[str, LatencyProfile]) -> RouterShell:
        """The shell an operator's config describes (`profiles`: per model, from the config)."""
        router = Router(router_knobs(cfg), profiles, policy=cfg.policy.router)
        return cls(router, PrefixBranches(cfg.sessions.max_branches, cfg.policy.max_sessions))

    closing = False
    """Set when shutdown's grace ran out: calls still held in the overload queue are rejected."""

    unavailable: Callable[[str], str | None] = staticmethod(lambda model: None)
    """Why no instance can take `model`'s calls now (None: some can); the daemon sets it."""

    evicted: Callable[[str], None] = staticmethod(lambda branch: None)
    """Forget an evicted branch on the instances, without waiting (the gateway sets it)."""

    merged: Callable[[list[tuple[str, str]] | None], None] = staticmethod(lambda keys: None)
    """Which session pairs of an instance's view a reply changed (None: all of them, the view
    was replaced or dropped); the gateway's pool change log (`pool.SessionLog.record`)."""

    def close(self) -> None:
        self.closing = True
        self._changed.set()

    def observe(self, t: Telemetry, now: float) -> None:
        """Install one telemetry reply; replies of an instance must come in order (deltas)."""
        view = self._merge(t)
        # the instance's own model list: it follows run-time loads, unloads, pins and pool moves
        if self.placement.observe(snapshot(t, t.models, now, True, dict(view)), now):
            self._changed.set()
        self._feed_rounds(t, now)

    def _merge(self, t: Telemetry) -> dict[tuple[str, str], KVLocation]:
        view = self._sessions.setdefault(t.instance, {})
        self.merged(t.merge_into(view))
        return view

    def _feed_rounds(self, t: Telemetry, now: float) -> None:
        """New round measurements refine the router's per-model profile (EWMA), each once."""
        fed = self._fed.get(t.instance, 0)
        if t.rounds and t.rounds[-1].seq < fed:
            fed = 0  # the instance restarted: its sequence starts over
        for r in t.rounds:
            if r.seq > fed:
                self.router.round_summary(t.instance, r.model, r, now)
        self._fed[t.instance] = max([fed] + [r.seq for r in t.rounds])

    def unhealthy(self, instance: str, now: float) -> None:
        """A telemetry poll failed: the instance is alive but not answering; leases on it lapse."""
        self.router.heartbeat(instance, now, healthy=False)

    def instance_down(self, instance: str, now: float) -> None:
        """The supervisor lost the process: forget it; its restart reports in as a new instance."""
        self._sessions.pop(instance, None)
        self.merged(None)
        self._fed.pop(instance, None)
        if any(s.instance == instance for s in self.router.instances(now)):
            self.router.remove_instance(instance, now)

    async def place(self, call: CallRequest, clock) -> Decision:
        """Place now, or wait while the router holds the call under the queue overload policy;
        past `queue_timeout_s` of waiting here the call is rejected, whatever the router's queue
        bookkeeping says (its `expire` may have dropped the entry and a re-hold would restart it).
        Raises ModelUnavailable, held or not, once no instance can take the call's model."""
        deadline = clock() + self.router.knobs.queue_timeout_s
        try:
            while True:
                self._changed.clear()
                decision = self.router.place(call, clock())
                if not decision.kind.places and (why := self.unavailable(call.model)):
                    self.router.failed(call.call_id, clock())
                    raise ModelUnavailable(why)
                if decision.kind != DecisionKind.OVERLOAD_QUEUE:
                    return decision
                if self.closing:
                    self.router.failed(call.call_id, clock())
                    return decision._replace(
                        kind=DecisionKind.OVERLOAD_REJECT,
                        reason=f"{decision.reason}; talariad is shutting down",
                    )
                if clock() >= deadline:
                    self.router.failed(call.call_id, clock())
                    return decision._replace(
                        kind=DecisionKind.OVERLOAD_REJECT,
                        reason=f"{decision.reason}; queue timeout",
                    )
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout=0.25)
                except TimeoutError:
                    pass
        except asyncio.CancelledError:  # the client went away while held: free its queue place
            self.router.failed(call.call_id, clock())
            raise

    def completed(
        self, call_id: str, instance: str, kv_state: str, kv_len: int, now: float
    ) -> None:
        self.placement.completed(call_id, instance, KVState(kv_state), kv_len, now)
        self._changed.set()

    def failed(self, call_id: str, now: float) -> None:
        self.placement.failed(call_id, now)
        self._changed.set()
