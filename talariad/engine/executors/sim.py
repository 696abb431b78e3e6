"""The `sim` executor: a performance model of an instance that emits deterministic placeholder text.

It tokenizes by words and punctuation (so prefix reuse is measurable on real chat text), charges
the latency profile's prefill/decode/restore/switch times, and generates words chosen by a hash of
the prompt so the same call always yields the same answer.
"""

from __future__ import annotations

import hashlib
import re

from talariad.types import LatencyProfile, SwitchPath

_TOKEN = re.compile(r"\w+|[^\w\s]")
_WORDS = (
    "the agent reads the file and runs the test then edits the function to fix the bug "
    "before it checks the output again with a smaller patch"
).split()

PROFILES: dict[str, LatencyProfile] = {
    # A small CPU-sized model: fast enough for interactive use and tests.
    "tiny": LatencyProfile(
        prefill_base_s=0.002,
        prefill_s_per_token=2e-5,
        decode_step_s=0.004,
        restore_s_per_token=2e-6,
        switch_s={SwitchPath.D2D: 0.01, SwitchPath.PARTIAL: 0.05, SwitchPath.H2D: 0.1},
        open_s=0.2,
    ),
}


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


def common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
