"""The EPP's HTTP side for operators, on its metrics address: Prometheus `/metrics`, `/status`
(boxes, their state and snapshot age, sessions per box, decisions per second) and
`/calls/{id}` (the router's explanation of one box pick), read by `talaria-ctl --epp`."""

from __future__ import annotations

import time

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from talariad.epp.boxpicker import BoxPicker
from talariad.httpserver import fastapi_app
from talariad.wire.decision import decision_json


def admin_app(picker: BoxPicker, registry: CollectorRegistry) -> FastAPI:
    app = fastapi_app(title="talariad epp", docs_url=None, redoc_url=None)

    @app.get("/status")
    async def status() -> JSONResponse:
        return JSONResponse({**picker.status(time.monotonic()), "refusals": refusals(registry)})

    @app.get("/calls/{call_id}")
    async def explain(call_id: str) -> JSONResponse:
        found = picker.explain(call_id)
        if found is None:
            msg = f"no decision for call {call_id!r} (unknown, or older than the log keeps)"
            return JSONResponse({"error": {"message": msg}}, status_code=404)
        # the daemon's admin message as JSON, so `call explain` reads a box pick as its own
        return JSONResponse(decision_json(found, time.monotonic()))

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def refusals(registry: CollectorRegistry) -> list[dict]:
    """The calls the picker answered itself, by status and code (`talaria_epp_refusals`), the
    most frequent first."""
    rows = [
        {"status": int(s.labels["status"]), "code": s.labels["code"], "count": int(s.value)}
        for family in registry.collect()
        if family.name == "talaria_epp_refusals"
        for s in family.samples
        if s.name.endswith("_total")
    ]
    return sorted(rows, key=lambda r: (-r["count"], r["status"], r["code"]))
