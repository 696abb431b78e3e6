"""What every request handler of the gateway reads: the config, the instance directory, the
router's shell, readiness, metrics and the Responses store."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from talariad.calls.errors import APIError
from talariad.calls.store import ResponseStore
from talariad.config import ModelConfig, TalariaConfig
from talariad.gateway.health import Availability
from talariad.gateway.instances import InstanceDirectory
from talariad.gateway.metrics import GatewayMetrics
from talariad.gateway.pool import PoolEndpoint
from talariad.gateway.routing import RouterShell
from talariad.wire.client import InstanceUnreachable

log = logging.getLogger("talariad.gateway")


class Gateway:
    """Everything a request handler needs; the daemon builds one and the tests can too."""

    def __init__(
        self,
        cfg: TalariaConfig,
        directory: InstanceDirectory,
        routing: RouterShell,
        ready: Callable[[str], bool],
        describe: Callable[[], list[dict]] | None = None,
    ):
        self.cfg, self.directory, self.routing, self.ready = cfg, directory, routing, ready
        self.describe = describe or (
            lambda: [{"name": i.name, "ready": ready(i.name)} for i in cfg.instances]
        )
        """Each instance's state and telemetry age, for /health and /ready."""
        self.api_keys: frozenset[str] | None = None
        """When set, every /v1/ call needs one of these keys."""
        self.availability: Callable[[str], Availability] = lambda model: Availability(
            [i.name for i in cfg.instances if model in i.models and ready(i.name)], []
        )
        """Which instances take a model's new calls now (the daemon's view replaces this one)."""
        self.pool = PoolEndpoint(
            None, cfg.pool.max_sessions_per_instance, cfg.limits.max_connections
        )
        """`GET /pool/snapshot` for the pool's endpoint picker (no token: not served)."""
        self.metrics = GatewayMetrics()
        self.stored = ResponseStore(cfg.responses.store_max)
        self._dropped_logged: set[str] = set()
        self._forgetting: set[asyncio.Task] = set()
        routing.evicted = self.forget_soon
        routing.merged = self.pool.merged

    def forget_soon(self, branch: str) -> None:
        """Drop an evicted branch's context on every instance, in a task of its own (the call
        that evicted it does not wait); without a running loop there is no instance to ask."""
        try:
            task = asyncio.get_running_loop().create_task(self._forget(branch))
        except RuntimeError:
            return
        self._forgetting.add(task)
        task.add_done_callback(self._forgetting.discard)

    async def _forget(self, branch: str) -> None:
        client = self.directory.client
        for name, url in client.urls().items():
            if url is None:
                continue
            try:
                await client.forget(name, branch)
            except InstanceUnreachable as err:  # it restarts without the branch, or is gone
                log.debug("could not forget branch %s on %s: %s", branch, name, err)

    @staticmethod
    def clock() -> float:
        return time.monotonic()

    def served(self, model: str) -> bool:
        """Some instance serves `model` now (run-time unloads and pool moves count)."""
        for i in self.cfg.instances:
            snap = self.directory.snapshot(i.name)
            if model in (snap.models if snap is not None else i.models):
                return True
        return False

    def residency(self, model: str) -> str:
        snaps = [
            s
            for i in self.cfg.instances
            if (s := self.directory.snapshot(i.name)) is not None and model in s.models
        ]
        if any(s and s.active_model == model for s in snaps):
            return "loaded"
        return "parked" if any(s and model in s.opened_models for s in snaps) else "cold"

    def resolve(self, requested: str, api: str) -> ModelConfig:
        """The model serving a requested id (a name or alias; Anthropic calls may fall back to the
        configured default model)."""
        found = self.cfg.resolve_model(requested)
        if found is None and api == "anthropic" and self.cfg.anthropic.default_model:
            found = self.cfg.resolve_model(self.cfg.anthropic.default_model)
        if found is None:
            raise APIError(
                404,
                f"The model {requested!r} does not exist",
                type="not_found_error",
                param="model",
                code="model_not_found",
            )
        return found

    def log_dropped(self, session: str, dropped: list[str]) -> None:
        """Tools that cannot run here were dropped from the prompt: say so once per session."""
        if dropped and session not in self._dropped_logged:
            if (
                len(self._dropped_logged) > 10_000
            ):  # bounded: a long-running daemon sees many sessions
                self._dropped_logged.clear()
            self._dropped_logged.add(session)
            log.info(
                "session %s: dropped hosted tools that cannot run locally: %s",
                session,
                ", ".join(sorted(set(dropped))),
            )
