"""Box-level placement policies: who picks the box for a call in a pool (`epp.boxpicker`, the
shipped picker, and the simulator's pool, which runs that picker).

`talaria` is the same `Router` a box runs, with boxes as its targets (`router.boxes`). The peers
are built as their authors built them (docs/internals.md, the peers; GIE's default endpoint
picker profile): round-robin, least-load, llm-d's default scorer mix
and llm-d's session-affinity scorer on top of it. An llm-d EPP whose endpoints are whole boxes
scores pool-average metrics (mean queue and KV use over a box's servers): `BoxStats`, which a
box's one-target projection does not carry.

Every policy answers with the router's own `Decision`, so the picker explains, counts and
settles a peer's pick as it does its own.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from talariad.router.messages import CallRequest, Decision, DecisionKind, InstanceSnapshot
from talariad.router.policies.peers import BLOCK, LLMD_LRU_BLOCKS, llmd_scores
from talariad.router.policies.prefix_index import RoutedPrefixIndex
from talariad.router.registry import Registry
from talariad.router.router import Router
from talariad.types import KVState

RETRY_S = 0.1  # a peer with no healthy box answers "retry after" about one poll


@dataclass(frozen=True, slots=True)
class BoxStats:
    """What the picker last polled from one box: pool-average queue and KV use over its servers."""

    name: str
    healthy: bool
    queue: float  # mean waiting calls per instance
    kv_util: float  # mean KV occupancy per instance, in [0, 1]
    instances: int


def box_stats(box: str, snaps: Sequence[InstanceSnapshot]) -> BoxStats:
    live = [s for s in snaps if s.healthy]
    n = max(len(live), 1)
    queued = sum(r.queued_calls for s in live for r in s.models.values())
    kv = sum(min(max(s.kv_occupancy, 0.0), 1.0) for s in live)
    return BoxStats(box, bool(live), queued / n, kv / n, len(live))


class BoxPolicy:
    """Places a call on a box. The picker's `Router` holds the boxes as targets (health,
    freshness, the in-flight overlay); a policy reads what it needs of them and of `BoxStats`."""

    name: ClassVar[str] = ""

    def __init__(self, router: Router, rng: random.Random) -> None:
        self.router, self.rng = router, rng

    def observe(self, stats: BoxStats, now: float) -> None:
        """One poll of a box."""

    def place(self, call: CallRequest, now: float) -> Decision:
        return self.router.place(call, now)

    def completed(self, call_id: str, box: str, kv_state: KVState, kv_len: int, now: float) -> None:
        """The call's response ended well on `box`: the router installs the session's lease."""
        self.router.completed(call_id, box, kv_state, kv_len, now)

    def failed(self, call_id: str, now: float) -> None:
        self.router.failed(call_id, now)


BOX_POLICIES: Registry[BoxPolicy] = Registry("box policy")


@BOX_POLICIES.register("talaria")
class TalariaBoxPolicy(BoxPolicy):
    """The router itself (policy "talaria"): leases, KV locality, model residency, Eq. (1)/(2)."""


class PeerBoxPolicy(BoxPolicy):
    """A peer: chooses among the healthy boxes from `BoxStats` and its own count of calls it
    sent and has not seen end; the router only keeps the boxes' health and freshness."""

    def __init__(self, router: Router, rng: random.Random) -> None:
        super().__init__(router, rng)
        self.boxes: dict[str, BoxStats] = {}
        self.load: Counter[str] = Counter()  # calls sent to a box and not yet completed
        self._sent: dict[str, str] = {}  # call id -> box

    def observe(self, stats: BoxStats, now: float) -> None:
        self.boxes[stats.name] = stats

    def place(self, call: CallRequest, now: float) -> Decision:
        placeable = {s.instance for s in self.router.instances(now) if s.healthy and s.fresh}
        live = [b for n, b in sorted(self.boxes.items()) if b.healthy and n in placeable]
        box = self.choose(call, live, now) if live else None
        if box is None:
            why = "no healthy box"
            return Decision(
                call.call_id, DecisionKind.OVERLOAD_REJECT, None, self.name, now, why, RETRY_S
            )
        self.load[box] += 1
        self._sent[call.call_id] = box
        decision = Decision(
            call.call_id,
            DecisionKind.COST,
            box,
            self.name,
            now,
            self.name,
            None,
            (),
            call.session_id,
        )
        self.router.record(decision)  # `/calls/ID` and `call explain` read a peer's pick too
        return decision

    def choose(self, call: CallRequest, live: list[BoxStats], now: float) -> str | None:
        """The box for `call` among the healthy ones (by name)."""
        raise NotImplementedError

    def completed(self, call_id, box, kv_state, kv_len, now) -> None:
        self._release(call_id)

    def failed(self, call_id: str, now: float) -> None:
        self._release(call_id)

    def _release(self, call_id: str) -> None:
        box = self._sent.pop(call_id, None)
        if box is not None:
            self.load[box] -= 1


