"""The gateway's shell around the sans-IO router: telemetry in, decisions out, overload waits.

Instance telemetry becomes versioned `InstanceSnapshot`s stamped with the gateway's clock; the
router's decisions come back with their explanation; a call the router holds under the `queue`
overload policy waits here (bounded by the router's queue timeout) and is retried whenever a
call completes or new telemetry arrives.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from talariad.config import TalariaConfig
from talariad.instance.telemetry import router_snapshot as snapshot
from talariad.knobs import config_router_knobs as router_knobs
from talariad.router import CallRequest, Decision, DecisionKind, KVLocation, Router
from talariad.types import KVState, LatencyProfile
from talariad.wire.messages import Telemetry

__all__ = [
    "ModelUnavailable",
    "PrefixBranches",
    "PrefixTracker",
    "Prompt",
    "RouterShell",
    "router_knobs",
    "snapshot",
]


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


@dataclass(slots=True)
class Prompt:
    """A call's prompt as the branch index reads it: the canonical text (`call.canonical`), where
    its head ends (tools and leading system turns, what the branches of an agent share) and where
    its first conversation turn ends, and a key of that turn (which thread it is; None: none)."""

    text: str
    head: int = 0
    first: int = 0
    thread: int | None = None

    @classmethod
    def raw(cls, text: str) -> Prompt:
        """A prompt without turns (`/v1/completions`): its first kilobyte stands for the head."""
        return cls(text, 0, min(len(text), 1024))


@dataclass(slots=True)
class _Branch:
    """One branch: the text its instance context holds (its last prompt, then that call's answer),
    referenced, never copied, and the thread its first conversation turn names."""

    name: str
    prompt: str
    answer: str
    thread: int | None

    def size(self) -> int:
        return sys.getsizeof(self.prompt) + sys.getsizeof(self.answer)

    def covered(self, text: str) -> int:
        """Characters of `text` this branch's context holds (its longest common prefix)."""
        prompt = self.prompt
        if text.startswith(prompt):  # the usual turn: memcmp, stops at the first difference
            n = len(prompt)
            return n + len(self.answer) if text.startswith(self.answer, n) else n
        return _shared(text, prompt)


def _shared(a: str, b: str) -> int:
    """The length of the common prefix of `a` and `b` (b not a prefix of a): halving pieces of
    `b` compared in place on `a`, so O(len) characters copied and O(log len) comparisons."""
    lo, hi = 0, min(len(a), len(b))  # a[:lo] == b[:lo]; a[:hi] != b[:hi] unless hi is the end
    if a.startswith(b[:hi]):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a.startswith(b[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    return lo


class PrefixBranches:
    """The branches of each (session, model), chosen by shared content (design: README, Sessions).

    A call joins the branch with which it shares the longest prefix, unless what it shares ends
    before its first conversation turn does (it shares the head, tools and system prompt, or less,
    and maybe a few words of boilerplate): then it opens a branch of its own (a sub-agent, a
    title, a compacted conversation), named `session` for the first and `session~<n>` after,
    a name the router (table, leases) and the instances (KV) see as the session. One exception:
    a call whose first conversation turn is a branch's (the same conversation, resumed under a
    system prompt a few words different) takes that branch over when it shares at least half its
    head, so the instance reuses what it still can.

    Each branch keeps a reference to the text its instance context holds (its last prompt and
    answer), so a lookup is a `startswith` per branch (memcmp, stopping at the first difference)
    and never hashes or copies the prompt. Bounds, least recently used first out:
    `max_branches` per (session, model), `max_sessions` (session, model) pairs and `max_bytes`
    of kept text in all. A branch evicted by a bound is passed to `on_evict`, which forgets it in
    the router and on the instances, so every view holds the same branches."""

    MAX_BYTES = 256 << 20
    """The default bound on kept text: 64M tokens at 4 characters a token, more context than
    the instances of one box hold in KV (an evicted branch's KV is dropped everywhere)."""

    def __init__(
        self, max_branches: int, max_sessions: int = 100_000, max_bytes: int = MAX_BYTES
    ) -> None:
        self.max_branches, self.max_sessions, self.max_bytes = max_branches, max_sessions, max_bytes
        self.on_evict: Callable[[str], None] = lambda name: None
        self.bytes = 0
        self._trees: OrderedDict[tuple[str, str], OrderedDict[str, _Branch]] = OrderedDict()
        self._names: set[str] = set()  # every live branch name (unique across models)
        self._serial = 0

    def branch(self, session: str, model: str, text: str) -> str:
        """The branch `text` belongs to (created, evicting the least recently used, if new)."""
        return self.branch_covered(session, model, Prompt.raw(text))[0]

    def branch_covered(self, session: str, model: str, prompt: Prompt) -> tuple[str, int]:
        """The branch `prompt` belongs to, and how many of its characters the branch's context
        covers; the branch now holds `prompt` (created, evicting others past a bound, if new)."""
        tree = self._trees.get((session, model))
        if tree is None:
            tree = self._trees[(session, model)] = OrderedDict()
        self._trees.move_to_end((session, model))
        best, covered = self._choose(tree, prompt)
        if best is None:
            fresh = not tree and session not in self._names  # a name never reused in a tree
            name = session if fresh else self._next_name(session)
            best = tree[name] = _Branch(name, "", "", prompt.thread)
            self._names.add(name)
            self.bytes += best.size()
            covered = 0
        self.bytes -= best.size()
        best.prompt, best.answer, best.thread = prompt.text, "", prompt.thread
        self.bytes += best.size()
        tree.move_to_end(best.name)
        self._bound(tree)
        return best.name, covered

    def _choose(self, tree: OrderedDict[str, _Branch], p: Prompt) -> tuple[_Branch | None, int]:
        best, covered = None, 0
        for b in reversed(tree.values()):  # most recent first: it wins ties
            if (n := b.covered(p.text)) > covered:
                best, covered = b, n
        # it continues the branch's context, or shares a conversation turn with it
        if best is not None and (covered >= len(best.prompt) or covered >= max(p.first, 1)):
            return best, covered
        for b in reversed(tree.values()):
            if p.thread is not None and b.thread == p.thread:
                if (n := b.covered(p.text)) >= p.head // 2 and n > 0:
                    return b, n
        return None, 0

    def _next_name(self, session: str) -> str:
        while True:
            self._serial += 1
            if (name := f"{session}~{self._serial}") not in self._names:
                return name

    def _bound(self, tree: OrderedDict[str, _Branch]) -> None:
        while len(tree) > self.max_branches:
            self._evict(tree, next(iter(tree)))
        while len(self._trees) > self.max_sessions or self.bytes > self.max_bytes:
            key, oldest = next(iter(self._trees.items()))
            if oldest is tree and len(tree) == 1:
                break  # the call's own branch stays, whatever its size
            self._evict(oldest, next(iter(oldest)))
            if not oldest:
                del self._trees[key]

    def _evict(self, tree: OrderedDict[str, _Branch], name: str) -> None:
        gone = tree.pop(name)
        self.bytes -= gone.size()
        self._names.discard(name)
        self.on_evict(name)

    def remember(self, session: str, model: str, branch: str, prompt: Prompt, answer: str) -> None:
        """A call of `branch` finished: its context is `prompt` and `answer` now (a branch
        evicted while the call ran comes back, since the instance holds its context again)."""
        tree = self._trees.get((session, model))
        found = tree.get(branch) if tree is not None else None
        if found is None:
            if branch in self._names:
                return  # the name went to another branch meanwhile
            if tree is None:
                tree = self._trees[(session, model)] = OrderedDict()
            found = tree[branch] = _Branch(branch, "", "", prompt.thread)
            self._names.add(branch)
            self.bytes += found.size()
        elif found.prompt is not prompt.text:
            return  # a later call of the branch replaced its context
        self.bytes -= found.size()
        found.prompt, found.answer = prompt.text, answer
        self.bytes += found.size()
        self._trees.move_to_end((session, model))
        tree.move_to_end(branch)
        self._bound(tree)

    def names(self, session: str, model: str) -> list[str]:
        """The session's branches, least recently used first."""
        return list(self._trees.get((session, model), ()))

    def forget(self, session: str) -> list[str]:
        """Drop every branch of `session` (all models) and their text; the names it had, the
        session's own name always among them."""
        names = {session}
        for key in [k for k in self._trees if k[0] == session]:
            for b in self._trees.pop(key).values():
                self.bytes -= b.size()
                self._names.discard(b.name)
                names.add(b.name)
        return sorted(names)


class RouterShell:
    """The router in real time: `router` places, `branches` name the session branch of a call
    and how much of its prompt the branch's context covers; a branch the index evicts is
    forgotten by the router at once and on the instances through `evicted` (the gateway's)."""

    def __init__(self, router: Router, branches: PrefixBranches | None = None) -> None:
        if branches is None:  # the config's defaults
            branches = PrefixBranches(max_branches=4)
        self.router, self.branches = router, branches
        branches.on_evict = self._evicted
        self._changed = asyncio.Event()
        self._expired_at = float("-inf")
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

    merged: Callable[[str, list[tuple[str, str]] | None], None] = staticmethod(
        lambda instance, keys: None
    )
    """Which session pairs of an instance's view a reply changed (None: all of them, the view
    was replaced or dropped); the gateway's pool change log (`pool.SessionLog.record`)."""

    def _evicted(self, branch: str) -> None:
        self.router.forget_session(branch)
        self.evicted(branch)

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

    def session_view(self, instance: str) -> dict[tuple[str, str], KVLocation]:
        """The instance's whole session view, merged from its telemetry deltas (read-only)."""
        return self._sessions.get(instance, {})

    def _merge(self, t: Telemetry) -> dict[tuple[str, str], KVLocation]:
        view = self._sessions.setdefault(t.instance, {})
        self.merged(t.instance, t.merge_into(view))
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
        self.merged(instance, None)
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
