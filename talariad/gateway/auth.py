"""Optional API keys on the HTTP endpoint (`listen.api_keys_file`).

OpenAI clients send `Authorization: Bearer KEY`, Anthropic clients `x-api-key: KEY`; either is
accepted on every `/v1/` path. A refused call gets 401 in its API's error shape. `/health`,
`/ready` and `/metrics` stay open for probes and scrapers.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from talariad.calls.errors import APIError
from talariad.gateway.errors import error_response


def _given(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        if name == b"x-api-key":
            return value.strip()
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            return value[7:].strip()
    return None


class APIKeys:
    """ASGI middleware: when `keys()` is not None, a `/v1/` request needs one of them."""

    def __init__(self, app, keys: Callable[[], frozenset[str] | None]):
        self.app, self.keys = app, keys

    async def __call__(self, scope, receive, send) -> None:
        keys = self.keys() if scope["type"] == "http" and scope["path"].startswith("/v1/") else None
        if keys is not None:
            given = _given(scope["headers"])
            # compare against every key so the time taken does not tell which one was close
            ok = given is not None and sum(hmac.compare_digest(given, k.encode()) for k in keys) > 0
            if not ok:
                what = "no API key given" if given is None else "the API key is not valid"
                err = APIError(
                    401,
                    f"{what}: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
                return await error_response(scope["path"], err)(scope, receive, send)
        await self.app(scope, receive, send)
