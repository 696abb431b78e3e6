"""A session's branches, chosen by shared content: which branch a call's prompt continues and
how much of it that branch's context holds (the gateway and the picker name branches alike)."""

from __future__ import annotations

import hashlib
import sys
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(slots=True)
class Prompt:
    """A call's prompt as the branch index reads it: the canonical text (`spec.canonical`), where
    its head ends (tools and leading system turns, what the branches of an agent share) and where
    its first conversation turn ends, and a key of that turn (which thread it is; None: none):
    the same text gives the same key in every process (`thread_key`)."""

    text: str
    head: int = 0
    first: int = 0
    thread: str | None = None

    @classmethod
    def raw(cls, text: str) -> Prompt:
        """A prompt without turns (`/v1/completions`): its first kilobyte stands for the head."""
        return cls(text, 0, min(len(text), 1024))


def thread_key(*parts: object) -> str:
    """A short digest of `parts`, the same in every process (Python's `hash` is salted per
    process: a box and the pool's picker must name a branch alike)."""
    return hashlib.blake2b(repr(parts).encode(), digest_size=5).hexdigest()


class Branched(NamedTuple):
    """Where a call's prompt went: its branch, the characters of it whose context some branch
    holds, and that branch when it is another (a new branch sharing its session's head)."""

    name: str
    covered: int
    source: str | None = None


@dataclass(slots=True)
class _Branch:
    """One branch: the text its instance context holds (its last prompt, then that call's answer),
    referenced, never copied, and the thread its first conversation turn names."""

    name: str
    prompt: str
    answer: str
    thread: str | None
    head: int = 0  # where its prompt's head ends

    def size(self) -> int:
        return sys.getsizeof(self.prompt) + sys.getsizeof(self.answer)

    def continued_by(self, p: Prompt) -> bool:
        """`p`'s conversation (what follows its head) starts with this branch's: the same
        conversation, whatever its head says now, and more of it (a title call resending only the
        first turn does not continue it)."""
        return len(p.text) - p.head > len(self.prompt) - self.head and p.text.startswith(
            self.prompt[self.head :], p.head
        )

    def covered(self, text: str) -> int:
        """Characters of `text` this branch's context holds (its longest common prefix)."""
        prompt = self.prompt
        if text.startswith(prompt):  # the usual turn: memcmp, stops at the first difference
            n = len(prompt)
            return n + len(self.answer) if text.startswith(self.answer, n) else n
        return common_prefix(text, prompt)


def common_prefix(a: str | bytes, b: str | bytes, hi: int | None = None) -> int:
    """The length of the common prefix of `a` and `b[:hi]` (both str or both bytes): halving
    pieces of `b` compared in place on `a`, so O(len) characters copied (none for bytes) and
    O(log len) comparisons."""
    lo, hi = 0, min(len(a), len(b) if hi is None else hi)  # a[:lo] == b[:lo]
    piece = memoryview(b) if isinstance(b, bytes) else b
    if a.startswith(piece[:hi]):  # type: ignore[arg-type]
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a.startswith(piece[lo:mid], lo):  # type: ignore[arg-type]
            lo = mid
        else:
            hi = mid
    return lo


class PrefixBranches:
    """The branches of each (session, model), chosen by shared content (design: README, Sessions).

    A call joins the branch with which it shares the longest prefix, unless what it shares ends
    before its first conversation turn does (it shares the head, tools and system prompt, or less,
    and maybe a few words of boilerplate): then it opens a branch of its own (a sub-agent, a
    title, a compacted conversation). A branch is named from its content, `session~<key of its
    first conversation turn>` (`Prompt.thread`), so a box's gateway and the pool's picker, and a
    restarted picker, name it alike; a second live branch of the same first turn (a title call
    beside its conversation) adds a key of its head. The router (table, leases) and the
    instances (KV) see that name as the session. One exception: a call whose first conversation
    turn is a branch's and whose conversation continues that branch's (the same conversation,
    resumed under a system prompt or tools a few words different) takes that branch over, so the
    instance reuses the longest prefix it still shares.

    Each branch keeps a reference to the text its instance context holds (its last prompt and
    answer), so a lookup is a `startswith` per branch (memcmp, stopping at the first difference)
    and never hashes or copies the prompt. Bounds, least recently used first out:
    `max_branches` per (session, model), `max_sessions` (session, model) pairs and `max_bytes`
    of kept text in all. A branch evicted by a bound is passed to `on_evict`, which at a box's
    gateway forgets it in the router and on the instances, so every view holds the same branches
    (the picker's bounds are its own memory: `Placement`)."""

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
        return self.branched(session, model, prompt)[:2]

    def branched(self, session: str, model: str, prompt: Prompt) -> Branched:
        """`branch_covered`, with the branch whose context holds the covered characters when a
        new branch shares only its session's head with it (where that branch lives, the head
        does)."""
        tree = self._trees.get((session, model))
        if tree is None:
            tree = self._trees[(session, model)] = OrderedDict()
        self._trees.move_to_end((session, model))
        best, covered = self._choose(tree, prompt)
        source = None
        if best is None:
            source, covered = self._nearest(tree, prompt)
            name = self._name(session, tree, prompt)
            best = tree[name] = _Branch(name, "", "", prompt.thread, prompt.head)
            self._names.add(name)
            self.bytes += best.size()
        self.bytes -= best.size()
        best.prompt, best.answer, best.thread = prompt.text, "", prompt.thread
        best.head = prompt.head
        self.bytes += best.size()
        tree.move_to_end(best.name)
        self._bound(tree)
        return Branched(best.name, covered, source if source in tree else None)

    def _choose(self, tree: OrderedDict[str, _Branch], p: Prompt) -> tuple[_Branch | None, int]:
        best, covered = None, 0
        for b in reversed(tree.values()):  # most recent first: it wins ties
            if (n := b.covered(p.text)) > covered:
                best, covered = b, n
        # it continues the branch's context, or shares a conversation turn with it
        if best is not None and (covered >= len(best.prompt) or covered >= max(p.first, 1)):
            return best, covered
        for b in reversed(tree.values()):
            if p.thread is not None and b.thread == p.thread and b.continued_by(p):
                return b, b.covered(p.text)
        return None, 0

    @staticmethod
    def _nearest(tree: OrderedDict[str, _Branch], p: Prompt) -> tuple[str | None, int]:
        """The branch sharing the longest prefix with `p` (its head, at most), and how much."""
        best, covered = None, 0
        for b in reversed(tree.values()):
            if (n := b.covered(p.text)) > covered:
                best, covered = b.name, n
        return best, covered

    def _name(self, session: str, tree: OrderedDict[str, _Branch], p: Prompt) -> str:
        """`session~<thread>`; taken in this tree (another branch of the same first turn):
        `session~<thread>~<head>`; then a serial, so two live branches never share a name."""
        thread = p.thread if p.thread is not None else thread_key(p.text[: p.first])
        name = f"{session}~{thread}"
        if name in tree or name in self._names:
            name = f"{name}~{thread_key(p.text[: p.head])}"
        base = name
        while name in tree or name in self._names:
            self._serial += 1
            name = f"{base}~{self._serial}"
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
            found = tree[branch] = _Branch(branch, "", "", prompt.thread, prompt.head)
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
