"""A session's continuity at the pool level (issue 37, item 4 and its acceptance), through the
real Envoy of three sim boxes and `talariad epp`, with Anthropic `/v1/messages` bodies shaped like
Claude Code's (tests/support/agents.py): a sub-agent keeps the session on its box and main's next
call reuses its prompt; the picker and the box name a branch alike; a resume whose head changed
in the middle keeps its box and reuses the longest shared prefix; a restarted picker keeps a
session on its box. One pool for the module, failing closed (while the picker is down Envoy
answers 500 rather than round-robin); the picker is restarted last.

Which box served a call: its answer's `usage.talaria.instance` (each box's one instance is named
after the box). The box's branch: `usage.talaria.branch`. The picker's: its decision for the call
(`/calls/<x-request-id>` on its operators' address; the client sets `x-request-id`, Envoy keeps
it and hands it to the picker as the call id)."""

from __future__ import annotations

import copy
import json
import os
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from talaria_pool import devpool
from talariad.calls import routes
from talariad.calls.spec import canonical_prompt
from tests.support import agents
from tests.support.agents import claude_body, claude_system, text_of, user, words
from tests.support.pool import needs_envoy, running_pool

pytestmark = [pytest.mark.e2e, needs_envoy]

ROOT = Path(__file__).resolve().parents[2]
FAILURE_MODE = "fail_closed"
EPP: dict = {}  # the picker's shipped defaults (τ included): what a user runs


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    # the boxes and the picker run `python -m talariad.cli` from their own directories: put this
    # checkout first on their path, or an editable install elsewhere would serve them
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", path)
        workdir = tmp_path_factory.mktemp("sessions")
        with running_pool(workdir, failure_mode=FAILURE_MODE, epp=EPP) as p:
            yield p


@dataclass
class Served:
    """One call as the client saw it: its id, the box that served it, the box's branch."""

    label: str
    request_id: str
    box: str
    branch: str
    prompt: int
    cached: int


@dataclass
class PoolReplay(agents.Replay):
    """`agents.Replay` through the pool's Envoy: each call with an `x-request-id` of its own, and
    the box that served it."""

    admin: str = ""  # the picker's operators' address, for its decisions
    served: list[Served] = field(default_factory=list)

    def messages(self, label: str, body: dict) -> dict:
        rid = f"{label}-{uuid.uuid4()}"
        headers = {**self.headers, "x-request-id": rid}
        r = httpx.post(f"{self.endpoint}/v1/messages", json=body, headers=headers, timeout=120)
        assert r.status_code == 200, (label, r.status_code, r.text[:500], self.table())
        msg = r.json()
        u = msg["usage"]
        prompt = u["input_tokens"] + u["cache_read_input_tokens"]
        self._note(label, prompt, u)
        t = u["talaria"]
        self.served.append(
            Served(label, rid, t["instance"], t["branch"], prompt, u["cache_read_input_tokens"])
        )
        return msg

    def call(self, label: str) -> Served:
        return next(s for s in reversed(self.served) if s.label == label)

    def boxes(self) -> dict[str, str]:
        return {s.label: s.box for s in self.served}

    def decision(self, label: str) -> dict:
        """The picker's decision for the last call labelled `label` (`/calls/ID`)."""
        rid = self.call(label).request_id
        r = httpx.get(f"http://{self.admin}/calls/{rid}", timeout=10)
        assert r.status_code == 200, (label, r.text)
        return r.json()

    def table(self) -> str:
        rows = [f"{'call':<12}{'box':>6}{'prompt':>8}{'reused':>8}{'share':>8}  branch"]
        rows += [
            f"{s.label:<12}{s.box:>6}{s.prompt:>8}{s.cached:>8}{s.cached / s.prompt:>8.1%}"
            f"  {s.branch}"
            for s in self.served
        ]
        return "\n".join(rows)


def replay(pool: devpool.LocalPool, session: str) -> PoolReplay:
    headers = {"x-claude-code-session-id": session, "anthropic-version": "2023-06-01"}
    return PoolReplay(f"http://{pool.gateway}", headers, admin=pool.epp_admin)


def picker_branch(decision: dict) -> str | None:
    """The session branch the picker's decision was for: `branch`, or `session_id` (the router's
    name for what it places: a branch of the client's session)."""
    return decision.get("branch") or decision.get("session_id")


def wait_until(what: str, check: Callable[[], bool], wait_s: float = 30) -> None:
    deadline = time.monotonic() + wait_s
    while not check():
        assert time.monotonic() < deadline, f"never happened in {wait_s} s: {what}"
        time.sleep(0.1)


