"""Traffic shaped like the coding agents' own, to replay through a daemon and read reuse per call.

The bodies are built here from the APIs' references and the shapes the CLIs are known to send
(a long system prompt and tool list, title and quota side calls, `count_tokens`, sub-agents with
their own prompt and an overlapping tool list, compaction, resume); no vendor prompt text. Words
are drawn from a fixed vocabulary with a seeded generator, so every run sends the same bytes.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import httpx

WORDS = (
    "the file test build patch read write edit run command output error line path function "
    "class module change check diff commit branch review tool call result search pattern user "
    "agent task step plan code repository directory option value return string number list"
).split()


def words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def anthropic_tool(name: str, n_words: int, seed: int) -> dict:
    return {
        "name": name,
        "description": words(n_words, seed),
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
            "required": ["path"],
        },
    }


AGENT_TOOL = anthropic_tool("Agent", 400, 1)  # about 2,500 characters, first in both lists
MAIN_TOOLS = [AGENT_TOOL] + [anthropic_tool(f"Tool{i}", 420, 100 + i) for i in range(23)]
SUB_TOOLS = [AGENT_TOOL] + [anthropic_tool(f"Tool{i}", 420, 100 + i) for i in range(3, 23)]
MAIN_SYSTEM = words(2600, 2)
SUB_SYSTEM = words(600, 3)


def claude_system(text: str, date: str = "2026-01-05") -> list[dict]:
    """Claude Code's system blocks: a billing-style header, the prompt, the environment (the
    date changes between runs)."""
    return [
        {"type": "text", "text": "You are an interactive coding agent."},
        {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": f"Platform: linux. Today's date: {date}."},
    ]


def user(text: str) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def claude_body(system, messages, tools=MAIN_TOOLS, model="claude-sonnet-4-5", **over) -> dict:
    body = {
        "model": model,
        "max_tokens": 24,
        "system": system,
        "messages": messages,
        "tools": tools,
        "metadata": {"user_id": "user_abc_account__session_x"},
    }
    return {**body, **over}


@dataclass
class Replay:
    """Calls sent through one daemon endpoint, with the reuse each one reported."""

    endpoint: str
    headers: dict
    log: list[tuple[str, int, int, str]] = field(default_factory=list)
    """(label, prompt tokens, reused tokens, branch) per call, in order."""

    def messages(self, label: str, body: dict) -> dict:
        r = httpx.post(f"{self.endpoint}/v1/messages", json=body, headers=self.headers, timeout=120)
        assert r.status_code == 200, r.text
        msg = r.json()
        u = msg["usage"]
        self._note(label, u["input_tokens"] + u["cache_read_input_tokens"], u)
        return msg

    def count(self, body: dict) -> int:
        body = {k: v for k, v in body.items() if k not in ("max_tokens", "metadata")}
        r = httpx.post(
            f"{self.endpoint}/v1/messages/count_tokens",
            json=body,
            headers=self.headers,
            timeout=60,
        )
        assert r.status_code == 200, r.text
        return r.json()["input_tokens"]

    def chat(self, label: str, body: dict) -> dict:
        r = httpx.post(
            f"{self.endpoint}/v1/chat/completions", json=body, headers=self.headers, timeout=120
        )
        assert r.status_code == 200, r.text
        out = r.json()
        self._note(label, out["usage"]["prompt_tokens"], out["usage"])
        return out

    def responses(self, label: str, body: dict) -> dict:
        r = httpx.post(
            f"{self.endpoint}/v1/responses", json=body, headers=self.headers, timeout=120
        )
        assert r.status_code == 200, r.text
        out = r.json()
        self._note(label, out["usage"]["input_tokens"], out["usage"])
        return out

    def _note(self, label: str, prompt: int, usage: dict) -> None:
        cached = (
            usage.get("cache_read_input_tokens")
            or (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            or (usage.get("input_tokens_details") or {}).get("cached_tokens")
            or 0
        )
        self.log.append((label, prompt, cached, usage["talaria"]["branch"]))

    def reuse(self, label: str) -> float:
        """The share of the last call labelled `label`'s prompt that came from cache."""
        _, prompt, cached, _ = next(e for e in reversed(self.log) if e[0] == label)
        return cached / prompt

    def branch(self, label: str) -> str:
        return next(e for e in reversed(self.log) if e[0] == label)[3]

    def table(self) -> str:
        rows = [f"{'call':<14}{'prompt':>8}{'reused':>8}{'share':>8}  branch"]
        rows += [f"{lb:<14}{p:>8}{c:>8}{c / p:>8.1%}  {b}" for lb, p, c, b in self.log]
        return "\n".join(rows)


