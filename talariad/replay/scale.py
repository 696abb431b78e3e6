"""A trace scaled down to small models, and the real chat bodies of its calls.

Scaling keeps a trace's structure (sessions, call order, models, capped gaps) and divides prompt
growth by `factor` and outputs by `output_scale`; sizes count words and punctuation marks.
`Conversation` builds each call's messages so that the previous prompt plus the server's answer
is really a prefix of the next prompt, as an agent's resent history is. Design:
docs/internals.md.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from talariad.replay.generate import characterization, fixed_replay
from talariad.replay.trace import Trace, TraceCall, read_jsonl

GENERATORS = ("fixed", "characterization")

_TOKEN = re.compile(r"\w+|[^\w\s]")
_VOCAB = (
    "def return self import class test assert value file path error patch diff line module function "
    "config parse output input list dict index token cache model session call result check update "
    "branch commit build run fix bug issue trace stack frame args kwargs none true false raise try "
    "except finally yield async await loop queue batch shape tensor array column row table field"
).split()


def count_tokens(text: str) -> int:
    """Size of a text in the unit scaling uses: words and punctuation marks."""
    return len(_TOKEN.findall(text))


@dataclass(frozen=True, slots=True)
class ScaledCall:
    """One call of a scaled trace, ready to be turned into a chat body."""

    session_id: str
    call_idx: int
    trace_model: str
    model: str  # the daemon's model serving it
    new_tokens: int  # call 0: the whole prompt; else the appended suffix
    reuse: float  # share of the previous prompt + answer the trace says is reused (1.0 = all)
    max_tokens: int
    gap_s: float  # after the previous response, capped; 0 for call 0


ScaledSession = list[ScaledCall]


def load_trace(spec: str, seed: int = 0, sessions: int | None = None) -> Trace:
    """A trace file, or a generator by name; the first `sessions` sessions of it."""
    if sessions is not None and sessions < 1:
        raise ValueError(f"--sessions must be >= 1, got {sessions}")
    if spec in GENERATORS:
        trace = fixed_replay(seed) if spec == "fixed" else characterization(sessions or 445, seed)
    else:
        trace = read_jsonl(spec)
    return Trace(trace.sessions[:sessions])


def parse_model_map(items: list[str] | None) -> dict[str, str]:
    """`TRACE=SERVED` pairs as a dict."""
    bad = [kv for kv in items or [] if "=" not in kv]
    if bad:
        raise ValueError(f"--model-map: expected TRACE=SERVED, got {bad[0]!r}")
    return dict(kv.split("=", 1) for kv in items or [])


def map_models(
    trace_models: Sequence[str], served: Sequence[str], explicit: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Trace model -> served model: explicit pairs first, the rest round-robin over `served`."""
    explicit = dict(explicit or {})
    unknown = sorted(set(explicit.values()) - set(served))
    if unknown:
        raise ValueError(
            f"--model-map: the server has no model {unknown[0]!r} (it serves {list(served)})"
        )
    if not served:
        raise ValueError("the server lists no models")
    rest = [m for m in trace_models if m not in explicit]
    return {**{m: served[i % len(served)] for i, m in enumerate(rest)}, **explicit}


def scale_trace(
    trace: Trace,
    models: Mapping[str, str],
    factor: float,
    output_scale: float = 1.0,
    gap_cap_s: float | None = 10.0,
    max_calls: int | None = None,
) -> list[ScaledSession]:
    """Every session of `trace`, prompts divided by `factor`, outputs by `output_scale`."""
    if factor <= 0 or output_scale <= 0:
        raise ValueError(f"--scale and --output-scale must be > 0, got {factor} and {output_scale}")
    if max_calls is not None and max_calls < 1:
        raise ValueError(f"--max-calls must be >= 1, got {max_calls}")
    return [_scale_session(s[:max_calls], models, factor, output_scale, gap_cap_s) for s in trace]


def _scale_session(
    calls: list[TraceCall],
    models: Mapping[str, str],
    factor: float,
    output_scale: float,
    gap_cap_s: float | None,
) -> ScaledSession:
    out, prev = [], None
    for c in calls:
        growth = (
            c.prompt_tokens
            if prev is None
            else c.prompt_tokens - (prev.prompt_tokens + prev.output_tokens)
        )
        reuse = (
            1.0
            if prev is None
            else min(1.0, c.prefix_tokens / max(1, prev.prompt_tokens + prev.output_tokens))
        )
        gap = c.gap_s if gap_cap_s is None else min(c.gap_s, gap_cap_s)
        out.append(
            ScaledCall(
                c.session_id,
                c.call_idx,
                c.model,
                models[c.model],
                max(1, round(growth / factor)),
                reuse,
                max(1, math.ceil(c.output_tokens / output_scale)),
                gap,
            )
        )
        prev = c
    return out


def filler(rng: random.Random, n: int) -> str:
    """`n` words of code-flavoured filler text."""
    return " ".join(rng.choice(_VOCAB) for _ in range(n))


class Conversation:
    """One session's history; `messages(call)` is the next prompt, `answered(text)` records the reply."""

    def __init__(self, session_id: str) -> None:
        seed = int.from_bytes(hashlib.blake2b(session_id.encode(), digest_size=8).digest(), "big")
        self.rng = random.Random(seed)
        self.history: list[dict] = []

    def tokens(self) -> int:
        return sum(count_tokens(m["content"]) for m in self.history)

    def messages(self, call: ScaledCall) -> list[dict]:
        if not self.history:
            system = max(1, call.new_tokens // 3)
            self.history = [
                {"role": "system", "content": filler(self.rng, system)},
                {"role": "user", "content": filler(self.rng, max(1, call.new_tokens - system))},
            ]
        elif call.reuse >= 1.0:
            self.history.append({"role": "user", "content": filler(self.rng, call.new_tokens)})
        else:
            self._edit(call)
        return [dict(m) for m in self.history]

    def _edit(self, call: ScaledCall) -> None:
        """Keep the leading messages within the reused share; fresh text replaces the rest."""
        total, budget, kept, size = self.tokens(), call.reuse * self.tokens(), [], 0
        for m in self.history:
            n = count_tokens(m["content"])
            if size + n > budget:
                break
            kept.append(m)
            size += n
        self.history = kept + [
            {"role": "user", "content": filler(self.rng, total - size + call.new_tokens)}
        ]

    def answered(self, text: str) -> None:
        self.history.append({"role": "assistant", "content": text})


def fit_context(
    conv: Conversation, call: ScaledCall, tokens_per_unit: float, context: int, margin: float = 0.95
) -> tuple[ScaledCall, bool]:
    """Make the next prompt plus `call.max_tokens` fit `context` server tokens (with a margin):
    drop the oldest messages after the system prompt first (an agent compacts its history the
    same way), then lower max_tokens, then cut the newest message. Returns the call to send and
    whether anything was changed. `tokens_per_unit`: server tokens per word, as measured."""
    budget = int(context * margin)

    def need() -> int:
        return math.ceil(tokens_per_unit * conv.tokens()) + 1

    changed = False
    while need() + call.max_tokens > budget and len(conv.history) > 2:
        del conv.history[1]
        changed = True
    if need() + call.max_tokens > budget:
        call, changed = replace(call, max_tokens=max(1, min(call.max_tokens, budget // 4))), True
    while need() + call.max_tokens > budget and conv.history:
        last = conv.history[-1]
        words = last["content"].split()
        keep = max(
            0, len(words) - max(1, math.ceil((need() + call.max_tokens - budget) / tokens_per_unit))
        )
        last["content"] = " ".join(words[:keep])
        changed = True
        if not keep:
            break
    return call, changed
