"""The fake SGLang server's engine: the tokenizer manager and scheduler state machine behind the
HTTP routes of sglang_server.py (radix prefix cache, pause modes, memory release and resume, the
ways a real server dies), and the shared fake GPU memory the tests also drive directly.

No HTTP here; see sglang_server.py's docstring for what is modelled and the fake-only flags.
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
    """One server's engine: the tokenizer manager's pause gate and the scheduler's queues."""

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
