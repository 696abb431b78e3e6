"""Which session a call belongs to: the first of the sources agents actually send.

Order: the headers `x-session-id`, `x-claude-code-session-id` (Claude Code), `x-session-affinity`
(OpenCode), `session-id` and `session_id` (Codex); then body `prompt_cache_key`, body `user`,
`metadata.user_id` (its `session_id` when it is a JSON object, as Claude Code sends it, or the
suffix after `_session_`), else a hash of the system prompt and first user message, which is
stable across the calls of one agent task (a call with neither gets a session of its own rather
than sharing one with every such call).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping, Sequence

from talariad.calls.schemas import parse_json

HEADERS = (
    "x-session-id",
    "x-claude-code-session-id",
    "x-session-affinity",
    "session-id",
    "session_id",
)
_RAW_HEADERS = frozenset(h.encode() for h in HEADERS)

SESSION_FIELDS = ("prompt_cache_key", "user", "metadata")
"""The body fields `session_id` reads."""


def session_headers(headers: Mapping[str, str]) -> Mapping[str, str]:
    """The session headers of a request, the first of each name, read in one pass over its raw
    (ASGI) headers when it has them (starlette's `Headers`); another mapping is taken as it is."""
    raw: list[tuple[bytes, bytes]] | None = getattr(headers, "raw", None)
    if raw is None:
        return headers
    found: dict[str, str] = {}
    for name, value in raw:
        if name in _RAW_HEADERS:
            found.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    return found


def header_session(headers: Mapping[str, str]) -> str | None:
    """The session the headers name (the first of `HEADERS` given), None when they name none."""
    for h in HEADERS:
        if headers.get(h):
            return headers[h][:256]
    return None


def session_id(headers: Mapping[str, str], body: Mapping, messages: list[tuple[str, str]]) -> str:
    if (named := header_session(headers)) is not None:
        return named
    for key in ("prompt_cache_key", "user"):
        if isinstance(body.get(key), str) and body[key]:
            return body[key][:256]
    meta = body.get("metadata")
    user_id = meta.get("user_id") if isinstance(meta, Mapping) else None
    if isinstance(user_id, str) and (found := _user_id_session(user_id)):
        return found[:256]
    return _prefix_hash(messages)


def session_turns(messages: Sequence) -> list[tuple[str, str]]:
    """The turns `session_id` reads of a call's messages (role, content): its first system turn
    and its first user turn, in their order; O(turns before them), not O(messages)."""
    turns, system, user = [], False, False
    for m in messages:
        if not system and m.role in _SYSTEM_ROLES:
            turns.append((m.role, m.content))
            system = True
        elif not user and m.role == "user":
            turns.append((m.role, m.content))
            user = True
        if system and user:
            break
    return turns


_SYSTEM_ROLES = ("system", "developer")


def _user_id_session(user_id: str) -> str | None:
    if user_id.startswith("{"):
        try:  # strictly: a lone surrogate or runaway nesting is no session, as any non-JSON is
            data = parse_json(user_id)
        except ValueError:
            return None
        value = data.get("session_id") if isinstance(data, dict) else None
        return value if isinstance(value, str) and value else None
    return user_id.rsplit("_session_", 1)[1] if "_session_" in user_id else None


def _prefix_hash(messages: list[tuple[str, str]]) -> str:
    system = next((c for r, c in messages if r in _SYSTEM_ROLES), "")
    first_user = next((c for r, c in messages if r == "user"), "")
    if not system and not first_user:  # nothing stable to key on: a session of its own
        return f"anon-{uuid.uuid4().hex[:16]}"
    digest = hashlib.blake2b(f"{system}\0{first_user}".encode(), digest_size=8).hexdigest()
    return f"anon-{digest}"
