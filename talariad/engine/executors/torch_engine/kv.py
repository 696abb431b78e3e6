"""What each session's KV pages hold on one torch instance (pure bookkeeping, no torch).

The substrate knows pages and host blocks; this book knows which token ids they hold, so a new
prompt can be matched against them: on device any common prefix counts, on host whole pages only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from talariad.engine.executors.base import common_prefix
from talariad.instance.contract import KVLocation
from talariad.types import KVState


@dataclass(slots=True)
class TokenContext:
    """One owner's context for one model: token ids and how much of it has KV where."""

    tokens: list[int]
    """The context: prompt and generated ids (the last sampled id has no KV yet)."""
    valid: int = 0
    """Leading tokens whose KV is in the owner's device pages (0 when it has none)."""
    host_tokens: int = 0
    """Leading tokens checkpointed to the host KV registry (whole pages)."""
    busy: str | None = None
    """The call whose prefill/decode is using the pages now."""
    last_use: int = 0

    @property
    def on_device(self) -> bool:
        return self.valid > 0


KVLESS_RECORDS = 256
"""Records kept after their KV is gone everywhere, most recent first: a return to one of them is
labelled a recompute (its context existed) rather than a new prefix."""


class KVBook:
    def __init__(self, page_size: int, kvless_records: int = KVLESS_RECORDS) -> None:
        self.page_size = page_size
        self.records: dict[tuple[str, str], TokenContext] = {}
        self.kvless_records = kvless_records
        self._kvless: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._tick = 0

    def get(self, owner: str, model: str) -> TokenContext | None:
        return self.records.get((owner, model))

    def open(self, owner: str, model: str, call_id: str) -> TokenContext:
        """The owner's record for a call about to run (created empty the first time)."""
        rec = self.records.setdefault((owner, model), TokenContext([]))
        self._kvless.pop((owner, model), None)
        rec.busy = call_id
        self.touch(rec)
        return rec

    def touch(self, rec: TokenContext) -> None:
        self._tick += 1
        rec.last_use = self._tick

    def drop(self, owner: str, model: str) -> None:
        self.records.pop((owner, model), None)
        self._kvless.pop((owner, model), None)

    def settle(self, owner: str, model: str) -> None:
        """Bound the records whose KV is gone: keep the latest `kvless_records` of them."""
        rec = self.records.get((owner, model))
        if rec is None or rec.on_device or rec.host_tokens or rec.busy is not None:
            return
        self._kvless[(owner, model)] = None
        self._kvless.move_to_end((owner, model))
        while len(self._kvless) > self.kvless_records:
            self.records.pop(self._kvless.popitem(last=False)[0], None)

    def host_lost(self, owner: str, model: str, pages: int) -> KVLocation | None:
        """The host registry cut the owner's prefix to `pages`: the ledger update, if the ledger
        speaks of its host copy (not while the owner is on device or in a call)."""
        rec = self.records.get((owner, model))
        if rec is None:
            return None
        rec.host_tokens = min(rec.host_tokens, pages * self.page_size)
        if rec.on_device or rec.busy is not None:
            return None
        self.settle(owner, model)
        state = KVState.HOST if rec.host_tokens else KVState.MISSING
        return KVLocation(owner, model, state, rec.host_tokens)

    def reusable(self, owner: str, model: str, prompt: Sequence[int], host_kv: bool) -> int:
        """Prompt tokens whose KV this instance holds: any device prefix, or whole host pages."""
        rec = self.records.get((owner, model))
        if rec is None:
            return 0
        device = common_prefix(rec.tokens[: rec.valid], prompt)
        host = common_prefix(rec.tokens[: rec.host_tokens], prompt) if host_kv else 0
        return max(device, host // self.page_size * self.page_size)

    def idle_on_device(self, model: str, keep: set[str]) -> list[str]:
        """Owners whose device pages no call is using, least recently used first (`keep` last)."""
        idle = [
            (o, r)
            for (o, m), r in self.records.items()
            if m == model and r.on_device and r.busy is None
        ]
        idle.sort(key=lambda item: (item[0] in keep, item[1].last_use))
        return [o for o, _ in idle]

    def off_device(self, owner: str, model: str, host_kv: bool) -> KVLocation:
        """The owner's pages are gone: where its prefix now lives, as a scheduler ledger update."""
        rec = self.records[(owner, model)]
        rec.valid = 0
        if not host_kv:
            rec.host_tokens = 0
        self.settle(owner, model)
        if rec.host_tokens > 0:
            return KVLocation(owner, model, KVState.HOST, rec.host_tokens)
        return KVLocation(owner, model, KVState.MISSING, 0)

    def on_device_owners(self, model: str) -> list[str]:
        return [o for (o, m), r in self.records.items() if m == model and r.on_device]