@BOX_POLICIES.register("round-robin")
class RoundRobinBoxPolicy(PeerBoxPolicy):
    """One counter over the healthy boxes (SGLang / vLLM `round_robin`)."""

    def __init__(self, router, rng) -> None:
        super().__init__(router, rng)
        self._counter = 0

    def choose(self, call, live, now) -> str | None:
        box = live[self._counter % len(live)].name
        self._counter += 1
        return box


@BOX_POLICIES.register("least-load")
class LeastLoadBoxPolicy(PeerBoxPolicy):
    """Fewest calls the picker sent to a box and has not seen complete (L_w, counted at
    dispatch and completion, so it is never stale), ties to the first box (`min_by_key`)."""

    def choose(self, call, live, now) -> str | None:
        return min(live, key=lambda b: self.load[b.name]).name


@BOX_POLICIES.register("llm-d")
class LlmDBoxPolicy(PeerBoxPolicy):
    """GIE's default profile (`pkg/epp/config/loader/defaults.go` in GIE):
    prefix-cache ×3, queue ×2, kv-cache-utilization ×2, max-score picker (shuffled ties).
    Prefix matches come from a router-side index of what it sent where (the approximate
    producer: per box an LRU of 31,250 blocks per server, at most 256 blocks matched)."""

    # NOTE: the docs also give a prefix formula with a near-match term, `w·min(1, m/scale)²`,
    # but neither w nor scale; w = 0 leaves the plain matched/total score that the peers' notes
    # reads in the scorer's README, the one `llmd_scores` computes

    def __init__(self, router, rng) -> None:
        super().__init__(router, rng)
        self.index = RoutedPrefixIndex(LLMD_LRU_BLOCKS * BLOCK)

    def choose(self, call, live, now) -> str | None:
        scores = self.scores(call, live, now)
        order = list(live)
        self.rng.shuffle(order)  # max-score picker: shuffle first, so ties break at random
        box = max(order, key=lambda b: scores[b.name]).name
        self.placed(call, box, now)
        return box

    def scores(self, call: CallRequest, live: list[BoxStats], now: float) -> dict[str, float]:
        held = self.index.matches(call.model, call.session_id, call.prefix_tokens)
        return llmd_scores(
            call.prompt_tokens,
            {name: m[0] for name, m in held.items()},
            {b.name: b.queue for b in live},
            {b.name: b.kv_util for b in live},
        )

    def placed(self, call: CallRequest, box: str, now: float) -> None:
        """The producer's asynchronous update: after scheduling, with the chosen box."""
        self.index.insert(call.model, call.session_id, box, call.prompt_tokens)
        self.index.evict()

    def observe(self, stats, now) -> None:
        super().observe(stats, now)
        # the index budget is per server; a box's servers pool theirs
        self.index.capacity = LLMD_LRU_BLOCKS * BLOCK * max(stats.instances, 1)


@BOX_POLICIES.register("llm-d-session")
class LlmDSessionBoxPolicy(LlmDBoxPolicy):
    """llm-d's default mix plus its session-affinity scorer in `session_id` mode: the session's
    bound box scores 1.0, every other 0; an unbound session scores 0 everywhere; each placement
    (re)binds the session to where the call went; bindings idle past the TTL (300 s) go at the
    next sweep (every 10 s)."""

    # NOTE: no llm-d doc gives this scorer's weight in a mix; 3 is the weight GIE's default
    # gives its other affinity scorer (prefix-cache)
    SESSION_WEIGHT = 3.0
    TTL_S = 300.0
    SWEEP_S = 10.0

    def __init__(self, router, rng) -> None:
        super().__init__(router, rng)
        self.bound: dict[str, tuple[str, float]] = {}  # session -> (box, last used)
        self._next_sweep = self.SWEEP_S

    def scores(self, call, live, now) -> dict[str, float]:
        self._sweep(now)
        out = super().scores(call, live, now)
        bound = self.bound.get(call.session_id) if call.session_id is not None else None
        if bound is not None and bound[0] in out:
            out[bound[0]] += self.SESSION_WEIGHT
        return out

    def placed(self, call, box, now) -> None:
        super().placed(call, box, now)
        if call.session_id is not None:
            self.bound[call.session_id] = (box, now)

    def _sweep(self, now: float) -> None:
        if now < self._next_sweep:
            return
        self.bound = {s: b for s, b in self.bound.items() if now - b[1] <= self.TTL_S}
        self._next_sweep = (math.floor(now / self.SWEEP_S) + 1) * self.SWEEP_S


POLICY_ORDER = ("talaria", "round-robin", "least-load", "llm-d", "llm-d-session")
"""The order the pool suite prints its rows in."""
