"""The `<|role|> content` prompt format: the sim executor's chat template, and the canonical text
that the gateway and the picker estimate lengths and match prefixes on (`spec.canonical_prompt`).
Each writes a tool and a tool call its own way (the canonical text sorts a tool's keys, so the
same tools read the same whatever order a client sends), so the caller says how."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from talariad.wire.messages import ChatMessage, ToolCall


def lines(
    messages: Sequence[ChatMessage],
    tools: Sequence[dict],
    tool: Callable[[dict], str],
    call: Callable[[ToolCall], str],
) -> list[str]:
    """One `<|tools|> TOOL` line per tool, then one `<|role|> content` line per message, with its
    tool calls written after its text."""
    out = [f"<|tools|> {tool(t)}\n" for t in tools]
    out += [
        f"<|{m.role}|> {m.content}{''.join(map(call, m.tool_calls))}\n"
        if m.tool_calls
        else f"<|{m.role}|> {m.content}\n"  # most turns: no join (a third of a long read's lines)
        for m in messages
    ]
    return out
