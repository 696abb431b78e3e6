"""The call paths: each one's body model and its parse into a `CallSpec`. The box's gateway
serves these paths and the pool's picker places them; any other path is no call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError

from talariad.calls.dialects import chat, completions, messages, responses
from talariad.calls.errors import validation_error
from talariad.calls.spec import CallSpec
from talariad.calls.store import ResponseStore
from talariad.wire.messages import ChatMessage


@dataclass(frozen=True, slots=True)
class Route:
    body: type[BaseModel]
    spec: Callable[..., CallSpec]
    """The body's `CallSpec`, read from the body alone (no state of a box)."""


class _Unstored(ResponseStore):
    """No Responses kept: a `previous_response_id` is the box's to resolve (the picker reads
    the call without the conversation it continues)."""

    def __init__(self) -> None:
        super().__init__(0)

    def get(self, response_id: str) -> list[ChatMessage]:
        return []


UNSTORED = _Unstored()

ROUTES: dict[str, Route] = {
    "/v1/chat/completions": Route(chat.ChatCompletionRequest, chat.spec),
    "/v1/completions": Route(completions.CompletionRequest, completions.spec),
    "/v1/messages": Route(messages.MessagesRequest, messages.spec),
    "/v1/responses": Route(responses.ResponsesRequest, lambda b: responses.spec(b, UNSTORED)[0]),
}


def parse(path: str, raw: bytes) -> CallSpec | None:
    """The `CallSpec` of a call path's body (a query string aside); None for any other path.
    Raises APIError 400 when the body's model refuses it."""
    route = ROUTES.get(path.split("?", 1)[0])
    if route is None:
        return None
    return route.spec(body(path.split("?", 1)[0], raw))


def body(path: str, raw: bytes) -> BaseModel:
    """The body of call path `path` (no query string) as its model. Raises APIError 400 when the
    model refuses it."""
    try:
        return ROUTES[path].body.model_validate_json(raw or b"")
    except ValidationError as err:
        raise validation_error(err.errors(include_url=False)) from None
