"""A call's body read as cheaply as it allows, for the pool's picker: its `CallSpec` and canonical
`Prompt` (the model, the fields and turns that name its session, the text its branch is chosen
on), equal to what `routes.parse` and `spec.canonical_prompt` give (property-tested,
tests/calls/test_reading.py).

An agent resends its whole conversation on every call (20-400 KB), and the picker sees every
call. A chat, messages or Responses body whose bytes start as a body read before does, up to the
end of one of its messages (a Responses input item), is read from there: only the new messages
are parsed, validated with the dialect's own models and converted, and what precedes them
(validated, converted, its canonical text) is the earlier read's. Responses items are continued
from only where the turn before them is final (not an assistant turn a tool call would join)
and while no item changes the tools. Any other body is read whole, as the box reads it, and a
body its dialect refuses gets its 400 from that whole read. The box still validates every body
fully.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, cast

from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from pydantic_core import from_json

from talariad.calls import routes
from talariad.calls.branches import Prompt, common_prefix
from talariad.calls.dialects import chat, messages, responses
from talariad.calls.errors import APIError
from talariad.calls.schemas import Message, parse_arguments
from talariad.calls.spec import CallSpec, canonical_lines, canonical_prompt, prompt_of
from talariad.wire.messages import ChatMessage, ToolCall

_WS = re.compile(r"[ \t\n\r]*")
_SCAN = json.JSONDecoder().scan_once  # the stdlib's C scanner: a JSON value and where it ends
_HEAD_ROLES = ("system", "developer")


@dataclass(frozen=True, slots=True)
class _Dialect:
    """How a dialect's conversation is read one message at a time."""

    key: str  # the body's array of messages
    items: TypeAdapter  # its messages' model
    head: Callable[[Any], list[ChatMessage]]  # turns the body puts before them (a system field)
    # one message's turns added to the turns before it, and the conversion's state; False: it
    # cannot be converted so (a Responses item that changes the tools)
    convert: Callable[[Any, dict[str, str], list[ChatMessage]], bool]
    spec_of: Callable[[Any, list[ChatMessage]], CallSpec] | None  # None: `whole` reads it
    rest: type[BaseModel] | None  # the body with its messages left as parsed (`_light`)
    plain: Callable[[Any, dict[str, str], list[dict]], bool] | None  # one parsed message's turns
    # Responses: the body read whole by its dialect (spec, how many head turns, turns after the
    # head up to each item, the conversion's state)
    whole: Callable[[bytes], tuple[CallSpec, int, list[int], dict[str, str]]] | None = None
    # a new item may join the assistant turn before it (a Responses tool call): a read is not
    # continued from right after an assistant turn, whose line is not final
    joins_assistant: bool = False


class _ChatRest(chat.ChatCompletionRequest):
    messages: list[Any] = Field(min_length=1)  # type: ignore[assignment]


class _MessagesRest(messages.MessagesRequest):
    messages: list[Any] = Field(min_length=1)  # type: ignore[assignment]


def _plain_chat(m: Any, names: dict[str, str], out: list[dict]) -> bool:
    """`Message.chat` of a parsed chat message the model takes as it is, as the `ChatMessage`'s
    fields, added to `out`; False when the model might refuse it or read it otherwise (then the
    body is read whole)."""
    if type(m) is not dict or type(m.get("role")) is not str or m["role"] not in _CHAT_ROLES:
        return False
    content, calls = m.get("content"), m.get("tool_calls")
    if len(m) == 2 and type(content) is str and m["role"] in _SAME_ROLES:
        out.append(m)  # the usual turn: already the ChatMessage's fields
        return True
    if type(content) is list:
        parts = []
        for p in content:
            if type(p) is not dict or type(p.get("type")) is not str:
                return False
            text = p.get("text")
            if text is not None and type(text) is not str:
                return False
            if text and p["type"] in ("text", "input_text"):
                parts.append(text)
        content = "".join(parts)
    elif content is None:
        content = ""
    elif type(content) is not str:
        return False
    role = _CHAT_ROLES[m["role"]]
    call_id, name = m.get("tool_call_id"), m.get("name")
    if (call_id is not None and type(call_id) is not str) or (
        name is not None and type(name) is not str
    ):
        return False
    turn = {"role": role, "content": content, "tool_call_id": call_id}
    turn["name"] = name if role == "tool" else None
    if calls is not None:
        if type(calls) is not list or (tools := [_plain_call(c) for c in calls]).count(None):
            return False
        turn["tool_calls"] = tools
    out.append(turn)
    return True