def main_turns(r: PoolReplay, n: int, seed: int) -> tuple[list[dict], dict]:
    """A main conversation of `n` calls, each resending the whole conversation plus the previous
    answer (text and a tool call) and its tool result; the messages after it and its last body."""
    history = [user(f"Fix the failing test. {words(200, seed)}")]
    body = {}
    for i in range(1, n + 1):
        body = claude_body(claude_system(agents.MAIN_SYSTEM), history)
        answer = r.messages(f"main-{i}", body)
        use = {"type": "tool_use", "id": f"toolu_m{i}", "name": "Tool5", "input": {"path": "x"}}
        result = {"type": "tool_result", "tool_use_id": f"toolu_m{i}", "content": words(40, i)}
        history = history + [
            {"role": "assistant", "content": [{"type": "text", "text": text_of(answer)}, use]},
            {"role": "user", "content": [result]},
        ]
    return history, body


def test_a_sub_agent_keeps_the_session_on_its_box_and_main_reuses_its_prompt(pool):
    """Acceptance: main, its sub-agent's calls, main's next call (on one box main-2 reuses
    99.4%, tests/e2e/test_agent_traffic.py): >= 95% reused, and every call on one box."""
    r = replay(pool, "cc-pool-sub")
    agents.claude_code_subagent(r)
    print(r.table())  # shown with -s: the acceptance's numbers
    assert r.reuse("main-2") >= 0.95, r.table()
    assert len(set(r.boxes().values())) == 1, f"the session moved between boxes:\n{r.table()}"


def test_the_picker_and_the_box_name_a_sub_agents_branch_alike(pool):
    """The branch the box reports for each call is the branch the picker placed. Each box first
    serves a session of its own with a side branch, straight (as another picker replica or a
    direct client would): what a box saw before must not change how a branch is named."""
    for i, box in enumerate(pool.boxes):
        other = agents.Replay(f"http://{box}", {"x-session-id": f"direct-{i}"})
        other.messages("a", claude_body(None, [user(f"first task {i}")], None))
        other.messages("b", claude_body(None, [user(f"another task {i}")], None))
        assert other.branch("a") != other.branch("b"), other.table()
    r = replay(pool, "cc-pool-names")
    agents.claude_code_subagent(r)
    named = {s.label: (s.branch, picker_branch(r.decision(s.label))) for s in r.served}
    keys = sorted(r.decision("sub-1"))
    assert all(p is not None for _, p in named.values()), (
        f"the picker's decision names no branch (its fields: {keys}); "
        f"box vs picker per call: {named}\n{r.table()}"
    )
    assert all(box == picker for box, picker in named.values()), (
        f"box vs picker branch per call: {named}\n{r.table()}"
    )
    # and they are two branches: the sub-agent's is not main's
    assert r.branch("main-2") == r.branch("main-1") != r.branch("sub-1"), r.table()


def resumed_head(history: list[dict]) -> dict:
    """`claude -p --continue`: a few words in the middle of the system prompt and of one tool's
    description rewritten, the whole conversation, then a new user turn."""
    system = agents.MAIN_SYSTEM.split()
    mid = len(system) // 2
    system[mid : mid + 3] = ["resumed", "session", "notice"]
    tools = copy.deepcopy(agents.MAIN_TOOLS)
    desc = tools[12]["description"].split()
    k = len(desc) // 2
    desc[k : k + 2] = ["resumed", "again"]
    tools[12]["description"] = " ".join(desc)
    messages = history + [user("Continue where we left off.")]
    return claude_body(claude_system(" ".join(system)), messages, tools)


def canonical(body: dict) -> str:
    """The prompt text both levels branch on (the box's tokens follow it)."""
    spec = routes.parse("/v1/messages", json.dumps(body).encode())
    return canonical_prompt(spec.messages, spec.prompt, spec.tools).text


def shared_chars(a: str, b: str) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def test_a_resume_with_a_changed_head_keeps_its_box_and_the_shared_prefix(pool):
    """A main conversation, then its resume (`resumed_head`): on the same box, reusing at least
    the prompt before the first changed word. The change in the tool list comes before half the
    head, so one box alone opens a new branch for the resume today and reuses nothing; a change
    in the last tools (more than half the head shared) keeps the branch there and reuses about
    the estimate below (tool 20: 10,482 tokens reused, 10,308 estimated)."""
    r = replay(pool, "cc-pool-resume")
    history, last = main_turns(r, 3, seed=5)
    resumed = resumed_head(history)
    r.messages("resumed-1", resumed)
    boxes = r.boxes()
    assert boxes["resumed-1"] == boxes["main-1"], f"the resume moved box:\n{r.table()}"
    # the part before the first changed word (a tool description's, before the system prompt's),
    # in the box's tokens: its share of the resumed prompt's characters, 10% spared for the
    # tokens cut at the change (the sim's tokenizer takes about 5.6 characters a token here, so
    # a flat 4 would ask for more than the shared prefix holds)
    before, after = canonical(last), canonical(resumed)
    shared = shared_chars(before, after)
    s = r.call("resumed-1")
    expect = int(0.9 * s.prompt * shared / len(after))
    assert s.cached >= expect > 0, (
        f"reused {s.cached} tokens; the {shared} of {len(after)} characters before the first "
        f"change are about {expect / 0.9:.0f}\n{r.table()}"
    )


