"""The `sim` executor: the shared `sim` cost and memory model (`talariad.sim.model.SimModel`) in
real time, emitting deterministic placeholder text.

It tokenizes by words and punctuation (so prefix reuse is measurable on real chat text), sleeps
what the model charges for each step (scaled by the instance's `time_scale`), and generates words
chosen by a hash of the prompt so the same call always yields the same answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Awaitable, Callable

from talariad.engine.executors.base import common_prefix
from talariad.engine.messages import GenerateRequest
from talariad.instance import CallOutput, InstanceCall, KVUpdate, MemoryStats, StepPlan, StepResult
from talariad.sim.model import SimModel

_TOKEN = re.compile(r"\w+|[^\w\s]")
_WORDS = (
    "the agent reads the file and runs the test then edits the function to fix the bug "
    "before it checks the output again with a smaller patch"
).split()


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text)


def render(messages: list[tuple[str, str]]) -> str:
    """The sim chat template: one `<|role|> content` block per message, then the assistant turn."""
    return "".join(f"<|{role}|> {content}\n" for role, content in messages) + "<|assistant|>"


def placeholder_words(prompt_tokens: list[str], n: int, seed: int | None) -> list[str]:
    digest = hashlib.blake2b(" ".join(prompt_tokens[-64:]).encode(), digest_size=8)
    digest.update(str(seed).encode())
    state = int.from_bytes(digest.digest(), "big")
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
        text = (
            req.prompt
            if req.prompt is not None
            else render([(m.role, m.content) for m in req.messages])
        )
        return tokenize(text)

    def reusable(self, session: str, model: str, prompt: list) -> int:
        return common_prefix(self.contexts.get((session, model), []), prompt)

    def remember(self, call: InstanceCall) -> KVUpdate | None:
        self.contexts[(call.session_id, call.model)] = call.prompt + tokenize("".join(call.out))
        return None

    def release(self, call: InstanceCall) -> None:
        """Nothing is held per call."""

    def memory(self) -> MemoryStats:
        return self.model.memory()

    def memory_report(self, last: int = 50) -> dict:
        """No managed layout to show: the sim model keeps bytes, not regions."""
        return {}

    async def run(self, plan: StepPlan) -> StepResult:
        seconds = self.model.begin(plan, self._now())
        await self.sleep(seconds * self.time_scale)
        result = self.model.end(plan, self._now())
        if result.switch_path is not None:
            return result
        words = {cid: self._next_word(call) for cid, call in plan.calls.items()}  # one word each
        return StepResult(calls={cid: CallOutput(text=w) for cid, w in words.items()},
                          kv_updates=result.kv_updates)

    def _next_word(self, call: InstanceCall) -> str:
        if call.state is None:
            call.state = placeholder_words(call.prompt, call.max_tokens, call.request.seed)
        word = call.state[call.generated % len(call.state)]
        return (" " if call.generated else "") + word
