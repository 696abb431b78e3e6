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
import fcntl
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from tokenizers import Tokenizer

VERSION = "0.5.23"
ALL_TAGS = ("kv_cache", "weights", "cuda_graph")
SAMPLING_KEYS = {
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "ignore_eos",
    "skip_special_tokens",
    "no_stop_trim",
    "sampling_seed",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "spaces_between_special_tokens",
    "stream_interval",
    "logit_bias",
    "custom_params",
    "beam_width",
    "watermark",
    "choice",
}
GIB = 1 << 30


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


class Radix:
    """Longest-prefix match over token ids (a trie; enough for the fake's sizes)."""

    def __init__(self):
        self.root: dict = {}

    def insert(self, ids: list[int]) -> None:
        node = self.root
        for t in ids:
            node = node.setdefault(t, {})

    def match(self, ids: list[int]) -> int:
        node, n = self.root, 0
        for t in ids:
            if t not in node:
                break
            node, n = node[t], n + 1
        return n

    def reset(self) -> None:
        self.root = {}


@dataclass
class Req:
    rid: str
    input_ids: list[int]
    params: dict
    queue: asyncio.Queue
    out: list[int] = field(default_factory=list)
    cached: int | None = None
    details: dict | None = None
    retractions: int = 0
    log_metrics: bool = True


