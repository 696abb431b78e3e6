"""Per-session KV telemetry as changes since the consumer's last view (`SessionDeltas`)."""

from __future__ import annotations

import random

from talariad.types import KVLocation, KVState
from talariad.wire.messages import Telemetry

Row = tuple[tuple[str, str], KVState, int]
"""One session as ((session_id, model), state, kv_len) (`InstanceCore.session_rows`)."""


class SessionDeltas:
    """Per-session KV telemetry as changes since the consumer's last view, so a poll's size follows
    what changed, not how many sessions exist. One base view is kept: a consumer whose `since` is
    not the latest view (another poller, a lost reply, a restarted instance) gets the whole list."""

    def __init__(self) -> None:
        self.epoch = random.getrandbits(62)  # a restarted instance never continues an old view
        self.sent: dict[tuple[str, str], tuple[str, int]] = {}  # what the consumer holds

    def apply(self, t: Telemetry, since: int | None, rows: list[Row] | None = None) -> Telemetry:
        """`rows`: the instance's sessions in place of `t.sessions` (only the rows sent become
        records)."""
        if rows is None:
            rows = [((s.session_id, s.model), s.state, s.kv_len) for s in t.sessions]
        base, self.epoch = self.epoch, self.epoch + 1
        if since is None or since != base:
            self.sent = {k: (state, n) for k, state, n in rows}
            return t.model_copy(
                update={"sessions": [_entry(*r) for r in rows], "sessions_epoch": self.epoch}
            )
        sent = self.sent  # updated in place: a poll's work follows what changed, bar one pass
        changed = []
        for k, state, n in rows:
            if sent.get(k) != (state, n):
                sent[k] = (state, n)
                changed.append(_entry(k, state, n))
        removed: list[tuple[str, str]] = []
        if len(sent) != len(rows):  # some pair is gone from the instance's list
            now = {r[0] for r in rows}
            removed = [k for k in sent if k not in now]
            for k in removed:
                del sent[k]
        return t.model_copy(
            update={
                "sessions": changed,
                "sessions_removed": removed,
                "sessions_base": base,
                "sessions_epoch": self.epoch,
            }
        )


def _entry(key: tuple[str, str], state: KVState, kv_len: int) -> KVLocation:
    return KVLocation(key[0], key[1], state, kv_len)
