"""The internal HTTP API an instance serves to the gateway (loopback only)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from talariad.engine.messages import GenerateRequest, Telemetry
from talariad.engine.worker import Worker


def build_app(worker: Worker) -> FastAPI:
    app = FastAPI(title=f"talaria instance {worker.inst.name}", docs_url=None, redoc_url=None)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "instance": worker.inst.name}

    @app.get("/internal/telemetry")
    async def telemetry() -> Telemetry:
        return worker.telemetry()

    @app.get("/internal/memory")
    async def memory() -> dict:
        """HBM layout rows and switch records of an executor that owns a memory substrate."""
        report = getattr(worker.executor, "memory_report", None)
        return {"instance": worker.inst.name, **(report() if report is not None else {})}

    @app.post("/internal/generate")
    async def generate(req: GenerateRequest) -> StreamingResponse:
        async def lines():
            async for event in worker.generate(req):
                yield event.model_dump_json() + "\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    return app