_SAME_ROLES = frozenset({"system", "user", "assistant"})  # a tool turn's name is read apart
_CHAT_ROLES = {r: r for r in ("system", "user", "assistant", "tool")} | {
    "developer": "system",
    "function": "tool",
}


def _plain_call(c: Any) -> ToolCall | None:
    """A chat tool call as `Message.chat` converts it; None when its model might refuse it."""
    f = c.get("function") if type(c) is dict else None
    if type(f) is not dict or type(name := f.get("name")) is not str or not name:
        return None
    call_id, kind, args = c.get("id", ""), c.get("type", "function"), f.get("arguments", "")
    if type(call_id) is not str or type(kind) is not str or type(args) not in (str, dict):
        return None
    return ToolCall(id=call_id, name=name, arguments=parse_arguments(args))


def _optional_str(v: Any) -> bool:
    return v is None or type(v) is str


def _plain_anthropic(m: Any, names: dict[str, str], out: list[dict]) -> bool:
    """`AnthropicMessage.chat` of a parsed message the model takes as it is (each block's fields
    of the types `ContentBlock` declares), as its `ChatMessage`s' fields added to `out`; False
    otherwise (then the body is read whole)."""
    if type(m) is not dict or type(m.get("role")) is not str:
        return False
    if m["role"] not in _ANTHROPIC_ROLES:
        return False
    role, content = m["role"], m.get("content")
    if type(content) is str:
        out.append(m if len(m) == 2 else {"role": role, "content": content})
        return True
    if type(content) is not list:
        return False
    n, text, calls = len(out), [], []
    for b in content:
        if type(b) is not dict or type(kind := b.get("type")) is not str:
            return False
        said, use, inner = b.get("text"), b.get("tool_use_id"), b.get("content")
        call_id, name = b.get("id"), b.get("name")
        if (
            (said is not None and type(said) is not str)
            or (use is not None and type(use) is not str)
            or (call_id is not None and type(call_id) is not str)
            or (name is not None and type(name) is not str)
            or not (_optional_str(inner) or (type(inner) is list and _all_dicts(inner)))
        ):
            return False
        if kind == "tool_result":
            flat = _flat_result(inner)
            out.append(
                {"role": "tool", "content": flat, "tool_call_id": use, "name": names.get(use or "")}
            )
        elif kind == "text":
            text.append(said or "")
        elif kind == "tool_use":
            args = b.get("input")
            calls.append(
                ToolCall(
                    id=call_id or "",
                    name=name or "",
                    arguments=args if isinstance(args, (dict, str)) else {},
                )
            )
    for c in calls:
        names[c.id] = c.name
    joined = "".join(text)
    if joined or calls or len(out) == n:
        out.append({"role": role, "content": joined, "tool_calls": calls})
    return True


_ANTHROPIC_ROLES = frozenset({"user", "assistant", "system"})


def _all_dicts(items: list) -> bool:
    return all(type(i) is dict for i in items)


def _flat_result(content: Any) -> str:
    """`ContentBlock.flat` of a tool_result's content."""
    if type(content) is list:
        return "".join(c["text"] for c in content if isinstance(c.get("text"), str))
    return content or ""


def _added(out: list[ChatMessage], turns: list[ChatMessage]) -> bool:
    out += turns
    return True


def _responses_whole(raw: bytes) -> tuple[CallSpec, int, list[int], dict[str, str]]:
    """A Responses body read whole as the box reads it (`responses.spec`, its 400s), with how
    its items were converted; items that are not a list of them, or that change the tools,
    leave no counts (the read is then never continued)."""
    body = cast(responses.ResponsesRequest, routes.body("/v1/responses", raw))
    read = responses.ItemsRead()
    spec, _ = responses.spec(body, routes.UNSTORED, read)
    counts = [] if read.tools_changed else [c - read.lead for c in read.counts]
    return spec, read.lead, counts, read.names


