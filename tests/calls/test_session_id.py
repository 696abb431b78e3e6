from talariad.calls.session import session_headers, session_id

MSGS = [("system", "you are an agent"), ("user", "fix bug 12"), ("assistant", "ok")]


def test_header_wins_over_body():
    assert session_id({"x-session-id": "h1"}, {"user": "u"}, MSGS) == "h1"
    assert session_id({"x-claude-code-session-id": "cc"}, {"prompt_cache_key": "k"}, MSGS) == "cc"


def test_body_fields_in_order():
    assert session_id({}, {"prompt_cache_key": "k", "user": "u"}, MSGS) == "k"
    assert session_id({}, {"user": "u"}, MSGS) == "u"
    uid = "user_abc_account_123_session_9f8e"
    assert session_id({}, {"metadata": {"user_id": uid}}, MSGS) == "9f8e"


def test_fallback_hash_is_stable_across_turns_and_distinct_across_tasks():
    later = MSGS + [("tool", "output"), ("assistant", "done")]
    assert session_id({}, {}, MSGS) == session_id({}, {}, later)
    assert session_id({}, {}, MSGS) != session_id(
        {}, {}, [("system", "you are an agent"), ("user", "fix bug 13")]
    )


def test_calls_with_nothing_to_hash_do_not_share_a_session():
    only_tools = [("assistant", "ok"), ("tool", "3 passed")]
    assert session_id({}, {}, only_tools) != session_id({}, {}, only_tools)


def test_agent_session_headers_in_the_documented_order():
    order = [
        "x-session-id",
        "x-claude-code-session-id",
        "x-session-affinity",
        "session-id",
        "session_id",
    ]
    for i, name in enumerate(order):
        headers = {h: h for h in order[i:]}
        assert session_id(headers, {"prompt_cache_key": "k"}, MSGS) == name


def test_claude_code_json_user_id_names_the_session():
    uid = '{"device_id": "d", "account_uuid": "", "session_id": "3f2a"}'
    assert session_id({}, {"metadata": {"user_id": uid}}, MSGS) == "3f2a"
    assert session_id({}, {"metadata": {"user_id": "{not json"}}, MSGS).startswith("anon-")


def test_session_headers_come_from_the_raw_headers_first_of_each_name():
    from starlette.datastructures import Headers

    raw = Headers(
        raw=[
            (b"content-type", b"application/json"),
            (b"x-session-id", b"first"),
            (b"x-session-id", b"second"),
            (b"session_id", b"codex"),
        ]
    )
    found = session_headers(raw)
    assert found == {"x-session-id": "first", "session_id": "codex"}
    assert session_id(found, {}, MSGS) == session_id(raw, {}, MSGS) == "first"
    plain = {"x-session-affinity": "oc"}
    assert session_headers(plain) is plain
