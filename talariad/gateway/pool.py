"""The box's snapshot for the pool's endpoint picker: `GET /pool/snapshot`, behind a bearer
token of its own (`pool.token_file`). It publishes what the gateway already holds (the
directory's latest telemetry, the router shell's merged session views, the router's profiles):
no second poller. Design: docs/pool.md."""

from __future__ import annotations

import hmac
import random
from typing import TYPE_CHECKING

from talariad.calls.errors import APIError
from talariad.router.boxes import prefix_rank
from talariad.types import KVLocation, LatencyProfile
from talariad.wire.box import BoxInstance, BoxModel, BoxSnapshot

if TYPE_CHECKING:
    from talariad.gateway.gateway import Gateway


Key = tuple[str, str]
"""A (session, model) pair of a session view."""


class SessionLog:
    """The order in which the gateway's merged session views changed, so a box snapshot can
    carry only what changed since an earlier one (`?since=TOKEN`). A token is the sequence
    number of the last change a snapshot saw. Bounded: past `max_changes` the oldest changes
    go, and a token older than those kept gets the whole view."""

    def __init__(self, max_changes: int = 65_536) -> None:
        self.seq = random.getrandbits(62)  # a restarted daemon never continues an old token
        self.max_changes = max_changes
        self._first = self.seq + 1  # the sequence number of `_log[0]`
        self._log: list[tuple[str, Key | None]] = []  # None: the instance's view was replaced

    def record(self, instance: str, keys: list[Key] | None) -> None:
        """`keys` of `instance`'s view changed (None: all of them)."""
        if keys is None:
            self._log.append((instance, None))
        else:
            self._log.extend((instance, k) for k in keys)
        self.seq = self._first + len(self._log) - 1
        if len(self._log) > 2 * self.max_changes:  # trimmed in halves: O(1) a change
            cut = len(self._log) - self.max_changes
            del self._log[:cut]
            self._first += cut

    def since(self, token: int | None) -> dict[str, set[Key] | None] | None:
        """Per instance, the pairs changed after `token` (None: its whole view was replaced);
        None when `token` names no view this log still covers."""
        if token is None or not self._first - 1 <= token <= self.seq:
            return None
        changes: dict[str, set[Key] | None] = {}
        for instance, key in self._log[token - self._first + 1 :]:
            keys = changes.setdefault(instance, set())
            if key is None:
                changes[instance] = None
            elif keys is not None:
                keys.add(key)
        return changes


class PoolEndpoint:
    """The token that guards the snapshot (None: no pool, the endpoint is not there), the
    snapshot's version counter and the session views' change log."""

    def __init__(self, token: str | None = None, max_sessions: int = 20_000) -> None:
        self.token, self.max_sessions, self.version = token, max_sessions, 0
        self.log = SessionLog()
        self._cut_at: dict[str, int] = {}  # instance -> the last token whose view was cut

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

    def snapshot(self, gw: Gateway, now: float, since: int | None = None) -> BoxSnapshot:
        """Every configured instance with telemetry, and every model with its profile now;
        `since`: the `sessions_epoch` of the caller's last snapshot (sessions as changes)."""
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
        changes = self.log.since(since)
        instances = [
            i for c in gw.cfg.instances if (i := self._instance(gw, c.name, now, since, changes))
        ]
        return BoxSnapshot(
            version=self.version,
            sessions_epoch=self.log.seq,
            instances=instances,
            models=models,
        )

    def _instance(
        self,
        gw: Gateway,
        name: str,
        now: float,
        since: int | None,
        changes: dict[str, set[Key] | None] | None,
    ) -> BoxInstance | None:
        t = gw.directory.snapshot(name)
        if t is None:
            return None
        view = gw.routing.session_view(name)
        keys = self._changed(name, view, since, changes)
        listed, removed, cut = self._whole(name, view) if keys is None else _delta(view, keys)
        sent = t.model_copy(
            update={
                "sessions": listed,
                "sessions_base": None if keys is None else since,
                "sessions_removed": removed,
                "sessions_epoch": self.log.seq,
                "rounds": [],
            }
        )
        return BoxInstance(
            name=name,
            healthy=gw.ready(name),
            age_s=max(gw.directory.age_s(name, now), 0.0),
            telemetry=sent,
            sessions_truncated=cut,
        )

    def _changed(
        self,
        name: str,
        view: dict[Key, KVLocation],
        since: int | None,
        changes: dict[str, set[Key] | None] | None,
    ) -> set[Key] | None:
        """The pairs of `name`'s view to send as changes; None: send the whole view (no valid
        token, the view was replaced since, or the caller's view was cut, or this one is)."""
        if changes is None or since is None or since <= self._cut_at.get(name, since - 1):
            return None
        if len(view) > self.max_sessions:
            return None
        return changes.get(name, set())

    def _whole(self, name: str, view: dict[Key, KVLocation]) -> tuple[list, list, bool]:
        listed = list(view.values())
        cut = len(listed) > self.max_sessions
        if cut:  # what the picker gains most from: prefixes on a device, then the longest
            listed = sorted(listed, key=prefix_rank)
            del listed[self.max_sessions :]
            self._cut_at[name] = self.log.seq  # changes to a cut view are no delta to send
        return listed, [], cut


def _delta(view: dict[Key, KVLocation], keys: set[Key]) -> tuple[list, list, bool]:
    """The entries of `view` that `keys` name, and the keys it no longer has."""
    return [view[k] for k in keys if k in view], [k for k in keys if k not in view], False
