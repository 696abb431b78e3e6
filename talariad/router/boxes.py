"""Boxes as placement targets: one box's instance snapshots projected onto one `InstanceSnapshot`,
so the pool's endpoint picker runs the same `Router` over boxes that a box runs over instances.

What lifts, model by model: the residency, queue, batch, switch and open costs and the slot wait
of the instance the box would most likely use for the model (its best state, then its shortest
queue); a session's best prefix on any of the box's instances. What does not lift exactly:
Eq. (5)'s round admission and the HBM check are per instance, so the box offers its least loaded
round and its largest free HBM (the box's own router then applies both exactly), and contention
counts the other models' calls of the whole box. Design: docs/pool.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from talariad.router.messages import InstanceSnapshot, ModelResidency, ModelState
from talariad.types import KVLocation, KVState, Pool

_STATE_RANK = {ModelState.ACTIVE: 0, ModelState.RESIDENT: 1, ModelState.ABSENT: 2}
_KV_RANK = {KVState.DEVICE: 0, KVState.HOST: 1, KVState.MISSING: 2}


def box_snapshot(
    box: str,
    version: int,
    taken_at: float,
    instances: Sequence[InstanceSnapshot],
    sessions: BoxSessions | None = None,
) -> InstanceSnapshot:
    """The box `box` as one placement target, from its instances' snapshots (unhealthy ones
    count for nothing; a box with no healthy instance is unhealthy). `sessions`: the box's
    sessions kept across snapshots, brought up to date with O(changes) work when it can be."""
    live = [s for s in instances if s.healthy]
    if sessions is None:
        best, changed = _sessions(live), None
    else:
        sessions.update(live)
        best, changed = sessions.best, sessions.changed
    allowed = frozenset().union(*(s.allowed_models for s in live))
    known_hbm = [s.hbm_free_bytes for s in live if s.hbm_free_bytes is not None]
    rates = [s.restore_s_per_token for s in live if s.restore_s_per_token is not None]
    cold = [s.round_remaining_s for s in live if s.pool is Pool.COLD]
    return InstanceSnapshot(
        instance=box,
        version=version,
        taken_at=taken_at,
        pool=Pool.COLD if cold else Pool.HOT,
        healthy=bool(live),
        allowed_models=allowed,
        models={m: _residency(m, live) for m in sorted(allowed)},
        sessions=best,
        round_remaining_s=min(cold, default=0.0),
        round_load_s=min((s.round_load_s for s in live), default=0.0),
        deadline_risk=min((s.deadline_risk for s in live), default=0.0),
        kv_occupancy=min((s.kv_occupancy for s in live), default=0.0),
        hbm_free_bytes=max(known_hbm) if known_hbm else None,
        staging_slack_bytes=max((s.staging_slack_bytes for s in live), default=0),
        restore_s_per_token=min(rates) if rates else None,
        sessions_changed=changed,
    )


def _residency(model: str, live: list[InstanceSnapshot]) -> ModelResidency:
    """The model's residency on the instance the box would most likely give it."""
    serving = [s for s in live if model in s.allowed_models]
    best = min(serving, key=lambda s: _preference(s, model))
    return dataclasses.replace(best.residency(model), slot_wait_s=best.slot_wait_s())


def _preference(snap: InstanceSnapshot, model: str) -> tuple:
    res = snap.residency(model)
    return (_STATE_RANK[res.state], res.queued_tokens, snap.round_load_s, snap.instance)


def _sessions(live: list[InstanceSnapshot]) -> dict[tuple[str, str], KVLocation]:
    """Each (session, model) prefix at its best place on the box: on a device before on the
    host, then the longest (the first instance of equals)."""
    best: dict[tuple[str, str], KVLocation] = {}
    for snap in live:
        for key, loc in snap.sessions.items():
            have = best.get(key)
            if have is None or prefix_rank(loc) < prefix_rank(have):
                best[key] = loc
    return best


def prefix_rank(loc: KVLocation) -> tuple[int, int]:
    """Lower ranks first: on a device before on the host, then the longest."""
    return _KV_RANK[loc.state], -loc.kv_len


class BoxSessions:
    """A box's sessions (`_sessions`) kept across its snapshots: `keys`, the pairs its
    instances' session views changed since the last update (None: unknown), lets `update`
    recompute only those while the same instances are live and their views are the same
    mappings; the snapshot then names them (`sessions_changed`)."""

    def __init__(self) -> None:
        self.best: dict[tuple[str, str], KVLocation] = {}
        self.keys: set[tuple[str, str]] | None = None
        self.changed: frozenset[tuple[str, str]] | None = None
        self._live: list[tuple[str, int]] = []  # (instance, id of its session view)

    def update(self, live: list[InstanceSnapshot]) -> None:
        views = [(s.instance, id(s.sessions)) for s in live]
        if self.keys is None or views != self._live:
            self.best, self.changed = _sessions(live), None  # a new mapping: the router diffs
        else:
            for key in self.keys:
                locs = [loc for s in live if (loc := s.sessions.get(key)) is not None]
                if locs:
                    self.best[key] = min(
                        locs, key=prefix_rank
                    )  # the first of equals, as `_sessions`
                else:
                    self.best.pop(key, None)
            self.changed = frozenset(self.keys)
        self._live, self.keys = views, set()
