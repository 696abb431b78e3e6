"""The replay trace format: one JSON object per LLM call (JSONL), grouped into closed-loop sessions.

A call is released one `gap_s` after the previous response of its session (0 for call 0); its
`prefix_tokens` are the leading prompt tokens it shares with the previous call's context (the
reusable prefix). Malformed input raises `TraceError` naming the file, line and field.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

FIELDS: dict[str, type] = {
    "session_id": str,
    "call_idx": int,
    "model": str,
    "prompt_tokens": int,
    "prefix_tokens": int,
    "output_tokens": int,
    "gap_s": float,
}


class TraceError(ValueError):
    """A malformed trace; the message names the file, the line (1-based) and the field."""

    def __init__(self, source: str, line: int, field: str | None, msg: str) -> None:
        self.source, self.line, self.field = source, line, field
        where = f"{source}:{line}" + (f": field '{field}'" if field else "")
        super().__init__(f"{where}: {msg}")


@dataclass(frozen=True, slots=True)
class TraceCall:
    session_id: str
    call_idx: int
    model: str
    prompt_tokens: int
    prefix_tokens: int  # reusable prefix shared with the previous call's prompt + answer
    output_tokens: int
    gap_s: float  # after the previous response, before this call; 0 for call 0

    @property
    def new_tokens(self) -> int:
        return self.prompt_tokens - self.prefix_tokens

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


Session = list[TraceCall]


class Trace:
    """Sessions in file order, each a list of calls in call order."""

    def __init__(self, sessions: Iterable[Session]) -> None:
        self.sessions: list[Session] = [list(s) for s in sessions if s]

    def __len__(self) -> int:
        return len(self.sessions)

    def __iter__(self) -> Iterator[Session]:
        return iter(self.sessions)

    @property
    def n_calls(self) -> int:
        return sum(len(s) for s in self.sessions)

    def calls(self) -> Iterator[TraceCall]:
        for s in self.sessions:
            yield from s

    def models(self) -> list[str]:
        """Models in order of first appearance."""
        return list(dict.fromkeys(c.model for c in self.calls()))

    def by_model(self) -> dict[str, list[Session]]:
        """Sessions grouped by the model of their first call."""
        out: dict[str, list[Session]] = {}
        for s in self.sessions:
            out.setdefault(s[0].model, []).append(s)
        return out

    def session(self, session_id: str) -> Session:
        for s in self.sessions:
            if s[0].session_id == session_id:
                return s
        raise KeyError(session_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Trace) and self.sessions == other.sessions


def _open_text(path: Path, mode: str):
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")
    return path.open(mode, encoding="utf-8")


def write_jsonl(trace: Trace, path: str | Path) -> Path:
    path = Path(path)
    with _open_text(path, "w") as f:
        for call in trace.calls():
            f.write(call.to_json() + "\n")
    return path


def read_jsonl(path: str | Path) -> Trace:
    """Read and validate a trace file (`.jsonl` or `.jsonl.gz`)."""
    path = Path(path)
    with _open_text(path, "r") as f:
        return parse_lines(f, source=str(path))


def parse_lines(lines: Iterable[str], source: str = "<trace>") -> Trace:
    builder = SessionBuilder(source)
    for lineno, raw in enumerate(lines, start=1):
        if raw.strip():
            builder.add(parse_call(load_object(raw, source, lineno), source, lineno), lineno)
    return builder.trace()


def load_object(raw: str, source: str, lineno: int) -> dict:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        raise TraceError(
            source, lineno, None, f"invalid JSON ({e.msg} at column {e.colno})"
        ) from None
    if not isinstance(obj, dict):
        raise TraceError(source, lineno, None, f"expected a JSON object, got {type(obj).__name__}")
    return obj


def parse_call(obj: dict, source: str, lineno: int) -> TraceCall:
    values = {name: typed_field(obj, name, kind, source, lineno) for name, kind in FIELDS.items()}
    call = TraceCall(**values)
    check_call(call, source, lineno)
    return call


def typed_field(obj: dict, name: str, kind: type, source: str, lineno: int):
    if name not in obj:
        raise TraceError(source, lineno, name, "missing")
    value = obj[name]
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise TraceError(source, lineno, name, f"expected {kind.__name__}, got {value!r}")
    if kind is str and not value:
        raise TraceError(source, lineno, name, "must not be empty")
    if kind is float and value != value:  # NaN
        raise TraceError(source, lineno, name, "must be a number, got NaN")
    return value


def check_call(call: TraceCall, source: str, lineno: int) -> None:
    for name in ("call_idx", "prompt_tokens", "prefix_tokens", "output_tokens", "gap_s"):
        if getattr(call, name) < 0:
            raise TraceError(source, lineno, name, f"must be >= 0, got {getattr(call, name)}")
    if call.prefix_tokens > call.prompt_tokens:
        raise TraceError(
            source,
            lineno,
            "prefix_tokens",
            f"{call.prefix_tokens} exceeds prompt_tokens {call.prompt_tokens}",
        )
    if call.call_idx == 0 and call.gap_s != 0:
        raise TraceError(source, lineno, "gap_s", f"must be 0 for call 0, got {call.gap_s}")


class SessionBuilder:
    """Groups calls by session id and checks that call indices run 0, 1, 2 ... within each."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._sessions: dict[str, Session] = {}

    def add(self, call: TraceCall, lineno: int) -> None:
        calls = self._sessions.setdefault(call.session_id, [])
        if call.call_idx != len(calls):
            raise TraceError(
                self.source,
                lineno,
                "call_idx",
                f"session {call.session_id!r} expects call_idx {len(calls)}, got {call.call_idx}",
            )
        calls.append(call)

    def trace(self) -> Trace:
        return Trace(self._sessions.values())
