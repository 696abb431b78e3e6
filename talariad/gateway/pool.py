"""The box's snapshot for the pool's endpoint picker: `GET /pool/snapshot`, behind a bearer
token of its own (`pool.token_file`). It publishes what the box's router already holds (its
instances' snapshots, projected onto the box as one placement target with the box's session
view, and its profiles): no second poller, and nothing left for the picker to compute.
Design: docs/pool.md."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import random
from collections.abc import AsyncIterator, Collection
from typing import TYPE_CHECKING

from talariad.calls.errors import APIError
from talariad.router import InstanceSnapshot, Router
from talariad.router.box_policies import box_stats
from talariad.router.boxes import best_prefixes, box_snapshot, prefix_rank
from talariad.types import LatencyProfile
from talariad.wire.box import CONTENT, PROJECTED, BoxModel, BoxSnapshot, BoxTarget

if TYPE_CHECKING:
    from talariad.gateway.gateway import Gateway


Key = tuple[str, str]
"""A (session, model) pair of a session view."""


def box_target(
    router: Router,
    now: float,
    live: Collection[str],
    changes: tuple[int, set[Key]] | None = None,
    max_sessions: int | None = None,
) -> BoxTarget:
    """The box as one placement target at `now`, from what its `router` installed of the `live`
    instances (those the box takes calls for): the projection (`router.boxes.box_snapshot`), the
    peers' stats, and the box's session view, whole (cut to `max_sessions` per live instance,
    the best-placed prefixes kept) or, `changes` given (the caller's token and the pairs changed
    since), as the changes to those pairs. The daemon and the simulator publish with it."""
    installed = _installed(router, live)
    snaps = [snap for snap, _ in installed]
    view = best_prefixes(snaps, None if changes is None else changes[1])
    box = box_snapshot("", 0, now, snaps, {})  # the name and version are the picker's to give
    listed, removed, cut = list(view.values()), [], False
    bound = None if max_sessions is None else max_sessions * max(len(snaps), 1)
    if changes is not None:
        removed = [k for k in changes[1] if k not in view]
    elif bound is not None and len(listed) > bound:
        # what the picker gains most from: prefixes on a device, then the longest
        listed, cut = sorted(listed, key=prefix_rank)[:bound], True
    stats = box_stats("", snaps)
    return BoxTarget.model_construct(
        **{name: getattr(box, name) for name in PROJECTED},
        allowed_models=sorted(box.allowed_models),
        models=dict(box.models),
        age_s=_age(installed, now),
        basis=[(s.instance, s.version) for s in snaps],
        sessions=listed,
        sessions_base=None if changes is None else changes[0],
        sessions_removed=removed,
        sessions_truncated=cut,
        queue=stats.queue,
        kv_util=stats.kv_util,
        instances=stats.instances,
    )


def _installed(router: Router, live: Collection[str]) -> list[tuple[InstanceSnapshot, float]]:
    """The installed snapshots of the `live` instances, with when each last held."""
    return [(s, at) for s, at in router.installed() if s.healthy and s.instance in live]


def _age(installed: list[tuple[InstanceSnapshot, float]], now: float) -> float:
    """The age of the oldest of the `installed` snapshots at `now` (`BoxTarget.age_s`)."""
    return max((max(now - at, 0.0) for _, at in installed), default=0.0)


_ETAGGED = {"models": True, "max_connections": True, "target": dict.fromkeys(CONTENT, True)}
"""What of a `BoxSnapshot` its `etag` hashes (besides the session epoch)."""


def snapshot_etag(snap: BoxSnapshot) -> str:
    """The snapshot's `etag`: a digest of what it says but its age, basis and session view,
    and the epoch that names the view."""
    digest = hashlib.blake2b(snap.model_dump_json(include=_ETAGGED).encode(), digest_size=8)
    return f'"{digest.hexdigest()}-{snap.sessions_epoch}"'


class SessionLog:
    """The order in which the box's session view changed (the pairs each telemetry reply changed
    in an instance's view, as the gateway merges it), so a box snapshot can carry only what
    changed since an earlier one (`?since=TOKEN`). A token is the sequence number of the last
    change a snapshot saw. Bounded: past `max_changes` the oldest changes go, and a token older
    than those kept gets the whole view."""

    def __init__(self, max_changes: int = 65_536) -> None:
        self.seq = random.getrandbits(62)  # a restarted daemon never continues an old token
        self.max_changes = max_changes
        self._first = self.seq + 1  # the sequence number of `_log[0]`
        self._log: list[Key | None] = []  # None: any pair may have changed

    def record(self, keys: list[Key] | None) -> None:
        """`keys` changed (None: any of them may have: an instance's view was replaced or
        dropped, or the box's live instances changed)."""
        if keys is None:
            self._log.append(None)
        else:
            self._log.extend(keys)
        self.seq = self._first + len(self._log) - 1
        if len(self._log) > 2 * self.max_changes:  # trimmed in halves: O(1) a change
            cut = len(self._log) - self.max_changes
            del self._log[:cut]
            self._first += cut

    def since(self, token: int | None) -> set[Key] | None:
        """The pairs changed after `token`; None when `token` names no view this log still
        covers, or any pair may have changed since."""
        if token is None or not self._first - 1 <= token <= self.seq:
            return None
        changed: set[Key] = set()
        for key in self._log[token - self._first + 1 :]:
            if key is None:
                return None
            changed.add(key)
        return changed


class PoolEndpoint:
    """The token that guards the snapshot (None: no pool, the endpoint is not there), the
    snapshot's version counter, the session view's change log and its bound (`max_sessions`
    per live instance: `pool.max_sessions_per_instance`)."""

    def __init__(
        self,
        token: str | None = None,
        max_sessions: int = 20_000,
        max_connections: int | None = None,
    ) -> None:
        """`max_connections`: the box's `limits.max_connections`, published for the picker."""
        self.token, self.max_sessions, self.version = token, max_sessions, 0
        self.max_connections = max_connections
        self.log = SessionLog()
        self._cut_at: int | None = None  # the last token whose view was cut
        self._live: frozenset[str] = frozenset()  # the live instances of the last snapshot
        self._etag: tuple[tuple, str] | None = None  # (the state it was computed at, the etag)
        self._news: asyncio.Event | None = None  # set at the next telemetry merged (held polls)
        self._closed = False  # the daemon drains: streams end

    def merged(self, keys: list[Key] | None) -> None:
        """An instance's telemetry was merged (`RouterShell.merged`; `keys`: the pairs it
        changed, None: any): logged, and the polls held wake to look."""
        self.log.record(keys)
        if self._news is not None:
            self._news.set()
            self._news = None

    async def answer_held(
        self, gw: Gateway, since: int | None, etag: str | None, wait_s: float
    ) -> BoxSnapshot | float:
        """`answer`, held up to `wait_s` while it is only the age: answered as soon as an
        instance's telemetry changes what it says, else the age at the end. (Instances going out
        of service with no telemetry merged are seen at the hold's end.)"""
        got = self.answer(gw, gw.clock(), since, etag)
        loop = asyncio.get_running_loop()
        end = loop.time() + wait_s
        while isinstance(got, float) and not self._closed and (left := end - loop.time()) > 0:
            if self._news is None:
                self._news = asyncio.Event()
            try:
                await asyncio.wait_for(self._news.wait(), left)
            except TimeoutError:
                pass
            got = self.answer(gw, gw.clock(), since, etag)
        return got

    async def stream(
        self, gw: Gateway, since: int | None, etag: str | None, hold_s: float, gap_s: float
    ) -> AsyncIterator[bytes]:
        """The answers a caller polling with held polls would get, as frames of one response
        (`wire.box.STREAM_TYPE`): a snapshot as soon as what the box would send changes, at least
        `gap_s` after the one before (the caller's poll interval: busy instances' telemetry
        coalesced as its polls were), else the target's age every `hold_s`; each frame's
        snapshot is the caller's next `since` and `etag`, and its models are sent only when they
        differ from the frame before's (None: the same; half a one-model box's frame, parsed and
        compared by the caller at every change). Ends when the daemon drains (`close`): its
        caller then finds the port closed."""
        sent = None  # the models of the snapshot frame before
        while not self._closed:
            got = await self.answer_held(gw, since, etag, hold_s)
            if isinstance(got, float):
                yield b"%.6f\n" % got
                continue
            since, etag, models = got.sessions_epoch, got.etag, got.models
            if models == sent:
                got = got.model_copy(update={"models": None})
            sent = models
            yield got.model_dump_json().encode() + b"\n"
            if gap_s > 0 and not self._closed:
                await asyncio.sleep(gap_s)

    def close(self) -> None:
        """The daemon drains: its snapshot streams end (held polls are answered at once)."""
        self._closed = True
        if self._news is not None:
            self._news.set()
            self._news = None

    def authorize(self, header: str | None) -> None:
        """Raise the API's 404 when no token is configured, 401 when `header` lacks it."""
        if self.token is None:
            raise APIError(404, "Not Found", type="not_found_error")
        given = header[7:].strip() if header and header[:7].lower() == "bearer " else None
        if given is None or not hmac.compare_digest(given.encode(), self.token.encode()):
            what = "no pool token given" if given is None else "the pool token is not valid"
            raise APIError(
                401,
                f"{what}: send it as 'Authorization: Bearer TOKEN'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def answer(
        self, gw: Gateway, now: float, since: int | None = None, etag: str | None = None
    ) -> BoxSnapshot | float:
        """The snapshot for a caller holding the view `since` names and the snapshot `etag`
        names (`If-None-Match`); only the target's age (`304`) when that `etag` still says what
        the box would send. Computed once per state of the box (the instances' telemetry
        versions, the session view's epoch, the profiles): the polls of an unchanged box
        compare a tuple and serialize nothing."""
        router = gw.routing.router
        installed = _installed(router, self._live_now(gw))
        state = (tuple((s.instance, s.version) for s, _ in installed), self.log.seq)
        state += (router.profiles_epoch,)
        current = self._etag[1] if self._etag is not None and self._etag[0] == state else None
        if etag is not None and etag == current and since == self.log.seq:
            return _age(installed, now)
        snap = self.snapshot(gw, now, since)  # a new state, or the caller holds another
        self._etag = (state, snap.etag or "")
        if etag is not None and etag == snap.etag and since == self.log.seq:
            # new telemetry that says the same: what the box's daemon reads of an idle instance
            return snap.target.age_s
        return snap

    def _live_now(self, gw: Gateway) -> frozenset[str]:
        """The instances the box takes calls for now (a change is a change of every pair)."""
        live = frozenset(c.name for c in gw.cfg.instances if gw.ready(c.name))
        if live != self._live:  # any pair's best place may have moved
            self.log.record(None)
            self._live = live
        return live

    def snapshot(self, gw: Gateway, now: float, since: int | None = None) -> BoxSnapshot:
        """The box as one placement target, and every model with its profile now; `since`: the
        `sessions_epoch` of the caller's last snapshot (sessions as changes)."""
        self.version += 1
        profiles = gw.routing.router.profiles()
        models = [
            BoxModel(
                name=m.name,
                aliases=list(m.aliases),
                default_max_tokens=m.default_max_tokens,
                max_context=m.max_context,
                profile=profiles.get(m.name, LatencyProfile()),
            )
            for m in gw.cfg.models
        ]
        live = self._live_now(gw)
        router = gw.routing.router
        changes = self._changes(router, live, since)
        target = box_target(router, now, live, changes, self.max_sessions)
        if target.sessions_truncated:  # changes to a cut view are no delta to send
            self._cut_at = self.log.seq
        snap = BoxSnapshot(
            version=self.version,
            sessions_epoch=self.log.seq,
            target=target,
            models=models,
            max_connections=self.max_connections,
        )
        snap.etag = snapshot_etag(snap)
        return snap

    def _changes(
        self, router: Router, live: frozenset[str], since: int | None
    ) -> tuple[int, set[Key]] | None:
        """The caller's token and the pairs changed since; None: send the whole view (no valid
        token, any pair may have changed since, the caller's view was cut, or this one may be)."""
        if since is None or (self._cut_at is not None and since <= self._cut_at):
            return None
        snaps = _installed(router, live)
        if sum(len(s.sessions) for s, _ in snaps) > self.max_sessions * max(len(snaps), 1):
            return None
        keys = self.log.since(since)
        return None if keys is None else (since, keys)