def text_of(msg: dict) -> str:
    return "".join(b.get("text", "") for b in msg["content"] if b["type"] == "text")


def claude_code_subagent(replay: Replay, interactive: bool = False) -> None:
    """`claude -p "Use a subagent to change the greeting ..."`: main (24 tools) emits `Agent`, the
    sub-agent runs three calls with its own system prompt and 21 tools (the same `Agent` tool
    first), then the main conversation resumes. Interactive mode adds its side calls first."""
    task = "Use a subagent to change the greeting in hello.py from Hello to Hi."
    if interactive:
        haiku = "claude-haiku-4-5-20251001"
        replay.messages("quota", claude_body(None, [user("quota")], None, haiku, max_tokens=1))
        title = claude_body(
            [{"type": "text", "text": "Write a five word title for the conversation."}],
            [user(task)],
            None,
            haiku,
        )
        replay.messages("title", title)
    main = [user(f"<system-reminder>{words(300, 4)}</system-reminder>\n{task}")]
    body = claude_body(claude_system(MAIN_SYSTEM), main)
    replay.count(body)
    first = replay.messages("main-1", body)
    use = {"type": "tool_use", "id": "toolu_agent", "name": "Agent", "input": {"prompt": "Hi"}}
    sub = [user("Change the greeting in hello.py from Hello to Hi, then report.")]
    for n in range(1, 4):
        answer = replay.messages(f"sub-{n}", claude_body(claude_system(SUB_SYSTEM), sub, SUB_TOOLS))
        call = {"type": "tool_use", "id": f"toolu_s{n}", "name": "Tool5", "input": {"path": "x"}}
        sub = sub + [
            {"role": "assistant", "content": [{"type": "text", "text": text_of(answer)}, call]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"toolu_s{n}", "content": words(40, n)}
                ],
            },
        ]
    main = main + [
        {"role": "assistant", "content": [{"type": "text", "text": text_of(first)}, use]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_agent", "content": "Changed it."}
            ],
        },
    ]
    replay.messages("main-2", claude_body(claude_system(MAIN_SYSTEM), main))


def claude_code_compaction_and_resume(replay: Replay) -> None:
    """Three main turns, `/compact` (the history plus a summary request), the conversation
    continued from the summary, then the client restarted with `--resume` (the same session;
    the date in its system prompt moved on)."""
    history = [user(f"Fix the failing test. {words(200, 5)}")]
    for n in range(1, 4):
        answer = replay.messages(f"main-{n}", claude_body(claude_system(MAIN_SYSTEM), history))
        history = history + [
            {"role": "assistant", "content": text_of(answer)},
            user(f"Continue with step {n}."),
        ]
    compact = history[:-1] + [user("Summarize the conversation so far in detail.")]
    summary = text_of(replay.messages("compact", claude_body(claude_system(MAIN_SYSTEM), compact)))
    cont = [user(f"This session continues from an earlier one. Summary: {summary}")]
    answer = replay.messages("continued-1", claude_body(claude_system(MAIN_SYSTEM), cont))
    cont = cont + [{"role": "assistant", "content": text_of(answer)}, user("Run the tests.")]
    answer = replay.messages("continued-2", claude_body(claude_system(MAIN_SYSTEM), cont))
    cont = cont + [{"role": "assistant", "content": text_of(answer)}, user("Now commit.")]
    later = claude_system(MAIN_SYSTEM, date="2026-01-06")
    answer = replay.messages("resumed-1", claude_body(later, cont))
    cont = cont + [{"role": "assistant", "content": text_of(answer)}, user("Push it.")]
    replay.messages("resumed-2", claude_body(later, cont))


