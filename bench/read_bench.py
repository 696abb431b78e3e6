"""What reading a new session's body costs the pool's picker, by body size and dialect: the
whole read through the dialect's models (`routes.parse` + `spec.canonical_prompt`, what a body
not continuing a kept read cost before `reading._light`; what a box's gateway reads), the
picker's read of the same body (`BodyReader.read`, a reader that has kept nothing), the same with
no tool's canonical text kept (`reader_tools_unkept`: an agent's tools not seen before), and
pydantic's JSON parse alone (the floor of any read that parses the whole body). Then a
session's returns (`returns`): each next call of a 70 KB and a 400 KB conversation read by the
reader that read the call before, beside a reader that kept nothing. Arms interleaved, p50/p99
in microseconds; the load average is printed (a shared machine's numbers are provisional).

    python bench/read_bench.py [--reps 200] [--returns 40] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time

from pydantic_core import from_json

from talariad.calls import routes, spec
from talariad.calls.reading import BodyReader
from talariad.calls.spec import canonical_prompt

SYSTEM = "You are a coding agent. Use the tools to inspect and change the repository. " * 40


def chat_body(rounds: int) -> bytes:
    """A chat conversation `rounds` tool rounds in (as `epp_bench`'s agent bodies: ~70 KB at 100
    rounds, ~400 KB at 570), each round an assistant turn calling a tool and its result."""
    msgs: list[dict] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Fix the failing test in tests/test_io.py."},
    ]
    for i in range(rounds):
        call = {"id": f"call_{i}", "type": "function"}
        call["function"] = {"name": "bash", "arguments": json.dumps({"cmd": f"pytest -k t{i}"})}
        msgs.append(
            {"role": "assistant", "content": "I will run the tests now. ", "tool_calls": [call]}
        )
        msgs.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"line {i}\n" * 60})
    tool = {"name": "bash", "description": "Run a command.", "parameters": {"type": "object"}}
    body = {"model": "m", "messages": msgs, "tools": [{"type": "function", "function": tool}]}
    return json.dumps(body).encode()


def messages_body(rounds: int) -> bytes:
    """The same conversation as Claude Code sends it: tool_use and tool_result blocks."""
    msgs: list[dict] = [{"role": "user", "content": "Fix the failing test in tests/test_io.py."}]
    for i in range(rounds):
        use = {"type": "tool_use", "id": f"t{i}", "name": "Bash", "input": {"cmd": f"pytest {i}"}}
        text = {"type": "text", "text": "I will run the tests now. "}
        msgs.append({"role": "assistant", "content": [text, use]})
        result = {"type": "tool_result", "tool_use_id": f"t{i}", "content": f"line {i}\n" * 60}
        msgs.append({"role": "user", "content": [result]})
    body = {
        "model": "m",
        "max_tokens": 4096,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        "messages": msgs,
        "tools": [{"name": "Bash", "description": "Run.", "input_schema": {"type": "object"}}],
        "metadata": {"user_id": "user_abc_account_x_session_s1"},
    }
    return json.dumps(body).encode()


def responses_body(rounds: int) -> bytes:
    """The same conversation as Codex sends it (`/v1/responses`): function_call items and their
    outputs."""
    items: list[dict] = [{"type": "message", "role": "user", "content": "Fix tests/test_io.py."}]
    for i in range(rounds):
        args = json.dumps({"command": ["pytest", "-k", f"t{i}"]})
        items.append(
            {"type": "function_call", "call_id": f"c{i}", "name": "shell", "arguments": args}
        )
        items.append(
            {"type": "function_call_output", "call_id": f"c{i}", "output": f"line {i}\n" * 60}
        )
    tool = {
        "type": "function",
        "name": "shell",
        "description": "Run.",
        "parameters": {"type": "object"},
    }
    body = {"model": "m", "instructions": SYSTEM, "input": items, "tools": [tool], "stream": True}
    return json.dumps(body).encode()


def _schema(i: int) -> dict:
    """A tool's input schema of agent size (~2 KB: eight described arguments)."""
    props = {
        f"arg{j}": {"type": "string", "description": f"What argument {j} of tool {i} means. " * 5}
        for j in range(8)
    }
    return {"type": "object", "properties": props, "required": ["arg0"]}


AGENT_TOOLS = 17  # about what a coding agent declares (its own tools, before any MCP server's)


def first_chat_body(rounds: int) -> bytes:
    """An agent's first call as a chat body: its system prompt, one task and its tool list (~36
    KB of schemas, as coding agents send on every call)."""
    tools = [
        {
            "type": "function",
            "function": {"name": f"tool{i}", "description": "Does one thing. " * 30},
        }
        for i in range(AGENT_TOOLS)
    ]
    for i, t in enumerate(tools):
        t["function"]["parameters"] = _schema(i)
    msgs = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Fix the failing test in tests/test_io.py."},
    ]
    return json.dumps({"model": "m", "messages": msgs, "tools": tools}).encode()


def first_messages_body(rounds: int) -> bytes:
    """The same first call as Claude Code sends it."""
    tools = [
        {"name": f"Tool{i}", "description": "Does one thing. " * 30, "input_schema": _schema(i)}
        for i in range(AGENT_TOOLS)
    ]
    body = {
        "model": "m",
        "max_tokens": 4096,
        "system": [{"type": "text", "text": SYSTEM}],
        "messages": [{"role": "user", "content": "Fix the failing test in tests/test_io.py."}],
        "tools": tools,
    }
    return json.dumps(body).encode()


