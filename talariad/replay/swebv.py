"""Loader for the real agent trace format (mini-swe-agent on SWE-bench Verified, one call per line).

The source logs no response end times, so its tool gap (`gap_s`) is null. Gaps are modelled,
seeded: a lognormal fitted to the paper's tool-gap characterization (§2.1: p50 0.39 s, p95 1.32 s),
capped at 10 s as in the paper's fixed replay (§5.1, App. A), and bounded by the call's logged
start-to-start interval (`interval_s`, 1 s resolution, so +1 s), since the tool gap is part of it.
`shared_prefix_tokens` becomes `prefix_tokens`, clipped to the prompt.
"""

from __future__ import annotations

import gzip
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from talariad.perfmodel.dists import REPLAY_GAP_CAP_S, TOOL_GAP_S, LogNormal
from talariad.replay.trace import (
    SessionBuilder,
    Trace,
    TraceCall,
    TraceError,
    load_object,
    typed_field,
)

_REQUIRED = {
    "session_id": str,
    "call_idx": int,
    "model": str,
    "prompt_tokens": int,
    "output_tokens": int,
}


@dataclass(frozen=True, slots=True)
class GapModel:
    """Seeded tool-gap model: lognormal by p50/p95, capped."""

    dist: LogNormal = TOOL_GAP_S
    cap_s: float = REPLAY_GAP_CAP_S

    def draw(self, rng: np.random.Generator) -> float:
        return min(float(self.dist.sample(rng)), self.cap_s)


def load_swebv(
    path: str | Path,
    *,
    seed: int = 0,
    gap_model: GapModel = GapModel(),
    model_map: Mapping[str, str] | None = None,
    assign_models: Sequence[str] | None = None,
    limit_sessions: int | None = None,
) -> Trace:
    """Read a `*_calls.jsonl[.gz]` trace; `model_map` renames models, `assign_models` gives
    session i the model `assign_models[i % len]` (to spread one-model traces over a catalog),
    `limit_sessions` keeps the first N sessions in file order."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    rng = np.random.default_rng(seed)
    conv = _Converter(str(path), rng, gap_model, dict(model_map or {}), list(assign_models or []))
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, raw in enumerate(f, start=1):
            if raw.strip() and not conv.add(raw, lineno, limit_sessions):
                break
    return conv.builder.trace()


class _Converter:
    def __init__(self, source: str, rng, gaps: GapModel, model_map: dict, assign: list) -> None:
        self.source, self.rng, self.gaps = source, rng, gaps
        self.model_map, self.assign = model_map, assign
        self.builder = SessionBuilder(source)
        self.session_index: dict[str, int] = {}

    def add(self, raw: str, lineno: int, limit: int | None) -> bool:
        """Convert one line; False once `limit` sessions are complete."""
        obj = load_object(raw, self.source, lineno)
        sid = typed_field(obj, "session_id", str, self.source, lineno)
        if sid not in self.session_index:
            if limit is not None and len(self.session_index) >= limit:
                return False
            self.session_index[sid] = len(self.session_index)
        self.builder.add(self.convert(obj, lineno), lineno)
        return True

    def convert(self, obj: dict, lineno: int) -> TraceCall:
        v = {k: typed_field(obj, k, t, self.source, lineno) for k, t in _REQUIRED.items()}
        for name in ("call_idx", "prompt_tokens", "output_tokens"):
            if v[name] < 0:
                raise TraceError(self.source, lineno, name, f"must be >= 0, got {v[name]}")
        shared = self.optional_int(obj, "shared_prefix_tokens", lineno) or 0
        prefix = min(shared, v["prompt_tokens"]) if v["call_idx"] > 0 else 0
        return TraceCall(
            v["session_id"],
            v["call_idx"],
            self.model(v),
            v["prompt_tokens"],
            prefix,
            v["output_tokens"],
            self.gap(obj, v["call_idx"], lineno),
        )

    def model(self, v: dict) -> str:
        if self.assign:
            return self.assign[self.session_index[v["session_id"]] % len(self.assign)]
        return self.model_map.get(v["model"], v["model"])

    def gap(self, obj: dict, call_idx: int, lineno: int) -> float:
        if call_idx == 0:
            return 0.0
        gap = self.gaps.draw(self.rng)  # drawn for every continuation, so seeds stay aligned
        interval = obj.get("interval_s")
        if isinstance(interval, (int, float)) and not isinstance(interval, bool) and interval >= 0:
            gap = min(gap, float(interval) + 1.0)
        return gap

    def optional_int(self, obj: dict, name: str, lineno: int) -> int | None:
        value = obj.get(name)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise TraceError(
                self.source, lineno, name, f"expected a non-negative int or null, got {value!r}"
            )
        return value
