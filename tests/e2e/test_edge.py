"""End to end: bad input is refused at the edge and never reaches an instance; access control;
one daemon per admin socket. One sim-executor daemon for the module."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time

import httpx
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.daemon import ROOT, start_daemon, stop_daemon

pytestmark = pytest.mark.e2e

HEAD_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
SURROGATE = "a\ud800b"
CHAT = [{"role": "user", "content": "Fix the failing test."}]


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    d = start_daemon(
        tmp_path_factory.mktemp("edge"),
        {"limits": {"header_timeout_s": HEAD_TIMEOUT_S, "body_timeout_s": BODY_TIMEOUT_S}},
        executor="sim",
    )
    yield d
    stop_daemon(d)
    d.notify.close()


def _raw(d, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    # json.dumps escapes the lone surrogate as \ud800, the way a JSON client would send it
    return httpx.post(
        f"{d.endpoint}{path}",
        content=json.dumps(body),
        timeout=30,
        headers={"content-type": "application/json", **(headers or {})},
    )


def _served(d) -> float:
    """Calls that reached an instance and finished, from the gateway's own counter."""
    text = httpx.get(f"{d.endpoint}/metrics", timeout=10).text
    return sum(
        float(ln.rsplit(" ", 1)[1])
        for ln in text.splitlines()
        if ln.startswith("talaria_requests_finished_total{")
    )


