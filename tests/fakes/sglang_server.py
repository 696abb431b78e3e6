"""A faithful fake of the SGLang 0.5.23 HTTP server (Starlette + uvicorn): exactly the endpoints Talaria uses, with the
semantics of docs/sglang.md and the shared SGLang control-surface reference.

Started as a subprocess exactly as `python -m sglang.launch_server` would be (same flags; an
unknown flag exits 2 as argparse does), so a config's `sglang.launch_command` can point at it:

    [python, tests/fakes/sglang_server.py, --fake-log, FILE]

What it models, and how it "dies" (logs `died` and exits 1, as the real server does):
- `/generate` streams one SSE chunk per token (cumulative text) with `meta_info.cached_tokens`
  from a real radix prefix match over token ids; finished requests stay in the radix tree;
  duplicate `rid` and unknown `sampling_params` keys are 400s;
- `/pause_generation` modes: `abort` aborts everything, `retract` moves running requests back to
  the waiting queue, `in_place` leaves them running; while paused, new requests (health probes
  included) wait;
- `/release_memory_occupation` while anything runs (or waits, unless the engine is paused) dies;
  releasing a released tag dies; it flushes the radix tree (L3 storage survives);
- `/resume_memory_occupation` of a tag that is not released dies; with `--fake-gpu-state`, a resume
  that does not fit in the shared fake GPU's free memory dies (CUDA OOM in torch_memory_saver);
- a batch scheduled while memory is released and the server is not paused dies;
- `/v1/loads` reflects running and waiting requests; `/health` runs a 1-token generation.

Fake-only flags (never passed by the executor): `--fake-log FILE` (JSON lines of every control
request and violation), `--fake-gpu-state FILE` (shared fake GPU memory), `--fake-footprint-gib`,
`--fake-token-s` (seconds per decode step), `--fake-crash-file FILE` (exit 1 mid-stream once, when
the file exists; the file is removed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

if __package__:  # imported by the tests, as tests.fakes.sglang_server
    from .sglang_engine import GIB, SAMPLING_KEYS, VERSION, FakeSGLang, Req
else:  # run as a script (python tests/fakes/sglang_server.py): this folder is sys.path[0]
    from sglang_engine import GIB, SAMPLING_KEYS, VERSION, FakeSGLang, Req


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sglang.launch_server (fake)", allow_abbrev=False)
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--served-model-name")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--base-gpu-id", type=int, default=0)
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--max-total-tokens", type=int)
    p.add_argument("--api-key")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--enable-memory-saver", action="store_true")
    p.add_argument("--enable-weights-cpu-backup", action="store_true")
    p.add_argument("--enable-hierarchical-cache", "--enable-hicache", action="store_true")
    p.add_argument(
        "--hicache-storage-backend", choices=["file", "sim", "mooncake", "hf3fs", "nixl"]
    )
    p.add_argument("--fake-log")
    p.add_argument("--fake-gpu-state")
    p.add_argument("--fake-footprint-gib", type=float, default=1.0)
    p.add_argument("--fake-token-s", type=float, default=0.002)
    p.add_argument("--fake-crash-file")
    p.add_argument("--fake-startup-s", type=float, default=0.1)
    args = p.parse_args(argv)
    if args.hicache_storage_backend and not args.enable_hierarchical_cache:
        p.error("--hicache-storage-backend needs --enable-hierarchical-cache")
    return args


async def _body(request: Request) -> dict:
    # control endpoints need a JSON body, at least {} (reference §0.11)
    data = await request.json()
    return data if isinstance(data, dict) else {}


def _authorized(fake: FakeSGLang, request: Request) -> bool:
    open_path = request.url.path.startswith(("/health", "/ready", "/metrics"))
    key = fake.args.api_key
    return open_path or not key or request.headers.get("authorization") == f"Bearer {key}"


class Handlers:
    """The route handlers over one engine, one method per endpoint."""

    def __init__(self, fake: FakeSGLang):
        self.fake = fake

    def routes(self) -> list[Route]:
        return [
            Route("/health", self.health),
            Route("/health_generate", self.health),
            Route("/ready", self.ready),
            Route("/server_info", self.server_info),
            Route("/v1/loads", self.loads),
            Route("/generate", self.generate, methods=["POST", "PUT"]),
            Route("/pause_generation", self.pause_generation, methods=["POST"]),
            Route("/continue_generation", self.continue_generation, methods=["POST"]),
            Route("/release_memory_occupation", self.release, methods=["GET", "POST"]),
            Route("/resume_memory_occupation", self.resume, methods=["GET", "POST"]),
            Route("/abort_request", self.abort_request, methods=["POST"]),
            Route("/flush_cache", self.flush_cache, methods=["GET", "POST"]),
        ]

    # -- probes and info -------------------------------------------------------------------------

    async def health(self, request: Request):
        """A 1-token generation through the tokenizer manager, so it waits while paused."""
        fake = self.fake
        if not fake.up:
            return Response(status_code=503)
        req = Req(
            "HEALTH_CHECK_" + os.urandom(4).hex(),
            [0],
            {"max_new_tokens": 1, "temperature": 0},
            asyncio.Queue(),
            log_metrics=False,
        )
        try:
            await asyncio.wait_for(
                fake.submit(req), float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
            )
            await asyncio.wait_for(req.queue.get(), 20)
        except TimeoutError:
            return Response(status_code=503)
        return Response(status_code=200)

    async def ready(self, request: Request):
        return Response(status_code=200 if self.fake.up and not self.fake.is_pause else 503)

    async def server_info(self, request: Request):
        fake = self.fake
        gb = fake.footprint / GIB
        return JSONResponse(
            {
                "model_path": fake.args.model_path,
                "served_model_name": fake.name,
                "tp_size": fake.args.tp_size,
                "version": VERSION,
                "scheduler_info": {"max_total_num_tokens": fake.max_total},
                "internal_states": [
                    {
                        "memory_usage": {
                            "weight": gb / 2,
                            "kvcache": gb / 2,
                            "graph": {},
                            "token_capacity": fake.max_total,
                        }
                    }
                ],
            }
        )

    async def loads(self, request: Request):
        return JSONResponse(self.fake.loads())

    # -- generation ------------------------------------------------------------------------------

    async def generate(self, request: Request):
        """One JSON answer, or (with `stream`) one SSE chunk per token and then [DONE]."""
        fake = self.fake
        data = await _body(request)
        params = data.get("sampling_params") or {}
        unknown = sorted(set(params) - SAMPLING_KEYS)
        if unknown:
            return JSONResponse(
                {"error": {"message": f"unknown sampling_params: {unknown}"}}, status_code=400
            )
        ids = data.get("input_ids")
        if ids is None and isinstance(data.get("text"), str):
            ids = fake.tokenizer.encode(data["text"], add_special_tokens=False).ids
        if not ids:
            return JSONResponse(
                {"error": {"message": "input_ids or text required"}}, status_code=400
            )
        rid = data.get("rid") or os.urandom(16).hex()
        if rid in fake.rids:
            return JSONResponse(
                {"error": {"message": f"Duplicate request ID: {rid}"}}, status_code=400
            )
        fake.rids.add(rid)
        req = Req(rid, list(ids), params, asyncio.Queue())
        fake.log("generate", rid=rid, prompt_tokens=len(ids))
        await fake.submit(req)
        if not data.get("stream"):
            last = None
            while (chunk := await req.queue.get()) is not None:
                last = chunk
            return JSONResponse(last)

        async def events():
            while (chunk := await req.queue.get()) is not None:
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def abort_request(self, request: Request):
        fake = self.fake
        data = await _body(request)
        rid, everything = data.get("rid", ""), data.get("abort_all", False)
        for req in list(fake.running) + list(fake.waiting):
            if everything or (rid and req.rid.startswith(rid)):
                (fake.running if req in fake.running else fake.waiting).remove(req)
                fake._abort(req)
        return Response(status_code=200)

    # -- control: pause, memory, cache -----------------------------------------------------------

    async def pause_generation(self, request: Request):
        mode = (await _body(request)).get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            return JSONResponse({"error": {"message": f"invalid mode {mode!r}"}}, status_code=400)
        self.fake.log("pause_generation", mode=mode)
        self.fake.pause(mode)
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: Request):
        await _body(request)
        self.fake.log("continue_generation")
        self.fake.cont()
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    async def release(self, request: Request):
        tags = (await _body(request)).get("tags")
        self.fake.log("release_memory_occupation", tags=tags)
        self.fake.release(tags)
        return JSONResponse(None)

    async def resume(self, request: Request):
        tags = (await _body(request)).get("tags")
        self.fake.log("resume_memory_occupation", tags=tags)
        self.fake.resume(tags)
        return JSONResponse(None)

    async def flush_cache(self, request: Request):
        if not self.fake.idle():
            return PlainTextResponse(
                "Cache not flushed: there are running requests", status_code=400
            )
        self.fake.radix.reset()
        return PlainTextResponse("Cache flushed.")


def build_app(fake: FakeSGLang) -> Starlette:
    """Starlette (FastAPI's base, quick to import: the fake starts many times per test run)."""
    inner = Starlette(routes=Handlers(fake).routes())

    async def app(scope, receive, send):
        # checked before routing, so without the key even an unknown path answers 401
        if scope["type"] == "http" and not _authorized(fake, Request(scope)):
            await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
            return
        await inner(scope, receive, send)

    return app


async def main_async(args: argparse.Namespace) -> None:
    fake = FakeSGLang(args)
    if fake.gpu and not fake.gpu.set_used(str(args.port), fake.footprint, need_fit=True):
        fake.die("CUDA out of memory at startup")
    fake.log("start", argv=sys.argv[1:])
    config = uvicorn.Config(
        build_app(fake),
        host=args.host,
        port=args.port,
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    loop_task = asyncio.create_task(fake.loop())
    serve = asyncio.create_task(server.serve())
    await asyncio.sleep(args.fake_startup_s)  # model load
    fake.up = True
    done, _ = await asyncio.wait([serve, loop_task], return_when=asyncio.FIRST_COMPLETED)
    for task in done:
        task.result()
    fake.log("stop")
    if fake.gpu:
        fake.gpu.set_used(str(args.port), 0)


def main(argv: list[str] | None = None) -> None:
    asyncio.run(main_async(parse_args(argv)))


if __name__ == "__main__":
    main()
