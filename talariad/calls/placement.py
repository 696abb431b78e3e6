"""One placement shell over the router, the same for the box's gateway (over its instances), the
pool's picker (over boxes) and, through the picker, the simulator's pool: a call's session branch
and the router's request for it, the branch index kept in step with the router (at a box's
gateway a branch the index evicts is forgotten there), expiry about once a second, a call's end,
and a refusal said in the API's words. The shells around it differ only in their clock and their IO."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Protocol

from talariad.calls.branches import PrefixBranches, Prompt
from talariad.calls.errors import APIError
from talariad.calls.spec import CallSpec, plan_call
from talariad.router import CallRequest, Decision, InstanceSnapshot, Router
from talariad.types import KVState


class Placer(Protocol):
    """Who decides: the router itself, or a box-level policy over it (`router.box_policies`)."""

    def place(self, call: CallRequest, now: float) -> Decision: ...

    def completed(
        self, call_id: str, target: str, kv_state: KVState, kv_len: int, now: float
    ) -> object: ...

    def failed(self, call_id: str, now: float) -> object: ...


class Placement:
    """The router (`router`, deciding through `placer`) and the branch index (`branches`) of one
    shell. `grace_s`: how long past its expiry a lease stays in the book, for a call that arrived
    before it and is still being read (a lease is judged at the call's arrival). `holds_kv`: the
    branch index's bounds are the targets' KV (a box's gateway), so a branch it evicts is
    forgotten by the router and on the targets. At the picker its bounds (bytes, branches a
    session, sessions) are its own memory only: the boxes keep or drop the branch's KV by their
    own (their snapshots say which), the router keeps its lease until it expires or no snapshot
    holds its prefix, and a session's branch is named again from its content when the session
    returns (one named apart, with a key of its head or a serial, may come back under another
    name: its lease then expires unused)."""

    EXPIRE_EVERY_S = 1.0
    EXPIRE_STEP = 256
    """Leases and idle session rows one `expire` drops, at most: 100k sessions opened together
    expire together, and the shell's loop must not stall on them (the rest go at its next
    calls, `observe` and `expire` each a step)."""

    def __init__(
        self,
        router: Router,
        branches: PrefixBranches,
        placer: Placer | None = None,
        grace_s: float = 0.0,
        holds_kv: bool = True,
    ) -> None:
        self.router, self.branches, self.grace_s = router, branches, grace_s
        self.placer: Placer = router if placer is None else placer
        if holds_kv:
            branches.on_evict = self._evict
        self._expired_at = -math.inf
        self._expiring = False  # a step left more due

    evicted: Callable[[str], None] = staticmethod(lambda branch: None)
    """Forget an evicted branch beyond the router too (the gateway's: on its instances)."""

    def _evict(self, branch: str) -> None:
        self.router.forget_session(branch)
        self.evicted(branch)

    def plan(
        self,
        call_id: str,
        spec: CallSpec,
        prompt: Prompt,
        headers: Mapping[str, str],
        model: str,
        max_tokens: int,
        clamp_to: int | None,
        arrived: float | None = None,
    ) -> tuple[str, str, CallRequest]:
        """The call's session, its branch and the router's request (`spec.plan_call`), arrived
        at `arrived`, with the prefix the targets say its branch holds where this shell has seen
        none of the branch's text (`learned`)."""
        session, branch, call = plan_call(
            call_id, spec, prompt, headers, self.branches, model, max_tokens, clamp_to, arrived
        )
        return session, branch, self.learned(call)

    def learned(self, call: CallRequest) -> CallRequest:
        """`call` with the prefix the targets' snapshots say its branch holds, where this shell
        has seen none of the branch's text (a picker restarted, or another replica placed the
        session's calls): the snapshots are the session's memory, their KV what the cost weighs."""
        if call.session_id is None or call.prefix_tokens > 0:
            return call
        held = self.router.held_prefix(call.session_id, call.model)
        if held <= 0:
            return call
        return dataclasses.replace(call, prefix_tokens=min(held, max(call.prompt_tokens - 1, 0)))

    def place(self, call: CallRequest, now: float) -> Decision:
        return self.placer.place(call, now)

    def observe(self, snapshot: InstanceSnapshot, now: float) -> bool:
        """Install a target's snapshot (False: not newer than the installed one)."""
        changed = self.router.observe(snapshot, now)
        self.expire(now)
        return changed

    def expire(self, now: float) -> None:
        """Leases, held calls and idle sessions, about once a second, in bounded steps."""
        if self._expiring or now - self._expired_at >= self.EXPIRE_EVERY_S:
            if not self._expiring:
                self._expired_at = now
            report = self.router.expire(self._expired_at - self.grace_s, self.EXPIRE_STEP)
            self._expiring = report.pending

    def completed(
        self, call_id: str, target: str, kv_state: KVState, kv_len: int, now: float
    ) -> None:
        """The call ended well on `target`, its prefix left in `kv_state`: the session's lease."""
        self.placer.completed(call_id, target, kv_state, kv_len, now)

    def failed(self, call_id: str, now: float) -> None:
        self.placer.failed(call_id, now)


def refusal(decision: Decision, requested: str, targets: str) -> APIError:
    """The 429 for a call no target (`targets`: "instance", "box") can take now, with the
    router's reason and when to try again (`Retry-After`, whole seconds, at least 1)."""
    retry = str(max(1, math.ceil(decision.retry_after_s or 1)))
    return APIError(
        429,
        f"no {targets} can take a {requested!r} call now ({decision.reason})",
        type="rate_limit_exceeded",
        code=decision.kind.value,
        headers={"Retry-After": retry},
    )
