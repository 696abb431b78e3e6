"""The Responses store: recent answers kept for `previous_response_id` (`responses.store_max`)."""

from __future__ import annotations

from collections import OrderedDict

from talariad.calls.errors import APIError
from talariad.wire.messages import ChatMessage


class ResponseStore:
    """Recent answers for `previous_response_id`: the conversation up to and including each."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, list[ChatMessage]] = OrderedDict()

    def get(self, response_id: str) -> list[ChatMessage]:
        found = self._items.get(response_id) if self.size else None
        if found is None:
            why = (
                "is not stored (responses.store_max is 0)"
                if not self.size
                else "is unknown or expired"
            )
            raise APIError(
                400,
                f"previous response {response_id!r} {why}",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        return list(found)

    def put(self, response_id: str, conversation: list[ChatMessage]) -> None:
        if self.size:
            self._items[response_id] = conversation
            while len(self._items) > self.size:
                self._items.popitem(last=False)
