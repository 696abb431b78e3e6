"""The internal HTTP API an instance serves to the gateway (loopback only).

Every request must carry the instance's per-start token (`x-talaria-token`): the port is reachable
by any local user, the token only by the daemon that read it from the instance's ready line.
"""

from __future__ import annotations

import hmac

from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from talariad.engine.worker import ROUNDS_LIMIT, Worker
from talariad.httpserver import fastapi_app
from talariad.procstats import process_stats
from talariad.wire.messages import GenerateRequest, Telemetry

TOKEN_HEADER = "x-talaria-token"


class RotationChange(BaseModel):
    model: str
    serve: bool


class Forget(BaseModel):
    session_id: str


class TokenCheck:
    """Refuse (401) every request whose token header is not `token`."""

    def __init__(self, app, token: str):
        self.app, self.token = app, token.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            given = next((v for k, v in scope["headers"] if k == TOKEN_HEADER.encode()), b"")
            if not hmac.compare_digest(given, self.token):
                resp = JSONResponse({"error": "missing or wrong internal token"}, status_code=401)
                return await resp(scope, receive, send)
        await self.app(scope, receive, send)


def build_app(worker: Worker, token: str | None = None) -> FastAPI:
    """`token`: required on every request when given (the instance process always gives one)."""
    app = fastapi_app(title=f"talaria instance {worker.inst.name}", docs_url=None, redoc_url=None)
    if token is not None:
        app.add_middleware(TokenCheck, token=token)
    _report_routes(app, worker)
    _action_routes(app, worker)
    return app


def _report_routes(app: FastAPI, worker: Worker) -> None:
    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "instance": worker.inst.name}

    @app.get("/internal/telemetry")
    async def telemetry(since: int | None = None) -> Telemetry:
        """`since`: the `sessions_epoch` of the caller's last snapshot (sessions as changes)."""
        return worker.telemetry_since(since)

    @app.get("/internal/memory")
    async def memory() -> dict:
        """HBM layout rows and switch records of an executor that owns a memory substrate."""
        return worker.memory_report()

    @app.get("/internal/process")
    async def process() -> dict:
        """What the process holds (RSS, descriptors, tasks, tracked objects): read on demand,
        since counting tracked objects walks the heap."""
        return process_stats()

    @app.post("/internal/count_tokens")
    async def count_tokens(req: GenerateRequest) -> JSONResponse:
        """The rendered prompt's length, as a call would be tokenized here."""
        try:
            return JSONResponse({"input_tokens": worker.count_tokens(req)})
        except ValueError as err:
            return JSONResponse({"error": str(err)}, status_code=400)

    @app.get("/internal/rounds")
    async def rounds(limit: int = Query(ROUNDS_LIMIT, ge=1, le=4096)) -> dict:
        """The latest round records (with per-slot phases) and switch records."""
        return worker.rounds(limit)


def _action_routes(app: FastAPI, worker: Worker) -> None:
    @app.post("/internal/rotation")
    async def rotation(change: RotationChange) -> JSONResponse:
        """Load or unload a configured model at run time; 409 with the reason when it cannot."""
        why = worker.set_rotation(change.model, change.serve)
        return JSONResponse(
            {"rotation": worker.core.models, "error": why}, status_code=409 if why else 200
        )

    @app.post("/internal/forget")
    async def forget(body: Forget) -> dict:
        return {"freed": worker.core.forget(body.session_id)}

    @app.post("/internal/abort")
    async def abort() -> dict:
        """End every live call with an error event (the daemon's shutdown grace ran out)."""
        return {
            "aborted": worker.abort_all(
                "talariad is shutting down: the call did not finish "
                "within supervisor.shutdown_grace_s"
            )
        }