def restart_picker(pool: devpool.LocalPool) -> None:
    """SIGKILL the picker, start it again on its ports, and wait until Envoy routes through it:
    a probe answered 200 (not failing closed) whose decision the new picker holds."""
    pool.kill("epp", signal.SIGKILL)
    devpool.start_epp(pool, FAILURE_MODE, at=(pool.epp, pool.epp_admin), **EPP)

    def routed_by_new_picker() -> bool:
        rid = f"probe-{uuid.uuid4()}"
        body = claude_body(None, [user("probe")], None, max_tokens=1)
        headers = {"x-session-id": rid, "x-request-id": rid, "anthropic-version": "2023-06-01"}
        a = httpx.post(f"http://{pool.gateway}/v1/messages", json=body, headers=headers, timeout=30)
        if a.status_code != 200:  # Envoy has no picker yet: it fails closed
            return False
        return httpx.get(f"http://{pool.epp_admin}/calls/{rid}", timeout=5).status_code == 200

    wait_until("Envoy routes through the restarted picker", routed_by_new_picker)


def brief(decision: dict) -> dict:
    """A decision without its candidates, with each box's cost and KV state in one line."""
    out = {k: v for k, v in decision.items() if k != "candidates"}
    out["boxes"] = {
        c["instance"]: (round(c["total_s"], 3), c["kv_state"]) for c in decision["candidates"]
    }
    return out


def test_a_restarted_picker_keeps_the_session_on_its_box(pool):
    """Near the end of the module (the picker is restarted): after a session's first calls, a
    restarted picker sends its next call to its box, which reuses its prompt."""
    r = replay(pool, "cc-pool-restart")
    history, _ = main_turns(r, 2, seed=7)
    home = r.call("main-1").box
    assert r.call("main-2").box == home and r.reuse("main-2") >= 0.95, r.table()
    restart_picker(pool)
    r.messages("main-3", claude_body(claude_system(agents.MAIN_SYSTEM), history))
    decision = brief(r.decision("main-3"))
    assert r.call("main-3").box == home, f"moved after the restart ({decision}):\n{r.table()}"
    assert r.reuse("main-3") >= 0.95, f"{decision}\n{r.table()}"


def test_a_restarted_picker_keeps_a_sub_agents_session_on_its_boxes(pool):
    """The picker restarted while a sub-agent runs: the sub-agent's next call and main's next
    call each go to the box that served their branch before, and reuse their prompt there."""
    r = replay(pool, "cc-pool-restart-sub")
    task = "Use a subagent to change the greeting in hello.py from Hello to Hi."
    main = [user(f"<system-reminder>{words(300, 4)}</system-reminder>\n{task}")]
    first = r.messages("main-1", claude_body(claude_system(agents.MAIN_SYSTEM), main))
    sub = [user("Change the greeting in hello.py from Hello to Hi, then report.")]
    for n in range(1, 4):
        if n == 3:
            restart_picker(pool)
        body = claude_body(claude_system(agents.SUB_SYSTEM), sub, agents.SUB_TOOLS)
        answer = r.messages(f"sub-{n}", body)
        use = {"type": "tool_use", "id": f"toolu_s{n}", "name": "Tool5", "input": {"path": "x"}}
        result = {"type": "tool_result", "tool_use_id": f"toolu_s{n}", "content": words(40, n)}
        sub = sub + [
            {"role": "assistant", "content": [{"type": "text", "text": text_of(answer)}, use]},
            {"role": "user", "content": [result]},
        ]
    use = {"type": "tool_use", "id": "toolu_agent", "name": "Agent", "input": {"prompt": "Hi"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_agent", "content": "Changed it."}
    main = main + [
        {"role": "assistant", "content": [{"type": "text", "text": text_of(first)}, use]},
        {"role": "user", "content": [result]},
    ]
    r.messages("main-2", claude_body(claude_system(agents.MAIN_SYSTEM), main))
    after = {label: brief(r.decision(label)) for label in ("sub-3", "main-2")}
    boxes = r.boxes()
    assert (boxes["sub-3"], boxes["main-2"]) == (boxes["sub-2"], boxes["main-1"]), (
        f"moved after the restart: {after}\n{r.table()}"
    )
    assert r.reuse("sub-3") >= 0.95 and r.reuse("main-2") >= 0.95, f"{after}\n{r.table()}"
