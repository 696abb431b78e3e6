"""The `sim` executor: a performance model of an instance that emits deterministic placeholder text.

It tokenizes by words and punctuation (so prefix reuse is measurable on real chat text), waits what
the simulator's cost function charges for each action (`talariad.sim.costs`, scaled by the
instance's `time_scale`), and
generates words chosen by a hash of the prompt so the same call always yields the same answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import re

from talariad.cold_sched import Action, Switch
from talariad.engine.executors.base import LiveCall, StepResult, common_prefix
from talariad.engine.messages import GenerateRequest
from talariad.sim.costs import action_seconds
from talariad.types import LatencyProfile

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
    def __init__(self, profiles: dict[str, LatencyProfile], time_scale: float = 1.0):
        self.profiles, self.time_scale = profiles, time_scale
        self.contexts: dict[tuple[str, str], list[str]] = {}
        self.opened: set[str] = set()

    def encode(self, req: GenerateRequest) -> list[str]:
        text = req.prompt if req.prompt is not None else render([(m.role, m.content) for m in req.messages])
        return tokenize(text)

    def reusable(self, session: str, model: str, prompt: list) -> int:
        return common_prefix(self.contexts.get((session, model), []), prompt)

    def remember(self, session: str, model: str, call: LiveCall) -> None:
        self.contexts[(session, model)] = call.prompt + tokenize("".join(call.out))

    async def run(self, action: Action, calls: dict[str, LiveCall]) -> StepResult:
        first_open = isinstance(action, Switch) and action.to_model not in self.opened
        await self._wait(action_seconds(action, self.profiles, first_open=first_open))
        if isinstance(action, Switch):
            self.opened.add(action.to_model)
            return StepResult(path=action.path)
        ids = action.call_ids
        return StepResult(text={cid: self._next_word(calls[cid]) for cid in ids if cid in calls})

    def _next_word(self, call: LiveCall) -> str:
        if call.state is None:
            call.state = placeholder_words(call.prompt, call.req.max_tokens, call.req.seed)
        word = call.state[len(call.out) % len(call.state)]
        return (" " if call.out else "") + word

    async def _wait(self, seconds: float) -> None:
        await asyncio.sleep(seconds * self.time_scale)
