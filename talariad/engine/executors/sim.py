"""The `sim` executor: the shared `sim` cost and memory model (`talariad.perfmodel.model.SimModel`) in
real time, emitting deterministic placeholder text.

It tokenizes by words and punctuation, sleeps what the model charges for each step (scaled by the
instance's `time_scale`) and generates words chosen by a hash of the prompt and seed, so the same
call always yields the same answer. It ends its turn like a real model: the answer's length is
drawn from `OUTPUT_TOKENS` (unless `ignore_eos`), capped by `max_tokens`; a client stop string
ends it earlier. Design: docs/internals.md.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import re
import time
from collections.abc import Awaitable, Callable

import numpy as np

from talariad.calls import template
from talariad.engine.executors.base import common_prefix
from talariad.instance import (
    CallOutput,
    InstanceCall,
    KVLocation,
    MemoryStats,
    StepPlan,
    StepResult,
)
from talariad.perfmodel.dists import OUTPUT_TOKENS
from talariad.perfmodel.model import SimModel
from talariad.types import KVState
from talariad.wire.messages import GenerateRequest, ToolCall

_TOKEN = re.compile(r"\w+|[^\w\s]")
_WORDS = (
    "the agent reads the file and runs the test then edits the function to fix the bug "
    "before it checks the output again with a smaller patch"
).split()


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text)


def render_request(req: GenerateRequest) -> str:
    """The sim chat template (`calls.template`): one `<|tools|>` line of JSON per tool, one
    `<|role|> content` line per message, tool calls as `<tool_call>` JSON after the assistant's
    text (tool results are `<|tool|>` messages), then the open assistant turn."""
    return (
        "".join(template.lines(req.messages, req.tools, _tool_json, _call_json)) + "<|assistant|>"
    )


def _tool_json(tool: dict) -> str:
    return json.dumps(tool, ensure_ascii=False)


def _call_json(c: ToolCall) -> str:
    return f"<tool_call>{json.dumps({'name': c.name, 'arguments': c.arguments})}</tool_call>"


def _prompt_state(prompt_tokens: list[str], seed: int | None) -> int:
    digest = hashlib.blake2b(" ".join(prompt_tokens[-64:]).encode(), digest_size=8)
    digest.update(str(seed).encode())
    return int.from_bytes(digest.digest(), "big")


def answer_length(prompt_tokens: list[str], seed: int | None) -> int:
    """How many tokens this call's answer has before the model ends its turn (deterministic)."""
    return _sampled_length(_prompt_state(prompt_tokens, seed))


@functools.lru_cache(maxsize=4096)
def _sampled_length(state: int) -> int:
    """A numpy generator costs tens of microseconds to seed: a prompt seen again (a retry, a
    replayed trace, a benchmark) is answered from the cache."""
    return OUTPUT_TOKENS.sample_int(np.random.default_rng(state))


def placeholder_words(prompt_tokens: list[str], n: int, seed: int | None) -> list[str]:
    state = _prompt_state(prompt_tokens, seed)
    words = []
    for _ in range(n):
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        words.append(_WORDS[(state >> 33) % len(_WORDS)])
    return words


class SimExecutor:
    def __init__(
        self,
        model: SimModel,
        time_scale: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        """clock/sleep: the real ones in an instance process, a fake pair in tests."""
        self.model, self.time_scale = model, time_scale
        self.clock, self.sleep = clock, sleep
        self._t0 = clock()
        self.contexts: dict[tuple[str, str], list[str]] = {}
        self.kv_capacity_tokens = model.kv_capacity_tokens

    def _now(self) -> float:
        """The model's clock: modelled seconds since start (real seconds / time_scale)."""
        return (self.clock() - self._t0) / self.time_scale

    def encode(self, request: GenerateRequest) -> list[str]:
        req = request
        return tokenize(req.prompt if req.prompt is not None else render_request(req))

    def reusable(self, session: str, model: str, prompt: list) -> int:
        return common_prefix(self.contexts.get((session, model), []), prompt)

    def remember(self, call: InstanceCall) -> KVLocation | None:
        self.contexts[(call.session_id, call.model)] = call.prompt + tokenize("".join(call.out))
        return None

    def release(self, call: InstanceCall) -> None:
        """Nothing is held per call."""

    def forget(self, session: str) -> bool:
        """Drop the session's stored contexts (the sim's stand-in for its KV); True if any."""
        keys = [k for k in self.contexts if k[0] == session]
        for key in keys:
            del self.contexts[key]
        return bool(keys)

    def load(self, model: str) -> None:
        self.model.load(model)

    def unload(self, model: str) -> None:
        self.model.unload(model)

    def memory(self) -> MemoryStats:
        return self.model.memory()

    def memory_report(self, last: int = 50) -> dict:
        """No managed layout to show: the sim model keeps bytes, not regions."""
        return {}

    async def start(self) -> None:
        """Nothing to bring up: the model is bytes and seconds in this process."""

    async def aclose(self) -> None:
        """Nothing to stop (see `start`)."""

    async def run(self, plan: StepPlan) -> StepResult:
        seconds = self.model.begin(plan, self._now())
        await self.sleep(seconds * self.time_scale)
        result = self.model.end(plan, self._now())
        for update in result.kv_updates:  # a prefix the model lost: its context goes with it
            if update.state is KVState.MISSING:
                self.contexts.pop((update.session_id, update.model), None)
        if result.switch_path is not None:
            return result
        outs = {cid: self._next_word(call) for cid, call in plan.calls.items()}  # one word each
        return StepResult(calls=outs, kv_updates=result.kv_updates)

    def _next_word(self, call: InstanceCall) -> CallOutput:
        if call.state is None:
            n = call.max_tokens
            if not call.request.ignore_eos and n > 1:  # an answer has at least one token
                n = min(n, answer_length(call.prompt, call.request.seed))
            call.state = placeholder_words(call.prompt, n, call.request.seed)
        words = call.state
        piece = (" " if call.generated else "") + words[call.generated % len(words)]
        done = "".join(call.out)
        for stop in call.request.stop:
            at = (done + piece).find(stop, max(0, len(done) - len(stop) + 1)) if stop else -1
            if at >= 0:  # the stop string ends the answer; it is not part of it
                return CallOutput(
                    text=(done + piece)[len(done) : max(at, len(done))],
                    finish_reason="stop",
                    stop_sequence=stop,
                )
        if call.generated + 1 >= len(words) and len(words) < call.max_tokens:
            return CallOutput(
                text=piece, finish_reason="stop"
            )  # the answer is complete: end the turn
        return CallOutput(text=piece)