BODIES = {
    "/v1/chat/completions": {
        "model": "tiny-chat",
        "messages": [{"role": "user", "content": SURROGATE}],
        "max_tokens": 4,
    },
    "/v1/completions": {"model": "tiny-chat", "prompt": SURROGATE, "max_tokens": 4},
    "/v1/messages": {
        "model": "tiny-chat",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": SURROGATE}],
    },
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("session", [None, "s-surrogate"])
@pytest.mark.parametrize("path", list(BODIES))
def test_lone_surrogate_is_400_on_every_api(edge, path, stream, session):
    before = _served(edge)
    headers = {"x-session-id": session} if session else {}
    r = _raw(edge, path, {**BODIES[path], "stream": stream}, headers)
    assert r.status_code == 400 and "Retry-After" not in r.headers
    body = r.json()
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    else:
        assert body["error"]["type"] == "invalid_request_error"
    assert "lone surrogate" in body["error"]["message"]  # found where the body is decoded
    assert _served(edge) == before  # nothing reached an instance


def test_invalid_utf8_bytes_are_400(edge):
    r = httpx.post(
        f"{edge.endpoint}/v1/chat/completions",
        timeout=30,
        headers={"content-type": "application/json"},
        content=b'{"model": "tiny-chat", "messages": [{"role": "user", "content": "a\xff\xfe"}]}',
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


RAW_BODIES = {
    "/v1/chat/completions": b'{"model": "tiny-chat", "max_tokens": 2, "messages": '
    b'[{"role": "user", "content": "a\xed\xa0\x80b"}]}',
    "/v1/completions": b'{"model": "tiny-chat", "max_tokens": 2, "prompt": "a\xed\xa0\x80b"}',
    "/v1/messages": b'{"model": "tiny-chat", "max_tokens": 2, "messages": '
    b'[{"role": "user", "content": "a\xed\xa0\x80b"}]}',
    "/v1/messages/count_tokens": b'{"model": "tiny-chat", "messages": '
    b'[{"role": "user", "content": "a\xed\xa0\x80b"}]}',
    "/v1/responses": b'{"model": "tiny-chat", "max_output_tokens": 2, "input": "a\xed\xa0\x80b"}',
}


@pytest.mark.parametrize("path", list(RAW_BODIES))
def test_encoded_surrogate_bytes_are_400_on_every_api(edge, path):
    """U+D800 encoded as if it were a character: not UTF-8, so refused before any instance."""
    before = _served(edge)
    r = httpx.post(
        f"{edge.endpoint}{path}",
        content=RAW_BODIES[path],
        timeout=30,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and "retry-after" not in r.headers, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and "UTF-8" in error["message"]
    assert _served(edge) == before


def test_count_tokens_refuses_a_lone_surrogate_and_a_prompt_that_cannot_fit(edge):
    for content in ("a\ud800b", "word " * 200_000):  # 1 MB cannot fit tiny-chat's 8192 tokens
        body = {"model": "tiny-chat", "messages": [{"role": "user", "content": content}]}
        r = _raw(edge, "/v1/messages/count_tokens", body)
        assert r.status_code == 400 and "retry-after" not in r.headers, r.text
        assert r.json()["error"]["type"] == "invalid_request_error"


def test_a_trickled_body_is_408_after_the_body_timeout(edge):
    host, port = edge.endpoint.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10 * BODY_TIMEOUT_S) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{"
        )
        answer, deadline = b"", time.monotonic() + 10 * BODY_TIMEOUT_S  # a guard only
        s.settimeout(BODY_TIMEOUT_S / 4)
        while not answer and time.monotonic() < deadline:  # a body byte at a time
            try:
                s.sendall(b" ")
                answer = s.recv(1024)
            except TimeoutError:
                continue
        assert answer.startswith(b"HTTP/1.1 408")


def _head_only(d, path: str, length: int, sent: bytes) -> tuple[int, bytes]:
    """Send a request head announcing `length` body bytes but only `sent` of them; read the answer."""
    host, port = d.endpoint.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n".encode()
            + sent
        )
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < 20:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.mark.parametrize(
    "path, shape", [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic")]
)
def test_oversized_body_is_413_before_the_body_is_read(edge, path, shape):
    # 9 MiB announced, 1 KiB sent: the answer can only come from the Content-Length
    status, body = _head_only(edge, path, 9 << 20, b"{" + b" " * 1023)
    assert status == 413
    text = body.decode(errors="replace")
    assert ("request_too_large" in text) and ('"type":"error"' in text.replace(" ", "")) == (
        shape == "anthropic"
    )


def test_oversized_body_sent_whole_gets_413_not_a_reset(edge):
    with httpx.Client(timeout=30) as client:  # one kept-alive connection: it survives each refusal
        for _ in range(3):
            r = client.post(
                f"{edge.endpoint}/v1/chat/completions",
                content=b"x" * (9 << 20),
                headers={"content-type": "application/json"},
            )
            assert r.status_code == 413 and "limits.max_body_bytes" in r.json()["error"]["message"]
        r = client.post(
            f"{edge.endpoint}/v1/chat/completions",
            json={"model": "tiny-chat", "messages": CHAT, "max_tokens": 2},
        )
        assert r.status_code == 200


def test_4mb_prompt_is_refused_without_reaching_an_instance(edge):
    before = _served(edge)
    r = _raw(
        edge,
        "/v1/chat/completions",
        {
            "model": "tiny-chat",
            "messages": [{"role": "user", "content": "word " * 800_000}],
            "max_tokens": 4,
        },
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "judged from its size" in r.json()["error"]["message"] and _served(edge) == before


@pytest.mark.parametrize("trickle", [False, True])
def test_partial_header_connection_is_closed_after_the_header_timeout(edge, trickle):
    host, port = edge.endpoint.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10 * HEAD_TIMEOUT_S) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # never finished
        deadline = time.monotonic() + 10 * HEAD_TIMEOUT_S
        while trickle and time.monotonic() < deadline:  # one header byte at a time, slowloris style
            try:
                s.sendall(b"X")
            except OSError:  # reset: closed by the server
                return
            s.settimeout(HEAD_TIMEOUT_S / 4)
            try:
                if s.recv(1024) == b"":
                    return
            except TimeoutError:
                continue
            except OSError:  # reset: closed by the server with a trickled byte still unread
                return
        assert s.recv(1024) == b""  # closed by the server (a hang would raise socket.timeout)


@pytest.mark.parametrize(
    "field, value",
    [
        ("logprobs", True),
        ("top_logprobs", 2),
        ("response_format", {"type": "json_object"}),
        ("echo", True),
        ("best_of", 3),
        ("suffix", "}"),
        ("n", 2),
    ],
)
def test_unsupported_fields_are_400_naming_the_field(edge, field, value):
    path = "/v1/completions" if field in ("echo", "best_of", "suffix") else "/v1/chat/completions"
    body = {
        "model": "tiny-chat",
        "max_tokens": 2,
        field: value,
        **({"prompt": "hi"} if path == "/v1/completions" else {"messages": CHAT}),
    }
    r = _raw(edge, path, body)
    assert (
        r.status_code == 400
        and field in r.json()["error"]["message"]
        and r.json()["error"]["param"] == field
    )


def test_documented_harmless_fields_are_ignored(edge):
    r = _raw(
        edge,
        "/v1/chat/completions",
        {
            "model": "tiny-chat",
            "messages": CHAT,
            "max_tokens": 2,
            "top_k": 20,
            "metadata": {"run": "x"},
            "response_format": {"type": "text"},
        },
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def _config(d) -> dict:
    import yaml

    return yaml.safe_load(d.config_path.read_text())


def test_health_and_ready_report_each_instance(edge):
    cfg = _config(edge)
    names = {i["name"] for i in cfg["instances"]}
    h, r = (
        httpx.get(f"{edge.endpoint}/health", timeout=10),
        httpx.get(f"{edge.endpoint}/ready", timeout=10),
    )
    assert (
        h.status_code == 200 and r.status_code == 200 and set(h.json()["instances_ready"]) == names
    )
    rows = {i["name"]: i for i in r.json()["instances"]}
    assert set(rows) == names and all(i["state"] == "ready" and i["ready"] for i in rows.values())
    assert all(0 <= i["telemetry_age_s"] < 5 for i in rows.values())
    assert r.json()["models"] == {
        m["name"]: [i["name"] for i in cfg["instances"] if m["name"] in i["models"]]
        for m in cfg["models"]
    }


def test_admin_socket_is_0660(edge):
    mode = os.stat(edge.socket_path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o660


def _instance_ports(d) -> list[int]:
    ports = []
    for child in d.children():
        ports += [
            c.laddr.port
            for c in child.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN
        ]
    return ports


@pytest.mark.parametrize("headers", [{}, {"x-talaria-token": "guess"}])
@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/internal/telemetry"),
        ("POST", "/internal/count_tokens"),
        ("POST", "/internal/abort"),
        ("GET", "/health"),
    ],
)
def test_internal_api_refuses_requests_without_the_token(edge, headers, method, path):
    ports = _instance_ports(edge)
    assert len(ports) == len(_config(edge)["instances"])
    for port in ports:
        r = httpx.request(
            method,
            f"http://127.0.0.1:{port}{path}",
            headers=headers,
            timeout=10,
            json={"call_id": "x", "model": "tiny-chat", "prompt": "hi", "max_tokens": 1},
        )
        assert r.status_code == 401
    # the daemon itself still gets through
    assert httpx.get(f"{edge.endpoint}/ready", timeout=10).status_code == 200


def test_second_daemon_on_the_same_socket_exits_1_and_leaves_the_first_alone(edge):
    r = subprocess.run(
        [sys.executable, "-m", "talariad.cli", "run", "--config", str(edge.config_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=edge.config_path.parent,
    )
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pid {edge.proc.pid}" in lines[0] and edge.socket_path in lines[0]
    assert stat.S_ISSOCK(os.stat(edge.socket_path).st_mode)
    ctl = subprocess.run(
        [
            sys.executable,
            "-m",
            "talaria_ctl.main",
            "--socket",
            edge.socket_path,
            "status",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert ctl.returncode == 0 and json.loads(ctl.stdout)["http_endpoint"] == edge.endpoint


# -- fuzz: bounded, reproducible (derandomize), against the live daemon --------------------------


_TEXT = st.lists(
    st.one_of(st.characters(), st.sampled_from(["\ud800", "\udfff", "\x00", "<|user|>"])),
    max_size=12,
).map("".join)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | _TEXT,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(_TEXT, c, max_size=3),
    max_leaves=6,
)
_MODEL = st.sampled_from(["tiny-chat", "tiny-code", "nope", ""]) | _JSON
_PART = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "tool_result", "tool_use"]) | _JSON},
    optional={"text": _TEXT | _JSON, "content": _TEXT | _JSON},
)
_COMMON = {
    "max_tokens": st.integers(-2, 12) | _JSON,
    "temperature": st.floats(-1, 3) | _JSON,
    "stream": st.booleans() | _JSON,
    "stop": _TEXT | st.lists(_TEXT, max_size=2) | _JSON,
    "seed": st.integers(-(2**64), 2**64),
    "n": st.integers(0, 3),
    "top_p": st.floats(-1, 2),
    "logprobs": _JSON,
    "response_format": _JSON,
    "metadata": _JSON,
    "top_k": _JSON,
}
_VALID = st.sampled_from(["tiny-chat", "tiny-code"])
_SAMPLING = {
    "stream": st.booleans(),
    "temperature": st.floats(0, 1),
    "stop": _TEXT | st.lists(_TEXT, max_size=2),
    "seed": st.integers(0, 2**32),
}


def _two_to_one(valid, junk):
    """Mostly well-formed bodies with fuzzed text (they reach placement and instances), some junk."""
    return st.one_of(valid, valid, junk)


_CHAT = _two_to_one(
    st.fixed_dictionaries(
        {
            "model": _VALID,
            "max_tokens": st.integers(1, 6),
            "messages": st.lists(
                st.fixed_dictionaries(
                    {
                        "role": st.sampled_from(["system", "user", "assistant"]),
                        "content": _TEXT
                        | st.lists(
                            st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT}),
                            max_size=2,
                        ),
                    }
                ),
                min_size=1,
                max_size=3,
            ),
        },
        optional=_SAMPLING,
    ),
    st.fixed_dictionaries(
        {
            "model": _MODEL,
            "messages": st.lists(
                st.fixed_dictionaries(
                    {
                        "role": st.sampled_from(["system", "user", "assistant", "tool", "bogus"]),
                        "content": _TEXT | st.lists(_PART, max_size=2) | _JSON,
                    }
                ),
                max_size=3,
            )
            | _JSON,
        },
        optional={
            **_COMMON,
            "stream_options": _JSON | st.just({"include_usage": True}),
            "tools": _JSON,
        },
    ),
)
_COMPLETION = _two_to_one(
    st.fixed_dictionaries(
        {"model": _VALID, "prompt": _TEXT.filter(str.strip), "max_tokens": st.integers(1, 6)},
        optional=_SAMPLING,
    ),
    st.fixed_dictionaries(
        {"model": _MODEL, "prompt": _TEXT | st.lists(_TEXT, max_size=2) | _JSON},
        optional={**_COMMON, "echo": _JSON, "suffix": _JSON, "best_of": _JSON},
    ),
)
_MESSAGES = _two_to_one(
    st.fixed_dictionaries(
        {
            "model": _VALID,
            "max_tokens": st.integers(1, 6),
            "messages": st.lists(
                st.fixed_dictionaries(
                    {
                        "role": st.just("user"),
                        "content": _TEXT
                        | st.lists(
                            st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT}),
                            min_size=1,
                            max_size=2,
                        ),
                    }
                ),
                min_size=1,
                max_size=2,
            ),
        },
        optional={
            "system": _TEXT,
            "stream": st.booleans(),
            "thinking": _JSON,
            "stop_sequences": st.lists(_TEXT, max_size=2),
        },
    ),
    st.fixed_dictionaries(
        {
            "model": _MODEL,
            "max_tokens": st.integers(-2, 12) | _JSON,
            "messages": st.lists(
                st.fixed_dictionaries(
                    {
                        "role": st.sampled_from(["user", "assistant", "system"]),
                        "content": _TEXT | st.lists(_PART, max_size=2),
                    }
                ),
                max_size=3,
            )
            | _JSON,
        },
        optional={
            "system": _TEXT | st.lists(_PART, max_size=2) | _JSON,
            "stream": st.booleans(),
            "stop_sequences": st.lists(_TEXT, max_size=2) | _JSON,
            "temperature": st.floats(-1, 2),
            "thinking": _JSON,
            "tools": _JSON,
            "metadata": _JSON,
        },
    ),
)
_FUZZ = settings(
    max_examples=20,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _no_5xx(d, path: str, content: bytes) -> None:
    with (
        httpx.Client(timeout=60) as c,
        c.stream(
            "POST",
            f"{d.endpoint}{path}",
            content=content,
            headers={"content-type": "application/json"},
        ) as r,
    ):
        r.read()
        assert r.status_code < 500, (content[:300], r.status_code, r.text[:300])


def _dump(body) -> bytes:
    return json.dumps(body, ensure_ascii=True).encode()


@_FUZZ
@given(body=_CHAT)
def test_fuzz_chat_never_5xx(edge, body):
    _no_5xx(edge, "/v1/chat/completions", _dump(body))


@_FUZZ
@given(body=_COMPLETION)
def test_fuzz_completions_never_5xx(edge, body):
    _no_5xx(edge, "/v1/completions", _dump(body))


@_FUZZ
@given(body=_MESSAGES)
def test_fuzz_messages_never_5xx(edge, body):
    _no_5xx(edge, "/v1/messages", _dump(body))


@_FUZZ
@given(raw=st.binary(max_size=48), path=st.sampled_from(list(BODIES)))
def test_fuzz_raw_bytes_never_5xx(edge, raw, path):
    _no_5xx(edge, path, raw)


def test_daemon_is_still_ready_after_the_fuzz(edge):
    assert httpx.get(f"{edge.endpoint}/ready", timeout=10).status_code == 200
    assert all(p.is_running() for p in edge.children()) and len(edge.children()) == len(
        _config(edge)["instances"]
    )