_DIALECTS = {
    "/v1/chat/completions": _Dialect(
        "messages",
        TypeAdapter(list[Message]),
        lambda b: [],
        lambda m, _, out: _added(out, [m.chat()]),
        chat.spec_of,
        _ChatRest,
        _plain_chat,
    ),
    "/v1/messages": _Dialect(
        "messages",
        TypeAdapter(list[messages.AnthropicMessage]),
        messages.MessagesRequest.system_messages,
        lambda m, names, out: _added(out, m.chat(names)),
        messages.spec_of,
        _MessagesRest,
        _plain_anthropic,
    ),
    "/v1/responses": _Dialect(
        "input",
        TypeAdapter(list[dict[str, Any]]),
        lambda b: [],
        lambda item, names, out: responses.convert_item(item, out, names),
        None,
        None,
        None,
        _responses_whole,
        joins_assistant=True,
    ),
}


@dataclass(slots=True)
class _Read:
    """A body read, with what a later body continuing its conversation reuses."""

    raw: bytes
    spec: CallSpec
    prompt: Prompt
    lead: int  # the head turns at the front of `spec.messages` (`system`, `instructions`)
    tools_len: int  # characters of `prompt.text` its tools' lines take
    base: int  # where its messages' lines start in `prompt.text` (after the tools and head turns)
    counts: list[int]  # per message of the body: turns of `spec.messages` (after lead) up to it
    text_end: list[int]  # per message of the body: where its lines end in `prompt.text`
    names: dict[str, str]  # the conversion's state (tool-call id -> tool name)
    at: int  # index of the first conversation turn in `spec.messages`
    ends: list[int] | None = None  # per message: where it ends in `raw` (None: not scanned yet)
    pre: bytes = b""  # `raw` up to the array's key: `{` and the fields before it
    rest: bytes = b""  # `raw` after the array's closing bracket


