"""The box's snapshot for the pool's endpoint picker: `GET /pool/snapshot`, behind a bearer
token of its own (`pool.token_file`). It publishes what the gateway already holds (the
directory's latest telemetry, the router shell's merged session views, the router's profiles):
no second poller. Design: docs/pool.md."""

from __future__ import annotations

import hmac
import pathlib
from typing import TYPE_CHECKING

from talariad.gateway.errors import APIError
from talariad.types import KVState
from talariad.wire.box import BoxInstance, BoxModel, BoxSnapshot, ProfileFacts

if TYPE_CHECKING:
    from talariad.gateway.gateway import Gateway

_KV_RANK = {KVState.DEVICE: 0, KVState.HOST: 1, KVState.MISSING: 2}


def load_token(path: pathlib.Path) -> str:
    """The token on the first non-blank line of `path`; ValueError with one line if none."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        why = getattr(err, "strerror", None) or err
        raise ValueError(f"pool.token_file: cannot read {path}: {why}") from None
    token = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if not token:
        raise ValueError(f"pool.token_file: {path} holds no token")
    return token


class PoolEndpoint:
    """The token that guards the snapshot (None: no pool, the endpoint is not there) and the
    snapshot's version counter."""

    def __init__(self, token: str | None = None, max_sessions: int = 20_000) -> None:
        self.token, self.max_sessions, self.version = token, max_sessions, 0

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

    def snapshot(self, gw: Gateway, now: float) -> BoxSnapshot:
        """Every configured instance with telemetry, and every model with its profile now."""
        self.version += 1
        profiles = gw.routing.router.profiles()
        models = [
            BoxModel(
                name=m.name,
                aliases=list(m.aliases),
                default_max_tokens=m.default_max_tokens,
                profile=ProfileFacts.of(profiles[m.name]) if m.name in profiles else ProfileFacts(),
            )
            for m in gw.cfg.models
        ]
        return BoxSnapshot(
            version=self.version,
            instances=[i for c in gw.cfg.instances if (i := self._instance(gw, c.name, now))],
            models=models,
        )

    def _instance(self, gw: Gateway, name: str, now: float) -> BoxInstance | None:
        t = gw.directory.snapshot(name)
        if t is None:
            return None
        view = list(gw.routing.session_view(name).values())
        cut = len(view) > self.max_sessions
        if cut:  # what the picker gains most from: prefixes on a device, then the longest
            view = sorted(view, key=lambda s: (_KV_RANK[s.state], -s.kv_len))[: self.max_sessions]
        whole = t.model_copy(
            update={"sessions": view, "sessions_base": None, "sessions_removed": [], "rounds": []}
        )
        return BoxInstance(
            name=name,
            healthy=gw.ready(name),
            age_s=max(gw.directory.age_s(name, now), 0.0),
            telemetry=whole,
            sessions_truncated=cut,
        )
