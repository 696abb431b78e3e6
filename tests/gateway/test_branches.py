"""The branch index: a call joins the branch it shares the most with, unless it shares no more
than its head (tools and system prompt); bounds evict least recently used branches everywhere."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from talariad.calls.branches import PrefixBranches, Prompt, common_prefix
from talariad.calls.spec import canonical_prompt
from talariad.gateway.routing import RouterShell
from talariad.router import Router, RouterKnobs
from talariad.wire.messages import ChatMessage, ToolCall


def _tool(name: str, size: int = 300) -> dict:
    return {"name": name, "description": f"{name} " + "does one careful thing. " * (size // 24)}


AGENT = _tool("Agent", 2571)
MAIN_TOOLS = [AGENT] + [_tool(f"Main{i}") for i in range(23)]
SUB_TOOLS = [AGENT] + [_tool(f"Sub{i}") for i in range(20)]


def _prompt(system: str, turns: list[str], tools: list[dict] = MAIN_TOOLS) -> Prompt:
    msgs = [ChatMessage(role="system", content=system)]
    for i, t in enumerate(turns):
        msgs.append(ChatMessage(role="user" if i % 2 == 0 else "assistant", content=t))
    return canonical_prompt(msgs, None, tools)


def _call(b: PrefixBranches, p: Prompt, answer: str = "ok", session: str = "s") -> tuple[str, int]:
    name, covered = b.branch_covered(session, "m", p)
    b.remember(session, "m", name, p, answer)
    return name, covered


def test_canonical_prompt_marks_the_head_and_the_first_turn():
    p = _prompt("rules", ["fix it", "done", "thanks"])
    head = p.text[: p.head]
    assert head.endswith("<|system|> rules\n") and "<|user|>" not in head
    assert p.text[p.head :].startswith("<|user|> fix it")
    assert p.thread == _prompt("other rules", ["fix it"]).thread
    assert p.thread != _prompt("rules", ["fix that"]).thread
    assert p.text[p.head : p.first] == "<|user|> fix it\n"
    assert canonical_prompt([], "raw text", []) == Prompt("raw text", 0, 8)


def test_a_sub_agent_sharing_the_first_tool_does_not_take_the_main_branch():
    """The issue's case: the sub-agent's tools start with the same long `Agent` tool."""
    b = PrefixBranches(max_branches=4)
    main1 = _prompt("main rules " * 200, ["Use a subagent to change the greeting."])
    main, _ = _call(b, main1, "I will delegate.")
    sub_turns = ["Change Hello to Hi in hello.py."]
    sub1 = _prompt("sub rules", sub_turns, SUB_TOOLS)
    sub, covered, source = b.branched("s", "m", sub1)
    b.remember("s", "m", sub, sub1, "ok")
    # a branch of its own; what it shares (the Agent tool) is main's context, where main lives
    assert sub != main and source == main and covered == common_prefix(sub1.text, main1.text) > 0
    for _ in range(2):  # the sub-agent's loop continues its own branch
        sub_turns += ["ok", "next"]
        again, covered = _call(b, _prompt("sub rules", sub_turns, SUB_TOOLS))
        assert again == sub and covered > 0
    main2 = _prompt("main rules " * 200, ["Use a subagent to change the greeting.", "x", "done"])
    name, covered = _call(b, main2)
    assert name == main and covered >= len(main1.text)  # its whole previous prompt


def test_covered_is_the_prompt_and_answer_when_the_next_prompt_continues_both():
    b = PrefixBranches(max_branches=2)
    first = Prompt.raw("<|user|> fix it\n")
    name, covered = _call(b, first, "done")
    assert covered == 0
    nxt = Prompt.raw(first.text + "done<|user|> thanks\n")
    assert b.branch_covered("s", "m", nxt) == (name, len(first.text + "done"))


def test_a_rewrite_that_shares_more_than_the_head_keeps_its_branch():
    b = PrefixBranches(max_branches=4)
    one = _prompt("rules", ["fix the build", "looking", "and test it"])
    name, _ = _call(b, one)
    retry = _prompt("rules", ["fix the build", "looking", "and lint it"])
    again, covered = _call(b, retry)
    assert again == name and covered == retry.text.index("lint")
    assert b.names("s", "m") == [name]


def test_compaction_opens_a_branch_and_the_old_one_ages_out():
    b = PrefixBranches(max_branches=2)
    long = _prompt("rules", ["fix it", "a long answer " * 50, "summarize the conversation"])
    old, _ = _call(b, long)
    compacted = _prompt("rules", ["Summary: fixed the build; continue."])
    new, covered = _call(b, compacted)
    assert new != old and compacted.head <= covered < compacted.first  # the head, shared
    nxt, covered = _call(b, _prompt("rules", ["Summary: fixed the build; continue.", "ok", "go"]))
    assert nxt == new and covered >= len(compacted.text)
    title, _ = _call(b, _prompt("title rules", ["name it"], []))
    assert b.names("s", "m") == [new, title]  # the old main branch aged out


def test_the_same_conversation_under_a_changed_system_prompt_keeps_its_branch():
    """A resume (same session id) with the date in the system prompt changed."""
    b = PrefixBranches(max_branches=4)
    turns = ["fix it", "done", "thanks"]
    name, _ = _call(b, _prompt("rules. Today is 2025-01-01. Be brief.", turns))
    resumed = _prompt("rules. Today is 2025-01-02. Be brief.", turns + ["ok", "more"])
    again, covered = _call(b, resumed)
    assert again == name and covered == resumed.text.index("2. Be")
    title = _prompt("Write a title.", ["fix it"], [])  # the same first turn, nothing else shared
    assert _call(b, title)[0] != name


def test_a_branch_is_named_from_its_content_the_same_in_every_index():
    """A box's gateway and the pool's picker (or a restarted picker, which saw none of the
    session) name the same branch alike, whatever else each has seen."""
    main = _prompt("main rules " * 50, ["Use a subagent.", "ok", "go on"])
    sub = _prompt("sub rules", ["Change Hello to Hi."], SUB_TOOLS)
    title = _prompt("Write a title.", ["Use a subagent."], [])
    box, picker, restarted = (PrefixBranches(max_branches=4) for _ in range(3))
    names = [_call(box, p)[0] for p in (main, sub, title)]
    assert [_call(picker, p)[0] for p in (sub, main, title)] == [names[1], names[0], names[2]]
    assert _call(restarted, main)[0] == names[0] and _call(restarted, sub)[0] == names[1]
    assert all(n.startswith("s~") for n in names) and len(set(names)) == 3
    # the title shares main's first turn: its name adds a key of its head
    assert names[2].startswith(names[0] + "~")


def test_a_title_call_with_the_first_turn_alone_does_not_take_the_conversation_over():
    b = PrefixBranches(max_branches=4)
    name, _ = _call(b, _prompt("rules", ["fix it"]))
    assert _call(b, _prompt("Write a title.", ["fix it"], []))[0] != name
    assert _call(b, _prompt("rules", ["fix it", "done", "more"]))[0] == name


def test_bounds_evict_the_least_recently_used_branch_and_report_it():
    evicted: list[str] = []
    b = PrefixBranches(max_branches=2, max_sessions=2)
    b.on_evict = evicted.append
    names = [_call(b, _prompt(f"system {i}", [f"task {i}"], []))[0] for i in range(3)]
    assert b.names("s", "m") == names[1:] and evicted == [names[0]]
    _call(b, _prompt("x", ["hi"], []), session="t")
    _call(b, _prompt("x", ["hi"], []), session="u")  # three sessions: s goes, both branches
    assert b.names("s", "m") == [] and evicted == names
    (u,) = b.names("u", "m")
    assert b.forget("u") == sorted({"u", u}) and b.names("u", "m") == []


def test_the_byte_bound_evicts_across_sessions_but_keeps_the_calls_own_branch():
    evicted: list[str] = []
    b = PrefixBranches(max_branches=4, max_bytes=30_000)
    b.on_evict = evicted.append
    names = [_call(b, Prompt.raw("x" * 12_000), session=s)[0] for s in "abc"]
    assert evicted == names[:1] and b.bytes <= 30_000
    d, _ = _call(b, Prompt.raw("y" * 50_000), session="d")  # alone over the bound: it stays
    assert b.names("d", "m") == [d] and set(evicted) == set(names)


def test_a_branch_evicted_while_its_call_ran_comes_back_when_it_finishes():
    b = PrefixBranches(max_branches=1)
    p = _prompt("rules", ["one"])
    name, _ = b.branch_covered("s", "m", p)
    other, _ = b.branch_covered("s", "m", _prompt("other", ["two"], []))
    b.remember("s", "m", name, p, "answer")
    assert b.names("s", "m") == [name]  # back, and the other one went
    assert b.forget("s") == sorted({"s", name})
    assert other not in b._names


def test_shell_eviction_forgets_the_branch_in_the_router_and_on_the_instances():
    from tests.router.router_factories import MODEL, PROFILE

    shell = RouterShell(Router(RouterKnobs(), {MODEL: PROFILE}), PrefixBranches(max_branches=1))
    asked: list[str] = []
    shell.evicted = asked.append
    first, _ = shell.branches.branch_covered("s", "m", _prompt("a", ["hi"], []))
    resumed = _prompt("b", ["hi", "ok", "more"], [])
    assert shell.branches.branch_covered("s", "m", resumed)[0] == first
    shell.router._sessions.touch(first, "i0", "m", 10, 0.0)
    shell.branches.branch_covered("s", "m", _prompt("b", ["a sub-agent's task"], []))
    assert asked == [first] and [e.session_id for e in shell.router.sessions()] == []


def test_shared_is_the_longest_common_prefix():
    assert common_prefix("abcdef", "abcxyz") == 3 and common_prefix("abc", "abcdef") == 3
    assert common_prefix("", "a") == 0 and common_prefix("x", "y") == 0


@given(st.text("ab\u00e9\U0001f600", max_size=40), st.text("ab\u00e9\U0001f600", max_size=40))
def test_shared_agrees_with_comparing_character_by_character(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert common_prefix(a, b) == n


# ---- the property: up to 8 threads of one session, interleaved ----------------------------------

HEAD = [_tool(f"T{i}", 120) for i in range(6)]


def _thread_prompt(k: int, turns: int) -> Prompt:
    msgs = [ChatMessage(role="system", content="shared rules " * 20)]
    msgs.append(ChatMessage(role="user", content=f"thread {k}: task number {k} " * 3))
    for t in range(turns):
        call = ToolCall(id=f"c{k}-{t}", name="T1", arguments={"path": f"f{k}{t}"})
        msgs.append(ChatMessage(role="assistant", content=f"step {t}", tool_calls=[call]))
        msgs.append(ChatMessage(role="tool", content=f"result {k}.{t}", tool_call_id=call.id))
    return canonical_prompt(msgs, None, HEAD)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 8),
    st.integers(1, 8),
    st.lists(st.integers(0, 7), min_size=1, max_size=60),
    st.integers(2_000, 60_000),
)
def test_interleaved_threads_reuse_their_whole_previous_prompt_while_capacity_allows(
    threads, max_branches, order, max_bytes
):
    evicted: list[str] = []
    b = PrefixBranches(max_branches=max_branches, max_sessions=4, max_bytes=max_bytes)
    b.on_evict = evicted.append
    turns = [0] * threads
    last: dict[int, tuple[str, str]] = {}  # thread -> (branch, its previous prompt)
    for k in (i % threads for i in order):
        p = _thread_prompt(k, turns[k])
        name, covered = b.branch_covered("s", "m", p)
        b.remember("s", "m", name, p, f"step {turns[k]}")
        if k in last and last[k][0] not in evicted:
            # its branch survived: the thread continues it and reuses its whole previous prompt
            assert name == last[k][0] and covered >= len(last[k][1])
        if k in last and last[k][0] != name:
            evicted.append(last[k][0])  # count it gone for this thread from here on
        last[k] = (name, p.text)
        turns[k] += 1
        live = b.names("s", "m")
        assert len(live) <= max_branches and len(set(live)) == len(live)
        assert b.bytes <= max(max_bytes, _size(p)) and len(b._trees) <= 4
        assert b.bytes == sum(x.size() for t in b._trees.values() for x in t.values())
    assert len(b._names) == sum(len(t) for t in b._trees.values())


def _size(p: Prompt) -> int:
    import sys

    return sys.getsizeof(p.text) + sys.getsizeof("step 99")