class FakeGpu:
    """Shared fake GPU memory: a JSON file {"total_bytes": N, "used": {server: bytes}} under flock."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def _update(self, fn):
        with open(self.path, "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            state = json.load(f)
            result = fn(state)
            f.seek(0), f.truncate(), f.write(json.dumps(state)), f.flush()
            return result

    def set_used(self, server: str, nbytes: int, need_fit: bool = False) -> bool:
        def fn(state):
            others = sum(v for k, v in state["used"].items() if k != server)
            if need_fit and others + nbytes > state["total_bytes"]:
                return False
            state["used"][server] = nbytes
            return True

        return self._update(fn)

    def free_bytes(self) -> int:
        state = json.loads(self.path.read_text())
        return state["total_bytes"] - sum(state["used"].values())

    @staticmethod
    def create(path: str | os.PathLike, total_gib: float) -> FakeGpu:
        Path(path).write_text(json.dumps({"total_bytes": int(total_gib * GIB), "used": {}}))
        return FakeGpu(path)

    def set_total(self, total_gib: float) -> None:
        self._update(lambda s: s.__setitem__("total_bytes", int(total_gib * GIB)))


class FakeSGLang:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.name = args.served_model_name or args.model_path
        self.tokenizer = Tokenizer.from_file(str(Path(args.model_path) / "tokenizer.json"))
        self.vocab = self.tokenizer.get_vocab_size()
        self.specials = {
            self.tokenizer.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
        }
        self.radix, self.storage = Radix(), Radix()
        self.use_storage = bool(args.hicache_storage_backend)
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.rids: set[str] = set()
        self.is_pause = False  # tokenizer manager: new requests block
        self.engine_paused = False  # scheduler: retract / in_place
        self.offloaded: set[str] = set()
        self.unpaused = asyncio.Event()
        self.unpaused.set()
        self.wake = asyncio.Event()
        self.up = False
        self.gpu = FakeGpu(args.fake_gpu_state) if args.fake_gpu_state else None
        self.footprint = int(args.fake_footprint_gib * GIB)
        self.max_total = args.max_total_tokens or 16384

    # -- log and death -------------------------------------------------------------------------

    def log(self, event: str, **fields) -> None:
        if self.args.fake_log:
            line = json.dumps(
                {
                    "t": time.time(),
                    "port": self.args.port,
                    "model": self.name,
                    "event": event,
                    "running": len(self.running),
                    "waiting": len(self.waiting),
                    "paused": self.is_pause,
                    "offloaded": sorted(self.offloaded),
                    **fields,
                }
            )
            with open(self.args.fake_log, "a") as f:
                f.write(line + "\n")

    def die(self, why: str) -> None:
        self.log("died", why=why)
        print(f"fake sglang: {why}", file=sys.stderr, flush=True)
        os._exit(1)

    # -- the scheduler -------------------------------------------------------------------------

    async def loop(self) -> None:
        while True:
            if not (self.running or self.waiting) or self.engine_paused:
                self.wake.clear()
                await self.wake.wait()
                continue
            if self.offloaded:
                self.die(
                    "a batch ran over released memory (the server was not paused)"
                )  # reference §0.4
            while self.waiting:
                self._prefill(self.waiting.pop(0))
            await asyncio.sleep(self.args.fake_token_s)
            self._decode()

    def _prefill(self, req: Req) -> None:
        if req.cached is None:  # frozen after a retraction
            device = min(self.radix.match(req.input_ids), len(req.input_ids) - 1)
            storage = (
                min(self.storage.match(req.input_ids), len(req.input_ids) - 1)
                if self.use_storage
                else 0
            )
            req.cached = max(device, storage)
            if req.cached:
                req.details = {"device": device, "host": 0}
                if self.use_storage:
                    req.details |= {
                        "storage": max(0, storage - device),
                        "storage_backend": "HiCacheFile",
                    }
        self.radix.insert(req.input_ids)
        if self.use_storage:
            self.storage.insert(req.input_ids)
        self.running.append(req)

    def _decode(self) -> None:
        for req in list(self.running):
            if (
                self.args.fake_crash_file
                and os.path.exists(self.args.fake_crash_file)
                and req.log_metrics
            ):
                os.unlink(self.args.fake_crash_file)
                self.die("crash requested mid-stream (--fake-crash-file)")
            req.out.append(self._next_token(req))
            reason = self._finish_reason(req)
            req.queue.put_nowait(self._chunk(req, reason))
            if reason is not None:
                self._finish(req)

    def _next_token(self, req: Req) -> int:
        seed = req.params.get("sampling_seed", 0)
        h = hashlib.blake2b(repr((req.input_ids[-16:], len(req.out), seed)).encode(), digest_size=8)
        merged = (
            range(259, self.vocab) if self.vocab > 300 else range(self.vocab)
        )  # whole words, mostly
        tok = merged[int.from_bytes(h.digest(), "big") % len(merged)]
        while tok in self.specials:
            tok = (tok + 1) % self.vocab
        return tok

    def _finish_reason(self, req: Req) -> dict | None:
        text = self.tokenizer.decode(req.out)
        for stop in req.params.get("stop") or []:
            if stop and stop in text:
                return {"type": "stop", "matched": stop}
        if len(req.out) >= req.params.get("max_new_tokens", 128):
            return {"type": "length", "length": len(req.out)}
        return None

    def _text(self, req: Req, reason: dict | None) -> str:
        text = self.tokenizer.decode(req.out)
        if reason and reason["type"] == "stop" and not req.params.get("no_stop_trim"):
            text = text[: text.index(reason["matched"])]
        return text

    def _chunk(self, req: Req, reason: dict | None) -> dict:
        meta = {
            "id": req.rid,
            "finish_reason": reason,
            "prompt_tokens": len(req.input_ids),
            "completion_tokens": len(req.out),
            "cached_tokens": req.cached or 0,
            "weight_version": "default",
            "num_retractions": req.retractions,
        }
        if req.details:
            meta["cached_tokens_details"] = req.details
        return {"text": self._text(req, reason), "output_ids": list(req.out), "meta_info": meta}

    def _finish(self, req: Req) -> None:
        self.running.remove(req)
        self.rids.discard(req.rid)
        self.radix.insert(req.input_ids + req.out)
        if self.use_storage:
            self.storage.insert(req.input_ids + req.out)
        req.queue.put_nowait(None)

    def _abort(self, req: Req) -> None:
        reason = {
            "type": "abort",
            "message": "Abort before prefill" if req.cached is None else "Abort",
        }
        req.queue.put_nowait(self._chunk(req, reason))
        req.queue.put_nowait(None)
        self.rids.discard(req.rid)

    # -- requests ------------------------------------------------------------------------------

    async def submit(self, req: Req) -> None:
        """The tokenizer manager: block while paused, then hand the request to the scheduler."""
        while self.is_pause:
            await self.unpaused.wait()
        self.waiting.append(req)
        self.wake.set()

    def pause(self, mode: str) -> None:
        self.is_pause = True
        self.unpaused.clear()
        if mode == "abort":
            for req in self.running + self.waiting:
                self._abort(req)
            self.running, self.waiting = [], []
        elif mode == "retract":
            for req in self.running:
                req.retractions += 1
            self.waiting = self.running + self.waiting
            self.running = []
            self.engine_paused = True
        else:
            self.engine_paused = True
        self.wake.set()

    def cont(self) -> None:
        self.is_pause = self.engine_paused = False
        self.unpaused.set()
        self.wake.set()

    def idle(self) -> bool:
        """Scheduler.is_fully_idle(ignore_waiting=engine_paused)."""
        return not self.running and (self.engine_paused or not self.waiting)

    def release(self, tags: list[str] | None) -> None:
        tags = list(tags or ALL_TAGS)
        if not self.idle():
            self.die("release_memory_occupation should be called only when server is idle")
        if any(t in self.offloaded for t in tags):
            self.die("Cannot pause allocation that is not active (torch_memory_saver exit(1))")
        if self.args.enable_memory_saver:
            self.offloaded |= set(tags)
            if self.gpu and set(ALL_TAGS) <= self.offloaded:
                self.gpu.set_used(str(self.args.port), 0)
        if "kv_cache" in tags:
            self.radix.reset()  # flush_cache: device tree and HiCache host tier; L3 storage survives

    def resume(self, tags: list[str] | None) -> None:
        tags = list(tags or ALL_TAGS)
        if not self.args.enable_memory_saver:
            return
        if any(t not in self.offloaded for t in tags):
            self.die("KeyError: resume of a tag that was not released")
        if self.gpu and not self.gpu.set_used(str(self.args.port), self.footprint, need_fit=True):
            self.die(
                "CUDA out of memory in cu_mem_create during resume (torch_memory_saver exit(1))"
            )
        self.offloaded -= set(tags)

    def loads(self) -> dict:
        used = sum(len(r.input_ids) + len(r.out) for r in self.running)
        load = {
            "dp_rank": 0,
            "num_running_reqs": len(self.running),
            "num_waiting_reqs": len(self.waiting),
            "num_used_tokens": used,
            "max_total_num_tokens": self.max_total,
            "token_usage": used / self.max_total,
            "num_total_tokens": self.max_total,
            "memory": {
                "weight_gb": self.footprint / 2 / GIB,
                "kv_cache_gb": self.footprint / 2 / GIB,
                "graph_gb": 0.0,
                "token_capacity": self.max_total,
            },
            "queues": {"waiting": len(self.waiting), "paused": 0, "retracted": 0},
        }
        return {
            "timestamp": time.time(),
            "version": VERSION,
            "accelerator": "cuda",
            "num_accelerators": self.args.tp_size,
            "loads": [load],
        }


def build_app(fake: FakeSGLang) -> Starlette:
    """Starlette (FastAPI's base, quick to import: the fake starts many times per test run)."""

    async def body(request: Request) -> dict:
        data = (
            await request.json()
        )  # control endpoints need a JSON body, at least {} (reference §0.11)
        return data if isinstance(data, dict) else {}

    def authorized(request: Request) -> bool:
        open_path = request.url.path.startswith(("/health", "/ready", "/metrics"))
        key = fake.args.api_key
        return open_path or not key or request.headers.get("authorization") == f"Bearer {key}"

    async def health(request: Request):
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

    async def ready(request: Request):
        return Response(status_code=200 if fake.up and not fake.is_pause else 503)

    async def server_info(request: Request):
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

    async def loads(request: Request):
        return JSONResponse(fake.loads())

    async def generate(request: Request):
        data = await body(request)
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

    async def pause_generation(request: Request):
        mode = (await body(request)).get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            return JSONResponse({"error": {"message": f"invalid mode {mode!r}"}}, status_code=400)
        fake.log("pause_generation", mode=mode)
        fake.pause(mode)
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(request: Request):
        await body(request)
        fake.log("continue_generation")
        fake.cont()
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    async def release(request: Request):
        tags = (await body(request)).get("tags")
        fake.log("release_memory_occupation", tags=tags)
        fake.release(tags)
        return JSONResponse(None)

    async def resume(request: Request):
        tags = (await body(request)).get("tags")
        fake.log("resume_memory_occupation", tags=tags)
        fake.resume(tags)
        return JSONResponse(None)

    async def abort_request(request: Request):
        data = await body(request)
        rid, everything = data.get("rid", ""), data.get("abort_all", False)
        for req in list(fake.running) + list(fake.waiting):
            if everything or (rid and req.rid.startswith(rid)):
                (fake.running if req in fake.running else fake.waiting).remove(req)
                fake._abort(req)
        return Response(status_code=200)

    async def flush_cache(request: Request):
        if not fake.idle():
            return PlainTextResponse(
                "Cache not flushed: there are running requests", status_code=400
            )
        fake.radix.reset()
        return PlainTextResponse("Cache flushed.")

    routes = [
        Route("/health", health),
        Route("/health_generate", health),
        Route("/ready", ready),
        Route("/server_info", server_info),
        Route("/v1/loads", loads),
        Route("/generate", generate, methods=["POST", "PUT"]),
        Route("/pause_generation", pause_generation, methods=["POST"]),
        Route("/continue_generation", continue_generation, methods=["POST"]),
        Route("/release_memory_occupation", release, methods=["GET", "POST"]),
        Route("/resume_memory_occupation", resume, methods=["GET", "POST"]),
        Route("/abort_request", abort_request, methods=["POST"]),
        Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
    ]

    async def app(scope, receive, send):
        if scope["type"] == "http" and not authorized(Request(scope)):
            await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
            return
        await inner(scope, receive, send)

    inner = Starlette(routes=routes)
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