BODIES = {  # name: (path, body of `rounds` tool rounds, rounds): ~2 KB, ~70 KB, ~400 KB
    "chat_2k": ("/v1/chat/completions", chat_body, 1),
    "chat_70k": ("/v1/chat/completions", chat_body, 100),
    "chat_400k": ("/v1/chat/completions", chat_body, 570),
    "messages_2k": ("/v1/messages", messages_body, 1),
    "messages_70k": ("/v1/messages", messages_body, 100),
    "messages_400k": ("/v1/messages", messages_body, 570),
    "responses_2k": ("/v1/responses", responses_body, 1),
    "responses_70k": ("/v1/responses", responses_body, 100),
    "responses_400k": ("/v1/responses", responses_body, 570),
    # an agent's first call: a short conversation, a long tool list (~50 KB)
    "chat_first": ("/v1/chat/completions", first_chat_body, 0),
    "messages_first": ("/v1/messages", first_messages_body, 0),
}


def _models(path: str, raw: bytes) -> None:
    spec = routes.parse(path, raw)
    assert spec is not None
    canonical_prompt(spec.messages, spec.prompt, spec.tools)


def _reader(path: str, raw: bytes) -> None:
    BodyReader(min_bytes=0).read(path, raw)


def _parse(path: str, raw: bytes) -> None:
    from_json(raw)


def _reader_tools_unkept(path: str, raw: bytes) -> None:
    """`reader` with each tool's canonical text written anew (its keys sorted), as every read
    was before `spec.TOOL_TEXTS`."""
    kept = spec._tool_text
    spec._tool_text = _sorted_json
    try:
        _reader(path, raw)
    finally:
        spec._tool_text = kept


def _sorted_json(tool: dict) -> str:
    return json.dumps(tool, sort_keys=True)


ARMS = {
    "models": _models,
    "reader": _reader,
    "reader_tools_unkept": _reader_tools_unkept,
    "parse_only": _parse,
}


def measure(path: str, raw: bytes, reps: int) -> dict:
    """Each arm `reps` times, interleaved (one call of each in turn)."""
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for read in ARMS.values():  # warm each once
        read(path, raw)
    gc.collect()
    for _ in range(reps):
        for arm, read in ARMS.items():
            t = time.perf_counter()
            read(path, raw)
            times[arm].append(time.perf_counter() - t)
    out: dict = {"body_bytes": len(raw)}
    for arm, seconds in times.items():
        us = sorted(s * 1e6 for s in seconds)
        out[f"{arm}_p50_us"] = round(statistics.median(us), 1)
        out[f"{arm}_p99_us"] = round(us[min(len(us) - 1, int(0.99 * len(us)))], 1)
    return out


RET_ARMS = ("continued", "whole")
RETURNS = (
    "chat_70k",
    "chat_400k",
    "messages_70k",
    "messages_400k",
    "responses_70k",
    "responses_400k",
)


def returns(name: str, calls: int) -> dict:
    """A session's next `calls` returns, each one tool round more: read by a reader that read
    the call before (`continued`, what a return costs the picker) and by one that kept nothing
    (`whole`), interleaved; p50/p99 in microseconds."""
    path, body_of, rounds = BODIES[name]
    bodies = [body_of(rounds + i) for i in range(calls + 1)]
    reader = BodyReader()
    reader.read(path, bodies[0], "s")
    times: dict[str, list[float]] = {"continued": [], "whole": []}
    for raw in bodies[1:]:
        for arm, read in (("continued", reader), ("whole", BodyReader())):
            t = time.perf_counter()
            read.read(path, raw, "s")
            times[arm].append(time.perf_counter() - t)
    out: dict = {"body_bytes": len(bodies[-1]), "continued_reads": reader.continued}
    for arm, seconds in times.items():
        us = sorted(t * 1e6 for t in seconds)
        out[f"{arm}_p50_us"] = round(statistics.median(us), 1)
        out[f"{arm}_p99_us"] = round(us[min(len(us) - 1, int(0.99 * len(us)))], 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--reps", type=int, default=200, help="reads per arm and body")
    ap.add_argument("--returns", type=int, default=40, help="returns per conversation")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out: dict = {"load_start": [round(x, 2) for x in os.getloadavg()], "reads": {}}
    for name, (path, body_of, rounds) in BODIES.items():
        out["reads"][name] = measure(path, body_of(rounds), args.reps)
    out["returns"] = {name: returns(name, args.returns) for name in RETURNS}
    out["load_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"load average {out['load_start'][0]:.2f} on {os.cpu_count()} CPUs (start)")
    print(f"{'body':<15}{'bytes':>9}" + "".join(f"{a + ' p50/p99 us':>26}" for a in ARMS))
    for name, r in out["reads"].items():
        cells = "".join(f"{r[f'{a}_p50_us']:>16.1f} /{r[f'{a}_p99_us']:>8.1f}" for a in ARMS)
        print(f"{name:<15}{r['body_bytes']:>9}{cells}")
    print(f"\n{'return':<15}{'bytes':>9}{'continued p50/p99 us':>26}{'whole p50/p99 us':>26}")
    for name, r in out["returns"].items():
        cells = "".join(f"{r[f'{a}_p50_us']:>16.1f} /{r[f'{a}_p99_us']:>8.1f}" for a in RET_ARMS)
        print(f"{name:<15}{r['body_bytes']:>9}{cells}")
    print(f"load average {out['load_end'][0]:.2f} (end)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
