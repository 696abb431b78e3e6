"""Edge checks without processes: request screening, the size-based context bound, readiness
hysteresis, the admin-socket lock and the reload diff."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from talariad import lockfile
from talariad.calls.dialects.chat import ChatCompletionRequest
from talariad.calls.dialects.completions import CompletionRequest
from talariad.calls.dialects.messages import MessagesRequest
from talariad.calls.errors import APIError
from talariad.config import LimitsConfig
from talariad.daemon import _flatten, _live
from talariad.gateway.health import Readiness
from talariad.gateway.limits import (
    _all_fit,
    _raw_fits,
    _strings,
    check_context,
    min_prompt_tokens,
    screen,
)

LIMITS = LimitsConfig()


def _chat(**extra) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    )


@pytest.mark.parametrize(
    "field, value",
    [
        ("logprobs", True),
        ("top_logprobs", 3),
        ("echo", True),
        ("best_of", 2),
        ("suffix", "tail"),
        ("response_format", {"type": "json_object"}),
        ("response_format", {"type": "json_schema", "json_schema": {}}),
    ],
)
def test_unsupported_fields_are_400_naming_the_field(field, value):
    with pytest.raises(APIError) as info:
        screen(_chat(**{field: value}), LIMITS)
    assert info.value.status == 400 and info.value.param == field and field in info.value.message


@pytest.mark.parametrize(
    "extra",
    [
        {"logprobs": False},
        {"best_of": 1},
        {"response_format": {"type": "text"}},
        {"top_k": 40},
        {"metadata": {"user_id": "u"}},
        {"echo": False},
    ],
)
def test_harmless_or_default_values_pass(extra):
    screen(_chat(**extra), LIMITS)


@pytest.mark.parametrize(
    "body",
    [
        _chat(messages=[{"role": "user", "content": b"a\\ud800b".decode("unicode_escape")}]),
        _chat(
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "text", "text": b"\\udfff".decode("unicode_escape")}],
                }
            ]
        ),
        CompletionRequest.model_validate(
            {"model": "m", "prompt": b"x\\udc80".decode("unicode_escape")}
        ),
        MessagesRequest.model_validate(
            {
                "model": "m",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "ok"}],
                "system": b"s\\ud83d".decode("unicode_escape"),
            }
        ),
        _chat(metadata={b"k\\ud800".decode("unicode_escape"): "v"}),
        _chat(
            thinking={b"\\ud800".decode("unicode_escape"): None}
        ),  # found by the fuzz: a null-valued key
    ],
)
def test_lone_surrogates_anywhere_are_400(body):
    with pytest.raises(APIError) as info:
        screen(body, LIMITS)
    assert info.value.status == 400 and "not valid Unicode" in info.value.message
    info.value.message.encode("utf-8")  # the error itself can be sent


def test_valid_astral_text_passes():
    screen(
        _chat(
            messages=[
                {
                    "role": "user",
                    "content": b"emoji \\U0001F600 ok".decode("unicode_escape"),
                }
            ]
        ),
        LIMITS,
    )


def test_message_count_and_string_length_limits():
    small = LimitsConfig(max_messages=2, max_string_chars=30)
    with pytest.raises(APIError, match="3 messages"):
        screen(_chat(messages=[{"role": "user", "content": "a"}] * 3), small)
    with pytest.raises(APIError) as info:
        screen(_chat(messages=[{"role": "user", "content": "x" * 31}]), small)
    assert info.value.param == "messages.0.content"
    screen(_chat(messages=[{"role": "user", "content": "x" * 30}] * 2), small)


_TEXT = st.text(st.sampled_from("ab\u00e9\ud800\U0001f600"), max_size=6)
_JSON = st.recursive(
    st.none() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=12,
)


@given(_JSON, st.integers(0, 5))
def test_the_fast_check_agrees_with_the_named_walk(data, max_chars):
    """`screen` runs the path-free check on every call and the named walk only to name a
    failure: both must judge every string (keys included) alike."""
    expected = all(
        len(t) <= max_chars and not any("\ud800" <= ch <= "\udfff" for ch in t)
        for _, t in _strings(data)
    )
    assert _all_fit(data, max_chars) == expected


def test_deeply_nested_input_does_not_recurse():
    nested: object = "leaf"
    for _ in range(5000):
        nested = [nested]
    screen(_chat(metadata={"deep": nested}), LIMITS)


def test_size_bound_never_exceeds_the_real_token_count():
    """The bound must be a lower bound for every tokenizer whose tokens are at most 32 bytes."""
    text = "def f(x):\\n    return x  # ünïcødé 😀\\n".encode().decode("unicode_escape") * 50
    assert min_prompt_tokens(text, LIMITS) <= len(text.encode()) / 32 + 1
    check_context(text, 16, 8192, LIMITS)  # 2 KB of text is far from 8192 tokens


def test_a_4mb_prompt_is_refused_from_its_size():
    with pytest.raises(APIError) as info:
        check_context("x" * (4 << 20), 16, 8192, LIMITS)
    assert info.value.code == "context_length_exceeded" and info.value.param == "messages"
    with pytest.raises(APIError) as info:
        check_context("short", 9000, 8192, LIMITS)
    assert info.value.param == "max_tokens"


def test_readiness_needs_n_consecutive_misses_and_one_success_to_return():
    r = Readiness(unready_after=3)
    assert not r.ready("a")  # never polled
    assert r.polled("a", True, 0.0)  # the first good poll makes it ready
    assert not r.polled("a", False, 0.25)
    r.polled("a", False, 0.5)
    assert r.ready("a") and r.failed_polls("a") == 2
    assert r.polled("a", False, 0.75)  # the third miss in a row flips it
    assert not r.ready("a")
    r.polled("a", True, 1.0)
    assert r.ready("a")
    r.down("a")
    assert not r.ready("a")


@pytest.mark.proc
def test_second_lock_holder_is_refused_with_the_first_pid(tmp_path):
    sock = str(tmp_path / "admin.sock")
    fd = lockfile.acquire(sock)
    code = (
        "import sys; from talariad import lockfile\n"
        "try:\n lockfile.acquire(sys.argv[1])\nexcept lockfile.Busy as e:\n print(e); sys.exit(1)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, sock], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 1 and f"pid {__import__('os').getpid()}" in r.stdout and sock in r.stdout
    import os

    os.close(fd)
    r = subprocess.run(
        [sys.executable, "-c", code, sock], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0  # released with its holder


def test_reload_diff_classifies_fields():
    flat = _flatten(
        {
            "policy": {"tau_s": 1.0, "gamma": 0.8},
            "models": [{"name": "a", "aliases": ["x"]}],
            "instances": [{"devices": [0, 1]}],
        }
    )
    assert flat == {
        "policy.tau_s": 1.0,
        "policy.gamma": 0.8,
        "models.0.name": "a",
        "models.0.aliases": ["x"],
        "instances.0.devices": [0, 1],
    }
    assert _live("policy.tau_s") and _live("limits.max_body_bytes") and _live("models.3.aliases")
    assert not _live("policy.gamma") and not _live("models.0.name") and not _live("listen.http")


async def test_a_held_call_is_rejected_when_shutdown_closes_the_shell():
    import asyncio
    import time

    from talariad.gateway.routing import RouterShell
    from talariad.router import DecisionKind, Router, RouterKnobs
    from tests.router.router_factories import MODEL, PROFILE, Snaps, call

    knobs = RouterKnobs(queue_timeout_s=60, staleness_s=1e9, heartbeat_s=1e9)
    shell = RouterShell(Router(knobs, {MODEL: PROFILE}))
    # the model not open there and its round full: nowhere to queue it, so the call is held
    shell.router.observe(Snaps()("a", 0.0, models={}, round_load_s=9.0), 0.0)
    t0 = time.monotonic()
    held = asyncio.create_task(shell.place(call("c1"), lambda: time.monotonic() - t0))
    await asyncio.sleep(0.3)
    assert not held.done()
    shell.close()
    decision = await asyncio.wait_for(held, 5)
    assert decision.kind is DecisionKind.OVERLOAD_REJECT and "shutting down" in decision.reason
    assert shell.router.held() == ()


def test_retune_reaches_every_part_of_the_router():
    from talariad.router import Router, RouterKnobs
    from tests.router.router_factories import MODEL, PROFILE

    r = Router(RouterKnobs(tau_s=1.0), {MODEL: PROFILE})
    new = RouterKnobs(tau_s=0.25, queue_limit=3)
    r.retune(new)
    assert all(part.knobs is new for part in (r, r._policy, r._cost, r._view))


def test_admin_socket_gets_mode_0660_and_the_configured_group(tmp_path):
    import grp
    import os
    import socket
    import stat

    from talariad.admin.server import _restrict

    path = tmp_path / "admin.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        mine = grp.getgrall() if os.geteuid() == 0 else [grp.getgrgid(g) for g in os.getgroups()]
        group = next((g for g in mine if g.gr_gid != os.stat(path).st_gid), None)  # not the default
        if group is None:
            pytest.skip("this user belongs to no second group to hand the socket to")
        _restrict(path, group.gr_name)
        st = os.stat(path)
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == group.gr_gid
        with pytest.raises(RuntimeError, match="no group named 'no-such-group'"):
            _restrict(path, "no-such-group")


def _raw(text: str, encoding: str = "utf-8") -> bytes:
    return text.encode(encoding)


@pytest.mark.parametrize(
    "raw, walks",
    [
        (
            _raw(
                '{"model": "m", "messages": [{"role": "user", "content": "h\\u00e9 \\ud83d\\ude00"}]}'
            ),
            True,
        ),
        (_raw('{"model": "m", "messages": [{"role": "user", "content": "h\\u00e9 ok"}]}'), False),
        (_raw('{"model": "m", "messages": [{"role": "user", "content": "hé 😀"}]}'), False),
        (_raw('{"model": "m", "messages": [{"role": "user", "content": "hi"}]}', "utf-16"), True),
        (
            _raw('{"model": "m", "messages": [{"role": "user", "content": "' + "x" * 40 + '"}]}'),
            True,
        ),
    ],
)
def test_the_raw_body_check_passes_only_what_needs_no_walk(raw, walks):
    """A short UTF-8 body without an escaped surrogate cannot hold a long string or a lone
    surrogate; anything else (an escape that may be one, UTF-16, a body longer than the limit)
    is walked."""
    assert _raw_fits(raw, 100) is not walks


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16", "utf-32"])
def test_lone_surrogates_in_any_json_encoding_are_400_with_the_raw_body(encoding):
    text = '{"model": "m", "messages": [{"role": "user", "content": "a\\udc80b"}]}'
    raw = text.encode(encoding)
    body = ChatCompletionRequest.model_validate(json.loads(raw))
    with pytest.raises(APIError) as info:
        screen(body, LIMITS, raw)
    assert "not valid Unicode" in info.value.message


def test_a_string_over_the_limit_is_400_with_the_raw_body():
    small = LimitsConfig(max_string_chars=30)
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 31 + b'"}]}'
    with pytest.raises(APIError) as info:
        screen(ChatCompletionRequest.model_validate_json(raw), small, raw)
    assert info.value.param == "messages.0.content"
    fits = b'{"model": "m", "messages": [{"role": "user", "content": "ok"}]}'
    screen(ChatCompletionRequest.model_validate_json(fits), LIMITS, fits)


def test_unsupported_extra_fields_are_400_with_the_raw_body():
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": true}'
    with pytest.raises(APIError) as info:
        screen(ChatCompletionRequest.model_validate_json(raw), LIMITS, raw)
    assert info.value.param == "logprobs"
