"""Input limits at the edge: what a client sends is checked here, in bounded time, before anything
is tokenized, placed or forwarded to an instance.

- `BodyLimit`: an ASGI middleware that answers 413 from the Content-Length alone.
- `screen`: unsupported fields, message count, string length and invalid Unicode → 400.
- `check_context`: a lower bound on prompt tokens from the prompt's size → 400 without tokenizing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator

from talariad.calls.errors import APIError
from talariad.calls.schemas import body_field
from talariad.config import LimitsConfig
from talariad.gateway.errors import error_response

_SURROGATE = re.compile("[\ud800-\udfff]")


class BodyLimit:
    """Refuse a request body over `max_bytes()` with 413 before reading it.

    A body with a Content-Length is judged from the header; a chunked one is counted as it is read.
    The connection stays open: the server reads and drops the rest of the refused body and then
    serves the connection's next request. (Closing it with body bytes unread would reset it, and a
    reset can destroy the 413 before the client reads it.)
    """

    def __init__(self, app, max_bytes: Callable[[], int]):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        limit = self.max_bytes()
        length = _content_length(scope)
        if length is not None and length > limit:
            return await self._refuse(scope, receive, send, limit, length)
        if length is not None:
            return await self.app(scope, receive, send)
        return await self._counted(scope, receive, send, limit)

    async def _counted(self, scope, receive, send, limit: int) -> None:
        """A chunked body: read it whole (it is at most `limit` bytes), then hand it on."""
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                return await self._refuse(scope, receive, send, limit, None)
            if not msg.get("more_body", False):
                break
        body, sent = b"".join(chunks), False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(scope, receive, send, limit: int, length: int | None) -> None:
        size = f"{length} bytes" if length is not None else "more than that"
        err = APIError(
            413,
            f"request body is {size}; the limit is {limit} bytes (limits.max_body_bytes)",
            code="request_too_large",
        )
        await error_response(scope["path"], err)(scope, receive, send)


def _content_length(scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


UNSUPPORTED = {
    # field: (is it in use?, what to say)
    "logprobs": (lambda v: bool(v), "logprobs are not supported"),
    "top_logprobs": (lambda v: bool(v), "logprobs are not supported"),
    "echo": (lambda v: bool(v), "echo is not supported"),
    "best_of": (lambda v: v is not None and v != 1, "only best_of=1 is supported"),
    "suffix": (lambda v: bool(v), "suffix (insertion) is not supported"),
    "n": (lambda v: v is not None and v != 1, "only n=1 is supported"),
    "response_format": (
        lambda v: v is not None and not (isinstance(v, dict) and v.get("type", "text") == "text"),
        'only response_format {"type": "text"} is supported',
    ),
}
"""Request fields the gateway cannot honour: a request that uses one gets 400 naming it, rather than
an answer that silently ignores it. Harmless fields (top_k, metadata, user ...) are ignored."""


def screen(body, limits: LimitsConfig, raw: bytes | None = None) -> None:
    """Raise APIError(400) for an unsupported field, too many messages, or a string that is too long
    or not valid Unicode (a lone surrogate cannot be encoded, so it would fail inside an instance).
    `raw`: the JSON text the body was parsed from, when there is one; a short one without escaped
    surrogates passes the string checks without a walk over the body."""
    for field, (used, why) in UNSUPPORTED.items():
        if used(body_field(body, field)):  # a declared field or an extra one; None if absent
            raise APIError(400, f"{field}: {why}", param=field, code="unsupported_parameter")
    messages = body_field(body, "messages")  # an extra field on some APIs: any JSON value
    count = len(messages) if isinstance(messages, list) else 0
    if count > limits.max_messages:
        raise APIError(
            400,
            f"{count} messages; the limit is {limits.max_messages} (limits.max_messages)",
            param="messages",
            code="invalid_value",
        )
    if raw is not None and _raw_fits(raw, limits.max_string_chars):
        return
    data = body.model_dump()  # None values too: a key of a null-valued entry is still a string
    if _all_fit(data, limits.max_string_chars):
        return
    for path, text in _strings(data):  # the slow walk names the first offending string
        if len(text) > limits.max_string_chars:
            raise APIError(
                400,
                f"{path} is {len(text)} characters long; the limit is {limits.max_string_chars} "
                f"(limits.max_string_chars)",
                param=path,
                code="invalid_value",
            )
        if not text.isascii() and _SURROGATE.search(text):
            raise APIError(
                400,
                f"{path} is not valid Unicode (it contains a lone surrogate)",
                param=path,
                code="invalid_value",
            )


_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def _raw_fits(raw: bytes, max_chars: int) -> bool:
    """Every string parsed from the JSON text `raw` fits, known from the text alone: none is longer
    than the whole text, and a lone surrogate can only come from a `\\udXXX` escape, since UTF-8
    cannot encode one (a JSON text without a NUL byte is UTF-8: in UTF-16 or UTF-32 its ASCII
    punctuation has NULs). A request body's strings are parsed from it or are the model's own
    short defaults. False means: walk the body to be sure."""
    return len(raw) <= max_chars and b"\0" not in raw and _ESCAPED_SURROGATE.search(raw) is None


def _all_fit(data, max_chars: int) -> bool:
    """Every string in `data` (keys included) is at most `max_chars` long and valid Unicode: the
    check of `_strings` without building a path per string, which every call pays."""
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if len(value) > max_chars or (not value.isascii() and _SURROGATE.search(value)):
                return False
        elif isinstance(value, dict):
            stack.extend(value)
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)
    return True


def _strings(data) -> Iterator[tuple[str, str]]:
    """Every string in a JSON-like value with its dotted path, keys included (iterative: no recursion
    limit for deeply nested input)."""
    stack: list[tuple[str, object]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            yield path or "(body)", value
        elif isinstance(value, dict):
            for k, v in value.items():
                key = str(k)
                sub = f"{path}.{key}" if path else key
                stack.append((sub, key))
                stack.append((sub, v))
        elif isinstance(value, list | tuple):
            stack.extend((f"{path}.{i}" if path else str(i), v) for i, v in enumerate(value))


def min_prompt_tokens(text: str, limits: LimitsConfig) -> int:
    """A lower bound on the tokens `text` encodes to: no token covers more than max_bytes_per_token."""
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    return math.ceil(size / limits.max_bytes_per_token)


def check_context(text: str, max_tokens: int, max_context: int, limits: LimitsConfig) -> None:
    """Refuse, from its size alone, a prompt that cannot fit the model's context."""
    least = min_prompt_tokens(text, limits)
    if least + max_tokens > max_context:
        raise APIError(
            400,
            f"this model's maximum context is {max_context} tokens; the call needs at least "
            f"{least + max_tokens} ({least}+ prompt, judged from its size, + {max_tokens} max_tokens)",
            param="messages" if least > max_context else "max_tokens",
            code="context_length_exceeded",
        )