def codex_tools() -> list[dict]:
    """Codex's tools: its execution tool is the free-form `exec` in the `functions` namespace,
    next to function tools and an MCP server's namespace."""
    return [
        {
            "type": "namespace",
            "name": "functions",
            "description": "",
            "tools": [
                {
                    "type": "custom",
                    "name": "exec",
                    "description": words(500, 6),
                    "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
                },
                {
                    "type": "function",
                    "name": "update_plan",
                    "description": words(300, 7),
                    "parameters": {"type": "object", "properties": {"plan": {"type": "string"}}},
                },
            ],
        },
        {
            "type": "namespace",
            "name": "mcp__docs__",
            "description": "Tools of the docs MCP server.",
            "tools": [
                {
                    "type": "function",
                    "name": "search",
                    "description": words(200, 8),
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                }
            ],
        },
        {"type": "web_search"},
    ]


def codex_body(items: list[dict], model: str = "gpt-5.1-codex", **over) -> dict:
    body = {
        "model": model,
        "instructions": words(3000, 9),
        "input": items,
        "tools": codex_tools(),
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "019a0000-c0de-7000-8000-00000000c0de",
        "max_output_tokens": 24,
    }
    return {**body, **over}


def codex_message(role: str, text: str) -> dict:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def codex_turns(replay: Replay) -> None:
    """A Codex turn loop: the user's task, then `exec` calls and their outputs, then a resume
    (`codex resume`: the same conversation id and history, a fresh process)."""
    items = [
        codex_message("developer", f"<permissions>{words(200, 10)}</permissions>"),
        codex_message("user", f"<environment_context>{words(80, 11)}</environment_context>"),
        codex_message("user", "Change Hello to Hi in hello.py."),
    ]
    for n in range(1, 4):
        out = replay.responses(f"codex-{n}", codex_body(items))
        call = {
            "type": "custom_tool_call",
            "call_id": f"call_{n}",
            "name": "exec",
            "namespace": "functions",
            "input": f"run('sed -i s/Hello/Hi/ hello.py') # {n}",
        }
        said = out["output_text"]
        items = items + [
            codex_message("assistant", said),
            call,
            {"type": "custom_tool_call_output", "call_id": f"call_{n}", "output": words(30, n)},
        ]
    replay.responses("codex-resumed", codex_body(items))


def opencode_turns(replay: Replay) -> None:
    """OpenCode: a title call on its small model, the main agent, a `task` sub-agent with its own
    prompt and fewer tools, the main agent again (chat completions, one session header)."""

    def tool(name: str, seed: int) -> dict:
        return {
            "type": "function",
            "function": {
                "name": name,
                "description": words(300, seed),
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }

    tools = [tool("task", 20)] + [tool(f"t{i}", 21 + i) for i in range(12)]
    system = {"role": "system", "content": words(2000, 30)}
    main = [system, {"role": "user", "content": "Rename hello to hi everywhere."}]
    title = [
        {"role": "system", "content": "Generate a short title."},
        {"role": "user", "content": "Rename hello to hi everywhere."},
    ]
    replay.chat("title", {"model": "gpt-5-nano", "messages": title, "max_tokens": 8})
    first = replay.chat(
        "main-1", {"model": "gpt-5", "messages": main, "tools": tools, "max_tokens": 24}
    )
    sub = [{"role": "system", "content": words(500, 31)}, {"role": "user", "content": "Find uses."}]
    for n in range(1, 3):
        out = replay.chat(
            f"task-{n}", {"model": "gpt-5", "messages": sub, "tools": tools[3:], "max_tokens": 24}
        )
        sub = sub + [
            {"role": "assistant", "content": out["choices"][0]["message"]["content"]},
            {"role": "user", "content": "More."},
        ]
    main = main + [
        {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
        {"role": "user", "content": json.dumps({"task_result": "3 uses"})},
    ]
    replay.chat("main-2", {"model": "gpt-5", "messages": main, "tools": tools, "max_tokens": 24})