class BodyReader:
    """Reads call bodies (`read`), keeping recent reads of large chat, messages and Responses
    bodies (at least `min_bytes`) to continue from, at most `max_bytes` of bodies in all, least
    recently used out. Reads are found by path and the session the call's headers name, else
    by path and the body's first `LEAD` bytes: every session of one agent sends the same first
    bytes (its system prompt and tools), so a lead alone keeps only `PER_LEAD` of them."""

    LEAD = 256
    # kept reads of one key (a session's branches; a lead's sessions): each one that does not
    # match costs a memcmp up to the first differing byte
    PER_LEAD = 64

    def __init__(self, min_bytes: int = 8 << 10, max_bytes: int = 256 << 20) -> None:
        self.min_bytes, self.max_bytes = max(min_bytes, self.LEAD), max_bytes
        self.bytes = 0
        self.continued = 0  # reads that continued an earlier one (for benchmarks and tests)
        self._reads: OrderedDict[tuple[str, bytes | str], list[_Read]] = OrderedDict()

    def read(
        self, path: str, raw: bytes, session: str | None = None
    ) -> tuple[CallSpec, Prompt] | None:
        """The call's spec and canonical prompt; None for a path that is no call. Raises the
        dialect's APIError 400 for a body it refuses. `session`: the one its headers name."""
        route = path.split("?", 1)[0]
        dialect = _DIALECTS.get(route)
        if dialect is None or len(raw) < self.min_bytes:
            spec = routes.parse(path, raw)
            return (
                None
                if spec is None
                else (spec, canonical_prompt(spec.messages, spec.prompt, spec.tools))
            )
        key = (route, raw[: self.LEAD] if session is None else session)
        kept = self._reads.get(key, [])
        found = self._continuing(dialect, kept, raw)
        if found is not None:
            read = self._continue(dialect, route, raw, *found)
            if read is not None:
                self.continued += 1
                self._keep(key, read, found[0])
                return read.spec, read.prompt
        read = _whole(dialect, route, raw)
        self._keep(key, read, None)
        return read.spec, read.prompt

    # --- what was read before -------------------------------------------------------------
    def _continuing(
        self, dialect: _Dialect, kept: list[_Read], raw: bytes
    ) -> tuple[_Read, int] | None:
        """The kept read `raw` shares the most whole messages with, and its last one shared."""
        found: tuple[_Read, int] | None = None
        for r in kept:
            # what they share, by halving memcmps (a read of another conversation differs a few
            # hundred bytes in): reading more than half the body from its tail costs more than
            # reading it whole, and a read is scanned (`_index`) only when it may be continued
            if r.ends and raw.startswith(memoryview(r.raw)[: r.ends[-1]]):
                k = len(r.ends) - 1  # the usual return: every message of `r` resent
            else:
                # one memcmp rules out another conversation (the bytes differ early on)
                if not raw.startswith(memoryview(r.raw)[: (len(raw) + 1) // 2]):
                    continue
                shared = common_prefix(raw, r.raw)
                if 2 * shared < len(raw) or not _indexed(r, dialect.key):
                    continue
                k = bisect.bisect_right(r.ends, shared) - 1  # type: ignore[arg-type]
            if k >= 0 and (found is None or r.ends[k] > found[0].ends[found[1]]):  # type: ignore[index]
                found = (r, k)
        if found is None or 2 * found[0].ends[found[1]] < len(raw):  # type: ignore[index]
            return None
        return found

    def _continue(
        self, dialect: _Dialect, route: str, raw: bytes, was: _Read, k: int
    ) -> _Read | None:
        """`raw` read from the end of `was`'s message `k` (the bytes before it are `was`'s);
        None when what follows is not plainly more messages and the body's other fields (then
        the body is read whole)."""
        cut = was.ends[k]  # type: ignore[index]
        try:
            tail = raw[cut:].decode()
            starts, stops, close = _more(tail)
        except (UnicodeDecodeError, StopIteration, ValueError, IndexError):
            return None
        rest_at = cut + _byte_len(tail, close + 1)
        rest = raw[rest_at:]
        new = tail[starts[0] : stops[-1]] if starts else ""
        try:
            if rest == was.rest:  # the body's other fields are `was`'s
                items, body = (dialect.items.validate_json(f"[{new}]") if new else []), None
            elif dialect.spec_of is not None and new and _keys(rest.decode(), dialect.key):
                doc = b"".join((was.pre, b'"', dialect.key.encode(), b'":[', new.encode(), b"]"))
                body = routes.ROUTES[route].body.model_validate_json(doc + rest)
                items = getattr(body, dialect.key)
            else:
                return None
        except (ValidationError, UnicodeDecodeError, StopIteration, ValueError, IndexError):
            return None
        prev = was.spec.messages[was.lead : was.lead + was.counts[k]]
        if dialect.joins_assistant and prev and prev[-1].role == "assistant":
            return None
        if k == len(was.counts) - 1:
            names = dict(was.names)
        else:  # a fork: the tool calls named up to its message `k`, not after
            names = {c.id: c.name for m in prev for c in m.tool_calls}
        counts = was.counts[: k + 1]
        added: list[ChatMessage] = []
        try:
            for m in items:
                if not dialect.convert(m, names, added):
                    return None
                counts.append(counts[k] + len(added))
        except APIError:  # the whole read answers its 400
            return None
        if not (was.lead or prev or added):  # no turn at all (a fork): the whole read's 400
            return None
        new_lines = canonical_lines(added, [])
        if body is None:
            head = was.spec.messages[: was.lead]
            spec = dataclasses.replace(was.spec, messages=head + prev + added)
            base, tools_len = was.base, was.tools_len
            # `was`'s text up to message `k`: the text itself (no copy) when `k` is its last
            text = was.prompt.text[: was.text_end[k]] + "".join(new_lines)
        else:
            head = dialect.head(body)
            spec = dialect.spec_of(body, head + prev + added)  # type: ignore[misc]
            tools = canonical_lines([], spec.tools)
            tools_len = sum(map(len, tools))
            base_text = "".join(tools + canonical_lines(head, []))
            base = len(base_text)
            text = "".join((base_text, was.prompt.text[was.base : was.text_end[k]], *new_lines))
        shift = base - was.base
        text_end = [e + shift for e in was.text_end[: k + 1]] if shift else was.text_end[: k + 1]
        line_end = list(accumulate(map(len, new_lines), initial=text_end[k]))
        text_end += [line_end[c - counts[k]] for c in counts[k + 1 :]]
        msgs = spec.messages
        if body is None and was.at < was.lead + was.counts[k]:
            p = was.prompt
            prompt, at = Prompt(text, p.head, p.first, p.thread), was.at
        else:
            at = _first_turn(msgs)
            prompt = prompt_of(text, msgs, canonical_lines(msgs[: at + 1], []), tools_len)
        ends = was.ends[: k + 1] + [cut + _byte_len(tail, s) for s in stops]  # type: ignore[index]
        return _Read(
            raw,
            spec,
            prompt,
            len(head),
            tools_len,
            base,
            counts,
            text_end,
            names,
            at,
            ends,
            was.pre,
            rest,
        )

    def _keep(self, key: tuple[str, bytes | str], read: _Read, replaces: _Read | None) -> None:
        kept = self._reads.pop(key, [])
        if replaces is not None and replaces in kept:  # its conversation moved on
            kept.remove(replaces)
            self.bytes -= len(replaces.raw)
        kept.insert(0, read)
        self.bytes += len(read.raw)
        while len(kept) > self.PER_LEAD:
            self.bytes -= len(kept.pop().raw)
        self._reads[key] = kept
        while self.bytes > self.max_bytes and self._reads:
            _, gone = self._reads.popitem(last=False)
            self.bytes -= sum(len(r.raw) for r in gone)


def _whole(dialect: _Dialect, route: str, raw: bytes) -> _Read:
    """The body read whole, as `routes.parse` reads it (its 400 too), one message at a time:
    parsed once (`_light`) where the dialect's models would take it as it is, else by them
    (Responses: by its dialect, `_Dialect.whole`)."""
    if dialect.whole is not None:
        spec, lead, counts, names = dialect.whole(raw)
        conv = spec.messages
    else:
        spec, lead, conv, counts, names = _converted(dialect, route, raw)
    ntools = len(spec.tools)
    lines = canonical_lines(conv, spec.tools)
    tools_len = sum(map(len, lines[:ntools]))
    prompt = prompt_of("".join(lines), conv, lines[ntools:], tools_len)
    base = tools_len + sum(map(len, lines[ntools : ntools + lead]))
    line_end = list(accumulate(map(len, lines[ntools + lead :]), initial=base))
    text_end = [line_end[c] for c in counts]
    return _Read(
        raw, spec, prompt, lead, tools_len, base, counts, text_end, names, _first_turn(conv)
    )


def _converted(
    dialect: _Dialect, route: str, raw: bytes
) -> tuple[CallSpec, int, list[ChatMessage], list[int], dict[str, str]]:
    """A chat or messages body's spec, its head turns' count, its turns, the turns after the
    head up to each message, and the conversion's state."""
    read = _light(dialect, raw)
    if read is None:
        body = routes.body(route, raw)
        names: dict[str, str] = {}
        head = dialect.head(body)
        conv, counts = list(head), []
        for m in getattr(body, dialect.key):
            dialect.convert(m, names, conv)
            counts.append(len(conv) - len(head))
    else:
        body, head, conv, counts, names = read
    return dialect.spec_of(body, conv), len(head), conv, counts, names  # type: ignore[misc]


def _light(
    dialect: _Dialect, raw: bytes
) -> tuple[Any, list[ChatMessage], list[ChatMessage], list[int], dict[str, str]] | None:
    """The body parsed once by the parser its model uses (pydantic's), its fields but the
    messages validated (strictly) by its model and each message converted from what was parsed,
    without building the dialect's model of it: the body, its head turns, each message's turns
    and the conversion's state. None when the model might refuse the body or read it otherwise
    (not JSON, a field or block of a type it would coerce, an unknown role): `routes.body`
    then reads it and answers its 400. A message model's dozen pydantic objects a message are
    most of a whole read's time (parsing is a tenth of it)."""
    try:
        doc = from_json(raw)
        body = dialect.rest.model_validate(doc, strict=True)  # type: ignore[union-attr]
    except (ValueError, TypeError):  # pydantic's ValidationError is a ValueError
        return None
    names: dict[str, str] = {}
    fields: list[dict] = []
    counts = []
    for m in getattr(body, dialect.key):
        if not dialect.plain(m, names, fields):  # type: ignore[misc]
            return None
        counts.append(len(fields))
    head = dialect.head(body)
    return body, head, head + _TURNS.validate_python(fields), counts, names


_TURNS = TypeAdapter(list[ChatMessage])  # one validation of every turn (not one call a turn)


def _indexed(read: _Read, key: str) -> bool:
    """`read` can be continued from (its structure found, `_index`, at its first use)."""
    if read.ends is None:
        _index(read, key)
    return bool(read.ends)


def _first_turn(msgs: list[ChatMessage]) -> int:
    return next((i for i, m in enumerate(msgs) if m.role not in _HEAD_ROLES), len(msgs))


def _index(read: _Read, key: str) -> None:
    """Where `read`'s messages end in its body, the body's bytes before the array's key and after
    its closing bracket; `ends` empty when the body is not plainly one object with one such
    array (it is then never continued from)."""
    read.ends = []
    try:
        text = read.raw.decode()
        found = _structure(text, key)
    except (UnicodeDecodeError, StopIteration, ValueError, IndexError):
        return
    if found is None or len(found[1]) != len(read.counts):
        return
    pre, ends, close = found
    offsets = _byte_offsets(text, [pre, *ends, close + 1])
    read.pre, read.rest = read.raw[: offsets[0]], read.raw[offsets[-1] :]
    read.ends = offsets[1:-1]


def _structure(s: str, key: str) -> tuple[int, list[int], int] | None:
    """Of a JSON object's text: where its `key` field starts, where each element of that field's
    array ends and where the array closes (character offsets); None: no such array, or two."""
    ws = _WS.match
    i = ws(s, 0).end()
    if s[i] != "{":
        return None
    i = ws(s, i + 1).end()
    found = None
    while s[i] != "}":
        start = i
        name, i = _SCAN(s, i)
        i = ws(s, i).end()
        if type(name) is not str or s[i] != ":":
            return None
        i = ws(s, i + 1).end()
        if name == key:
            if found is not None or s[i] != "[":
                return None
            ends, i = [], ws(s, i + 1).end()
            while s[i] != "]":
                _, i = _SCAN(s, i)
                ends.append(i)
                i = ws(s, i).end()
                if s[i] == ",":
                    i = ws(s, i + 1).end()
                elif s[i] != "]":
                    return None
            found = (start, ends, i)
            i += 1
        else:
            _, i = _SCAN(s, i)
        i = ws(s, i).end()
        if s[i] == ",":
            i = ws(s, i + 1).end()
        elif s[i] != "}":
            return None
    return found


def _more(tail: str) -> tuple[list[int], list[int], int]:
    """Of the text after a message of the array: where each further message starts and ends,
    and where the array closes. Raises ValueError (or the scanner's StopIteration) otherwise."""
    ws = _WS.match
    starts, stops = [], []
    i = ws(tail, 0).end()
    while tail[i] == ",":
        i = ws(tail, i + 1).end()
        starts.append(i)
        _, i = _SCAN(tail, i)
        stops.append(i)
        i = ws(tail, i).end()
    if tail[i] != "]":
        raise ValueError("not more messages")
    return starts, stops, i


def _keys(rest: str, key: str) -> bool:
    """`rest` (after the array's closing bracket) closes the object with fields other than
    `key`: a second array of that name would be the one the dialect reads."""
    ws = _WS.match
    i = ws(rest, 0).end()
    while rest[i] == ",":
        name, i = _SCAN(rest, ws(rest, i + 1).end())
        i = ws(rest, i).end()
        if name == key or rest[i] != ":":
            return False
        _, i = _SCAN(rest, ws(rest, i + 1).end())
        i = ws(rest, i).end()
    return rest[i] == "}"


def _byte_len(text: str, n: int) -> int:
    """Bytes of UTF-8 the first `n` characters of `text` take."""
    return n if text.isascii() else len(text[:n].encode())


def _byte_offsets(text: str, offsets: list[int]) -> list[int]:
    """Character offsets (ascending) of `text` as offsets into its UTF-8 bytes."""
    if text.isascii():
        return offsets
    out, at, n = [], 0, 0
    for o in offsets:
        n += len(text[at:o].encode())
        at = o
        out.append(n)
    return out
