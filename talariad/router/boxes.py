"""Boxes as placement targets: one box's instance snapshots projected onto one `InstanceSnapshot`,
so the pool's endpoint picker runs the same `Router` over boxes that a box runs over instances.
A box projects itself from what its router installed (`gateway.pool.box_target`) and publishes
the result; the picker installs it as it comes.

What lifts, model by model: the residency, queue, batch, switch and open costs and the slot wait
of the instance the box would most likely use for the model (its best state, then its shortest
queue); a session's best prefix on any of the box's instances. What does not lift exactly:
Eq. (5)'s round admission and the HBM check are per instance, so the box offers its least loaded
round and its largest free HBM (the box's own router then applies both exactly), and contention
counts the other models' calls of the whole box. Design: docs/pool.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from talariad.router.messages import InstanceSnapshot, ModelResidency, ModelState
from talariad.types import KVLocation, KVState, Pool

_STATE_RANK = {ModelState.ACTIVE: 0, ModelState.RESIDENT: 1, ModelState.ABSENT: 2}
_KV_RANK = {KVState.DEVICE: 0, KVState.HOST: 1, KVState.MISSING: 2}


def box_snapshot(
    box: str,
    version: int,
    taken_at: float,
    instances: Sequence[InstanceSnapshot],
    sessions: Mapping[tuple[str, str], KVLocation] | None = None,
) -> InstanceSnapshot:
    """The box `box` as one placement target, from its instances' snapshots (unhealthy ones
    count for nothing; a box with no healthy instance is unhealthy). `sessions`: the box's
    session view when the caller holds it (default: `best_prefixes` of the healthy ones)."""
    live = [s for s in instances if s.healthy]
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
        sessions=best_prefixes(live) if sessions is None else sessions,
        round_remaining_s=min(cold, default=0.0),
        round_load_s=min((s.round_load_s for s in live), default=0.0),
        deadline_risk=min((s.deadline_risk for s in live), default=0.0),
        kv_occupancy=min((s.kv_occupancy for s in live), default=0.0),
        hbm_free_bytes=max(known_hbm) if known_hbm else None,
        staging_slack_bytes=max((s.staging_slack_bytes for s in live), default=0),
        restore_s_per_token=min(rates) if rates else None,
    )


def _residency(model: str, live: list[InstanceSnapshot]) -> ModelResidency:
    """The model's residency on the instance the box would most likely give it."""
    serving = [s for s in live if model in s.allowed_models]
    best = min(serving, key=lambda s: _preference(s, model))
    return dataclasses.replace(best.residency(model), slot_wait_s=best.slot_wait_s())


def _preference(snap: InstanceSnapshot, model: str) -> tuple:
    res = snap.residency(model)
    return (_STATE_RANK[res.state], res.queued_tokens, snap.round_load_s, snap.instance)


def best_prefixes(
    live: Sequence[InstanceSnapshot], keys: Iterable[tuple[str, str]] | None = None
) -> dict[tuple[str, str], KVLocation]:
    """Each (session, model) prefix at its best place on the box (`prefix_rank`; the first
    instance of equals); `keys`: only those pairs (a pair no instance holds is left out)."""
    best: dict[tuple[str, str], KVLocation] = {}
    if keys is not None:
        for key in keys:
            held = [loc for s in live if (loc := s.sessions.get(key)) is not None]
            if held:
                best[key] = min(held, key=prefix_rank)
        return best
    for snap in live:
        for key, loc in snap.sessions.items():
            have = best.get(key)
            if have is None or prefix_rank(loc) < prefix_rank(have):
                best[key] = loc
    return best


def prefix_rank(loc: KVLocation) -> tuple[int, int]:
    """Lower ranks first: on a device before on the host, then the longest."""
    return _KV_RANK[loc.state], -loc.kv_len
