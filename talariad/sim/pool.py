"""The pool suite: N boxes, each a copy of the router suite's testbed, behind the shipped picker.

Two levels in virtual time: the pool's picker (`epp.boxpicker.BoxPicker`, the one `talariad epp`
runs, with a box-level policy from `router.box_policies`) chooses a box per call from the box
snapshots it last polled (every `POLL_S`: each box's `BoxSnapshot`, the wire message a daemon
serves, computed by the daemon's own `gateway.pool.box_target`, with its telemetry's age), and
learns a call's end as Envoy would tell it (the response ended well: a lease on that box, its KV
taken as on a device); then that box's own Talaria `Router` places the call on the box's
instances exactly as the single-box simulation does. A call the picker refuses (429, 503) comes
back after its `Retry-After`, as a client would; one refused by its box's router waits at that
box, as a daemon holds it. Sessions per box and the per-box arrival rate stay constant as the
pool grows; every policy replays the same trace at a pool size.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import replace

from talariad.epp.boxpicker import BoxPicker
from talariad.epp.config import LEASE_SLACK_S, PICKER_KNOBS, picker_knobs
from talariad.epp.contract import ImmediateAnswer
from talariad.gateway.pool import box_target
from talariad.instance.core import Done
from talariad.perfmodel.profiles import ProfileSet
from talariad.replay.generate import characterization
from talariad.replay.metrics import RunResult, nearest_rank
from talariad.replay.trace import Trace, TraceCall
from talariad.router import CallRequest, Lease, Router, RouterKnobs
from talariad.sim.configs import LOADS, InstanceSpec, SimConfig, router_configs
from talariad.sim.simulator import RETRY, Pending, SimInstance, Simulator, request
from talariad.wire.box import BoxModel, BoxSnapshot

POLL_S = 0.1  # the picker's `poll_interval_s` default
CALL_PATH = "/v1/chat/completions"  # what a refusal's wording is for
SESSIONS_PER_BOX = 30  # the router testbed's 30 model-sessions (§5.3), on every box
ROW_FIELDS = (
    "boxes",
    "policy",
    "sct_p50_s",
    "sct_p95_s",
    "ttft_p95_s",
    "box_moves",
    "recomputed_tokens",
)


def box_names(n: int) -> list[str]:
    width = len(str(max(n - 1, 0)))
    return [f"box{k:0{width}d}" for k in range(n)]


def pool_config(n: int, pset: ProfileSet, models: tuple[str, ...]) -> SimConfig:
    """N copies of the router suite's testbed at medium load per box: each box's instances
    renamed `box/instance`, sessions arriving N times as often."""
    one = next(c for c in router_configs(pset, models) if c.name == "talaria@medium")
    insts = tuple(
        InstanceSpec(f"{b}/{i.name}", i.models, i.pool) for b in box_names(n) for i in one.instances
    )
    return dataclasses.replace(
        one,
        name=f"pool{n}",
        instances=insts,
        start_interval_s=LOADS["medium"] / n,
        load=None,
    )


def pool_trace(n: int, per_box: int, seed: int, models: list[str]) -> Trace:
    """`n × per_box` §2.1-shaped sessions spread over the box's models; a larger pool's trace
    starts with a smaller one's sessions (the generator draws them in order)."""
    return characterization(n * per_box, seed, tuple(models))


class SimPicker:
    """The simulator's driver of the shipped `BoxPicker` (the running picker's is `epp.server`
    with `epp.poller`): box snapshots in at poll times, a call in at its arrival, its end as
    Envoy would tell it. `policy`: the box-level policy's registry name."""

    def __init__(self, knobs: RouterKnobs, policy: str) -> None:
        # the picker's knobs as `talariad epp` defaults them over the boxes' router knobs; it
        # starts knowing no profile: the boxes' snapshots carry theirs
        ours = picker_knobs(replace(knobs, **PICKER_KNOBS), LEASE_SLACK_S)
        self.picker = BoxPicker(Router(ours, {}), policy=policy)

    def polled(self, snapshots: dict[str, BoxSnapshot], now: float) -> None:
        """One poll: every box answered with its snapshot (a box's endpoint is its name)."""
        for box, snap in snapshots.items():
            self.picker.box_seen(box, box, snap, now)

    def place(self, call: CallRequest, now: float) -> str | float:
        """The box for `call`, arriving now, or the seconds a client waits before trying again
        (the refusal's `Retry-After`)."""
        picked = self.picker.place(replace(call, arrived_at=now), CALL_PATH, call.model, now)
        if isinstance(picked, ImmediateAnswer):
            return float(picked.headers.get("Retry-After", 1))
        return picked.endpoint

    def ended(self, call_id: str, box: str, now: float) -> None:
        """What Envoy tells the picker: the response came from `box`, and it ended well."""
        self.picker.served(call_id, box, 200, now)
        self.picker.finished(call_id, True, now)


