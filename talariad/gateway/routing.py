"""The gateway's shell around the sans-IO router: telemetry in, decisions out, overload waits.

Instance telemetry becomes versioned `InstanceSnapshot`s stamped with the gateway's clock; the
router's decisions come back with their explanation; a call the router holds under the `queue`
overload policy waits here (bounded by the router's queue timeout) and is retried whenever a
call completes or new telemetry arrives.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Callable

from talariad.config import TalariaConfig
from talariad.instance.telemetry import router_snapshot as snapshot
from talariad.knobs import config_router_knobs as router_knobs
from talariad.router import CallRequest, Decision, DecisionKind, KVLocation, Router
from talariad.types import KVState, LatencyProfile
from talariad.wire.messages import Telemetry

__all__ = ["ModelUnavailable", "PrefixTracker", "RouterShell", "router_knobs", "snapshot"]


class ModelUnavailable(Exception):
    """No instance can take the model's calls now (drained, cordoned, unloaded, dead, unready):
    the call is refused at once instead of waiting out the queue timeout."""


class PrefixTracker:
    """How much of a new prompt the session's previous call covered, from digests of its text.

    Agents resend the whole conversation, so the previous prompt plus answer is usually a prefix
    of the next prompt; we keep two digests per session rather than the text itself. A prompt can
    run to megabytes: each check hashes it once, in pieces (`_Digests`), with no copy of the text.
    """

    def __init__(self, max_entries: int = 100_000) -> None:
        self._last: OrderedDict[tuple[str, str], tuple[int, bytes, int, bytes]] = OrderedDict()
        self.max_entries = max_entries  # least recently remembered first out

    @staticmethod
    def _digest(text: str) -> bytes:
        return hashlib.blake2b(text.encode(), digest_size=16).digest()

    def covered_chars(self, session: str, model: str, text: str) -> int:
        entry = self._last.get((session, model))
        if entry is None:
            return 0
        prompt_len, prompt_digest, full_len, full_digest = entry  # prompt_len <= full_len
        digests = _Digests(text)
        prompt_seen = prompt_len <= len(text) and digests.upto(prompt_len) == prompt_digest
        if full_len <= len(text) and digests.upto(full_len) == full_digest:
            return full_len
        return prompt_len if prompt_seen else 0

    def remember(self, session: str, model: str, prompt: str, answer: str) -> None:
        hasher = hashlib.blake2b(prompt.encode(), digest_size=16)
        prompt_digest = hasher.digest()  # the state goes on: prompt + answer is hashed once
        hasher.update(answer.encode())
        self._last[(session, model)] = (
            len(prompt),
            prompt_digest,
            len(prompt) + len(answer),
            hasher.digest(),
        )
        self._last.move_to_end((session, model))
        if len(self._last) > self.max_entries:
            self._last.popitem(last=False)

    def forget(self, session: str, model: str | None = None) -> None:
        """Drop what is known of the session's text for `model` (None: for every model)."""
        if model is not None:
            self._last.pop((session, model), None)
            return
        for key in [k for k in self._last if k[0] == session]:
            del self._last[key]


class _Digests:
    """`PrefixTracker._digest` of prefixes of one text, in increasing length, hashing each character
    once: the hash of a prefix is carried on to the next (the UTF-8 of a text is the UTF-8 of its
    pieces, one after the other). An ASCII text's pieces are views of its encoding, not copies."""

    __slots__ = ("text", "view", "hasher", "at")

    def __init__(self, text: str) -> None:
        self.text = text
        self.view = memoryview(text.encode("ascii")) if text.isascii() else None
        self.hasher = hashlib.blake2b(digest_size=16)
        self.at = 0

    def upto(self, length: int) -> bytes:
        """The digest of the text's first `length` characters (at least the previous `length`)."""
        if length < self.at:
            return PrefixTracker._digest(self.text[:length])
        if self.view is not None:
            self.hasher.update(self.view[self.at : length])
        else:
            self.hasher.update(self.text[self.at : length].encode())
        self.at = length
        return self.hasher.digest()  # the state goes on to a longer prefix


