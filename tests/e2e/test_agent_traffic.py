"""Each agent's traffic shape replayed through a real daemon (sim executors), asserting what each
call reuses: sub-agents, side calls and compaction keep their own prefix, and the main
conversation's resumes reuse its whole previous prompt (the fixtures: tests/support/agents.py)."""

from __future__ import annotations

import asyncio

import pytest

from tests.support import agents
from tests.support.daemon import start_daemon, stop_daemon
from tests.support.scripted import LocalClient, local_gateway

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    d = start_daemon(
        tmp_path_factory.mktemp("talariad"), executor="sim", instance={"time_scale": 0.01}
    )
    yield d.endpoint
    stop_daemon(d)
    d.notify.close()


def _replay(endpoint: str, header: str, session: str) -> agents.Replay:
    return agents.Replay(endpoint, {header: session, "anthropic-version": "2023-06-01"})


@pytest.mark.parametrize("interactive", [False, True], ids=["print", "interactive"])
def test_claude_code_main_conversation_keeps_its_prefix_across_a_sub_agent(endpoint, interactive):
    r = _replay(endpoint, "x-claude-code-session-id", f"cc-sub-{interactive}")
    agents.claude_code_subagent(r, interactive)
    assert r.reuse("main-2") >= 0.95, r.table()
    assert r.branch("main-2") == r.branch("main-1") != r.branch("sub-1")
    assert r.reuse("sub-1") == 0 and r.reuse("sub-3") >= 0.95, r.table()
    if interactive:  # the side calls took branches of their own
        assert len({r.branch("quota"), r.branch("title"), r.branch("main-1")}) == 3


def test_claude_code_compaction_and_resume_reuse_what_they_can(endpoint):
    r = _replay(endpoint, "x-claude-code-session-id", "cc-compact")
    agents.claude_code_compaction_and_resume(r)
    for label in ("main-2", "main-3", "compact", "continued-2", "resumed-2"):
        assert r.reuse(label) >= 0.95, (label, r.table())
    # the compacted conversation is a branch of its own; the old one ages out
    assert r.branch("continued-1") != r.branch("compact")
    # a restart with the date changed in the system prompt: the prefix up to the date is reused
    assert r.branch("resumed-1") == r.branch("continued-2") and r.reuse("resumed-1") >= 0.9


def test_codex_turn_loop_and_resume_reuse_their_whole_previous_prompt(endpoint):
    r = _replay(endpoint, "session_id", "codex-loop")
    agents.codex_turns(r)
    for label in ("codex-2", "codex-3", "codex-resumed"):
        assert r.reuse(label) >= 0.95, (label, r.table())


def test_opencode_task_sub_agent_and_title_keep_the_main_prefix(endpoint):
    r = _replay(endpoint, "x-session-affinity", "oc-1")
    agents.opencode_turns(r)
    assert r.reuse("main-2") >= 0.95 and r.reuse("task-2") >= 0.95, r.table()
    assert len({r.branch("title"), r.branch("main-1"), r.branch("task-1")}) == 3


async def test_an_evicted_branch_is_forgotten_on_every_instance(monkeypatch):
    asked: list[tuple[str, str]] = []
    forget = LocalClient.forget

    async def recorded(self, instance, session):
        asked.append((instance, session))
        return await forget(self, instance, session)

    monkeypatch.setattr(LocalClient, "forget", recorded)
    async with local_gateway(overrides={"sessions": {"max_branches": 2}}) as client:
        branches = []
        for n in range(3):
            body = {
                "model": "tiny-agent",
                "max_tokens": 4,
                "messages": [
                    {"role": "system", "content": f"side task {n}"},
                    {"role": "user", "content": f"part {n}"},
                ],
            }
            r = await client.post("/v1/chat/completions", json=body, headers={"x-session-id": "e"})
            branches.append(r.json()["usage"]["talaria"]["branch"])
        for _ in range(50):  # the forget runs in a task of its own
            if any(s == branches[0] for _, s in asked):
                break
            await asyncio.sleep(0.02)
    assert {i for i, s in asked if s == branches[0]} == {"hot0", "cold0", "agent0"}
    assert all(s == branches[0] for _, s in asked)