class PoolSimulator(Simulator):
    """The simulator with one `Router` per box and the shipped `BoxPicker` above them."""

    def __init__(
        self,
        trace: Trace,
        config: SimConfig,
        pset: ProfileSet,
        picker: str,
        on_session_done: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(trace, config, pset, on_session_done)
        self.router = None  # type: ignore[assignment]  # one per box instead: `self.routers`
        members: dict[str, list[SimInstance]] = {}
        for inst in self.instances.values():
            members.setdefault(inst.name.split("/")[0], []).append(inst)
        self.members = members
        self.box_of = {i.name: b for b, insts in members.items() for i in insts}
        self.routers = {
            b: Router(config.router, self.profiles, policy=config.policy) for b in members
        }
        self.driver = SimPicker(config.router, picker)
        self.picker = self.driver.picker
        self.result.policy = picker
        self.recomputed = 0
        self._box_for: dict[str, str] = {}  # call id -> the box it was sent to
        self._polled_at = -math.inf  # every box is polled together: one time
        self._served_version = 0

    def _first_look(self) -> None:
        for box, insts in self.members.items():
            for inst in insts:
                self.routers[box].observe(inst.snapshot(0.0), 0.0)
        self._poll(0.0)

    def _place(self, p: Pending, now: float) -> None:
        req = request(p)
        box = self._box_for.get(p.call_id)
        if box is None:
            self._poll(now)
            picked = self.driver.place(req, now)  # a retried call is a new request
            if not isinstance(picked, str):
                self._push(now + picked, RETRY, p.call_id)
                return
            box = self._box_for[p.call_id] = picked
        self._refresh(self.routers[box], self.members[box], now)
        self._dispatch(p, req, self.routers[box].place(req, now), now)

    def _poll(self, now: float) -> None:
        """The picker's poll: each box's snapshot as its daemon serves it, at most every
        `POLL_S`."""
        if now - self._polled_at < POLL_S:
            return
        self._polled_at = now
        for box, insts in self.members.items():
            self._refresh(self.routers[box], insts, now)  # the box reads its instances on
        self.driver.polled({b: self.snapshot(b, now) for b in self.members}, now)

    def snapshot(self, box: str, now: float) -> BoxSnapshot:
        """`GET /pool/snapshot` of `box` (`gateway.pool.PoolEndpoint.snapshot`): the box as one
        placement target, computed from what its router installed as a daemon computes it
        (`gateway.pool.box_target`; every instance live, the sessions whole), and the box
        router's profiles."""
        self._served_version += 1
        insts = self.members[box]
        router = self.routers[box]
        profiles = router.profiles()
        models = sorted({m for i in insts for m in i.models})
        return BoxSnapshot.model_construct(
            version=self._served_version,
            sessions_epoch=None,
            target=box_target(router, now, {i.name for i in insts}),
            models=[BoxModel(name=m, profile=profiles[m]) for m in models if m in profiles],
        )

    def _settle(self, inst: SimInstance, p: Pending, done: Done, now: float) -> Lease | None:
        box = self.box_of[inst.name]
        call_id = done.completion.call_id
        self._box_for.pop(call_id, None)
        self.driver.ended(call_id, box, now)
        self.recomputed += recomputed_tokens(p.call, done.cached_tokens)
        return self.routers[box].completed(call_id, inst.name, done.kv_state, done.kv_len, now)


def recomputed_tokens(call: TraceCall, cached: int) -> int:
    """Prefix tokens the call had to prefill again: its reusable prefix less what was reused."""
    reusable = max(min(call.prefix_tokens, call.prompt_tokens - 1), 0)
    return max(reusable - cached, 0)


def box_moves(result: RunResult, box_of: dict[str, str]) -> int:
    """Calls of a session placed on another box than the session's previous call."""
    moves, last = 0, {}
    for c in sorted(result.calls, key=lambda c: (c.session_id, c.call_idx)):
        box = box_of[c.instance]
        if c.call_idx > 0 and last.get(c.session_id) not in (None, box):
            moves += 1
        last[c.session_id] = box
    return moves


def pool_row(n: int, sim: PoolSimulator) -> dict:
    """One `--json` row; a percentile over no observations is None (printed `-`)."""
    r = sim.result
    scts = [s.sct_s for s in r.sessions]
    return {
        "boxes": n,
        "policy": r.policy,
        "sct_p50_s": nearest_rank(scts, 50),
        "sct_p95_s": nearest_rank(scts, 95),
        "ttft_p95_s": nearest_rank([c.ttft_s for c in r.calls], 95),
        "box_moves": box_moves(r, sim.box_of),
        "recomputed_tokens": sim.recomputed,
    }


def run_pool(
    n: int,
    picker: str,
    trace: Trace,
    pset: ProfileSet,
    on_session_done: Callable[[], None] | None = None,
) -> dict:
    """One cell of the suite: `picker` over `n` boxes replaying `trace`."""
    cfg = pool_config(n, pset, tuple(pset.models))
    sim = PoolSimulator(trace, cfg, pset, picker, on_session_done)
    sim.run()
    return pool_row(n, sim)