class PrefixBranches:
    """A bounded, least-recently-used set of prefix branches per (session, model).

    A side call under a session id with another prompt (a title, a sub-agent) gets a branch of its
    own: one per distinct head of the prompt (its first `HEAD_CHARS` characters), named `session`
    for the first and `session~<head hash>` after; the router and the instance see the branch name
    as the session. A call joins the branch whose remembered context covers the longest prefix of
    its prompt, else the branch with its head. Design: docs/internals.md."""

    HEAD_CHARS = 1024

    def __init__(
        self, tracker: PrefixTracker, max_branches: int, max_sessions: int = 100_000
    ) -> None:
        self.tracker, self.max_branches = tracker, max_branches
        self.max_sessions = max_sessions  # (session, model) pairs; the least recently used go first
        self._branches: OrderedDict[tuple[str, str], OrderedDict[str, bytes]] = OrderedDict()

    def branch(self, session: str, model: str, text: str) -> str:
        """The branch `text` belongs to (created, evicting the least recently used, if new)."""
        return self.branch_covered(session, model, text)[0]

    def branch_covered(self, session: str, model: str, text: str) -> tuple[str, int]:
        """`branch`, and how much of `text` the branch covers (`PrefixTracker.covered_chars`)."""
        branches = self._branches.setdefault((session, model), OrderedDict())
        self._branches.move_to_end((session, model))
        while len(self._branches) > self.max_sessions:
            (_, old_model), old = self._branches.popitem(last=False)
            for name in old:
                self.tracker.forget(name, old_model)
        covered = {name: self.tracker.covered_chars(name, model, text) for name in branches}
        best = max(covered, key=covered.__getitem__, default=None)
        head = PrefixTracker._digest(text[: self.HEAD_CHARS])
        if best is None or covered[best] == 0:
            best = next((name for name, h in branches.items() if h == head), None)
        if best is None:
            best = session if session not in branches else f"{session}~{head.hex()[:12]}"
            branches[best] = head
            while len(branches) > self.max_branches:
                self.tracker.forget(branches.popitem(last=False)[0], model)
            # a call that ran while its branch was evicted may have left text under the name
            covered[best] = self.tracker.covered_chars(best, model, text)
        branches.move_to_end(best)
        return best, covered[best]

    def names(self, session: str, model: str) -> list[str]:
        """The session's branches, least recently used first."""
        return list(self._branches.get((session, model), ()))

    def forget(self, session: str) -> list[str]:
        """Drop every branch of `session` (all models) and their text; the names it had, the
        session's own name always among them."""
        names = {session}
        for key in [k for k in self._branches if k[0] == session]:
            names.update(self._branches.pop(key))
        for name in names:
            self.tracker.forget(name)
        return sorted(names)


class RouterShell:
    """The router in real time: `router` places, `branches` (and its `prefixes`) name the
    session branch of a call and how much of its prompt the branch's previous call covered."""

    def __init__(self, router: Router, branches: PrefixBranches | None = None) -> None:
        if branches is None:  # the config's defaults
            branches = PrefixBranches(PrefixTracker(), max_branches=4)
        self.router, self.branches, self.prefixes = router, branches, branches.tracker
        self._changed = asyncio.Event()
        self._expired_at = float("-inf")
        self._sessions: dict[str, dict[tuple[str, str], KVLocation]] = {}  # per instance, merged
        self._fed: dict[str, int] = {}

    @classmethod
    def from_config(cls, cfg: TalariaConfig, profiles: dict[str, LatencyProfile]) -> RouterShell:
        """The shell an operator's config describes (`profiles`: per model, from the config)."""
        router = Router(router_knobs(cfg), profiles, policy=cfg.policy.router)
        prefixes = PrefixTracker(cfg.policy.max_sessions)
        max_sessions = cfg.policy.max_sessions
        return cls(router, PrefixBranches(prefixes, cfg.sessions.max_branches, max_sessions))

    closing = False
    """Set when shutdown's grace ran out: calls still held in the overload queue are rejected."""

    unavailable: Callable[[str], str | None] = staticmethod(lambda model: None)
    """Why no instance can take `model`'s calls now (None: some can); the daemon sets it."""

    def close(self) -> None:
        self.closing = True
        self._changed.set()

    def observe(self, t: Telemetry, now: float) -> None:
        """Install one telemetry reply; replies of an instance must come in order (deltas)."""
        view = self._merge(t)
        # the instance's own model list: it follows run-time loads, unloads, pins and pool moves
        if self.router.observe(snapshot(t, t.models, now, True, dict(view)), now):
            self._changed.set()
        self._feed_rounds(t, now)
        self._expire(now)

    def _merge(self, t: Telemetry) -> dict[tuple[str, str], KVLocation]:
        view = self._sessions.setdefault(t.instance, {})
        if t.sessions_base is None:
            view.clear()
        for key in t.sessions_removed:
            view.pop(tuple(key), None)
        for s in t.sessions:
            view[(s.session_id, s.model)] = s  # the telemetry's own record
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

    def _expire(self, now: float) -> None:
        """Drop expired leases and idle sessions about once a second (held calls time out in
        their own waiters, see `place`)."""
        if now - self._expired_at >= 1.0:
            self._expired_at = now
            self.router.expire(now)

    def instance_down(self, instance: str, now: float) -> None:
        """The supervisor lost the process: forget it; its restart reports in as a new instance."""
        self._sessions.pop(instance, None)
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
        self.router.completed(call_id, instance, KVState(kv_state), kv_len, now)
        self._changed.set()

    def failed(self, call_id: str, now: float) -> None:
        self.router.failed(call_id, now)
        self._changed.set()
