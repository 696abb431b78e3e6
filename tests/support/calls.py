"""Helpers for the reliability tests: calls in flight against a real daemon, in threads."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

CHAT = [{"role": "user", "content": "Run the tests and fix what fails."}]
KINDS = ("chat", "chat-stream", "messages", "messages-stream", "completions")


def one_call(endpoint: str, kind: str, i: int, max_tokens: int) -> dict:
    """One call of `kind`; returns its status, completion tokens from the usage it reported (None
    when it reported none) and, for a stream, whether it ended in an error event."""
    stream = kind.endswith("-stream")
    session = {"x-session-id": f"rel-{kind}-{i}"}
    if kind.startswith("messages"):
        path, body = (
            "/v1/messages",
            {"model": "tiny-chat", "max_tokens": max_tokens, "messages": CHAT},
        )
    elif kind == "completions":
        path, body = (
            "/v1/completions",
            {"model": "tiny-code", "prompt": "def f(x):", "max_tokens": max_tokens},
        )
    else:
        path, body = (
            "/v1/chat/completions",
            {"model": "tiny-code", "messages": CHAT, "max_tokens": max_tokens},
        )
    body["ignore_eos"] = True  # exactly max_tokens, whatever the model's end of turn
    if stream:
        body |= {"stream": True} | (
            {"stream_options": {"include_usage": True}} if kind == "chat-stream" else {}
        )
    out = {
        "kind": kind,
        "status": None,
        "tokens": None,
        "prompt": None,
        "stream_error": False,
        "error": None,
    }
    with httpx.Client(timeout=120) as client:
        if not stream:
            r = client.post(f"{endpoint}{path}", json=body, headers=session)
            out["status"] = r.status_code
            data = r.json()
            usage = data.get("usage") or {}
            out["tokens"] = usage.get("completion_tokens", usage.get("output_tokens"))
            out["prompt"] = usage.get("prompt_tokens", usage.get("input_tokens"))
            out["error"] = data.get("error")
            return out
        with client.stream("POST", f"{endpoint}{path}", json=body, headers=session) as r:
            out["status"] = r.status_code
            if r.status_code != 200:  # refused before the stream began: a JSON error body
                r.read()
                out["error"] = r.json().get("error")
                return out
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if data.get("error") or data.get("type") == "error":
                    out["stream_error"], out["error"] = True, data.get("error")
                usage = data.get("usage") or {}
                if usage.get("completion_tokens") is not None or usage.get("output_tokens"):
                    out["tokens"] = usage.get("completion_tokens", usage.get("output_tokens"))
                    out["prompt"] = usage.get("prompt_tokens", usage.get("input_tokens"))
    return out


def in_flight(endpoint: str, n: int, max_tokens: int) -> tuple[ThreadPoolExecutor, list]:
    """Start `n` calls cycling through every kind; returns the pool and the futures."""
    pool = ThreadPoolExecutor(n)
    futures = [
        pool.submit(one_call, endpoint, KINDS[i % len(KINDS)], i, max_tokens) for i in range(n)
    ]
    return pool, futures


def running(endpoint: str) -> float:
    text = httpx.get(f"{endpoint}/metrics", timeout=10).text
    return sum(
        float(ln.rsplit(" ", 1)[1])
        for ln in text.splitlines()
        if ln.startswith("talaria_requests_running{")
    )


def wait_running(endpoint: str, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while running(endpoint) < n:
        assert time.monotonic() < deadline, f"fewer than {n} calls in flight"
        time.sleep(0.05)
