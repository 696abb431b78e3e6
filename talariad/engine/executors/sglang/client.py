"""HTTP client of one SGLang server: the endpoints of reference §1 that the executor uses."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx

from talariad.wire.messages import GenerateRequest


class SGLangError(RuntimeError):
    """A server did not do what was asked (refused, unreachable, or closed the stream)."""


def sampling_params(req: GenerateRequest, max_tokens: int | None = None) -> dict:
    """`sampling_params` of /generate for a call (only keys SGLang 0.5.23 accepts; unknown ones 400).
    max_tokens: the instance's (possibly clamped) budget, else the request's."""
    out = {
        "max_new_tokens": max_tokens or req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
    }
    if req.stop:
        out["stop"] = list(req.stop)
    if req.ignore_eos:
        out["ignore_eos"] = True
    if req.seed is not None:
        out["sampling_seed"] = req.seed
    return out


class SGLangClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 30.0):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        # no pool limit: one streaming connection per call in flight
        self.http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout_s,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=32),
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _call(self, method: str, path: str, body: dict | None = None):
        try:
            r = await self.http.request(method, path, json=body)
        except httpx.HTTPError as err:
            raise SGLangError(f"{path}: {type(err).__name__}: {err}") from None
        if r.status_code != 200:
            raise SGLangError(f"{path}: HTTP {r.status_code}: {r.text[:200]}")
        return r.json() if r.content else None

    async def health(self) -> bool:
        """GET /health (a real 1-token generation): only ever on an active server."""
        try:
            return (await self.http.get("/health")).status_code == 200
        except httpx.HTTPError:
            return False

    async def server_info(self) -> dict:
        return await self._call("GET", "/server_info")

    async def loads(self) -> dict:
        """The first (dp_rank 0) entry of /v1/loads: num_running_reqs, num_waiting_reqs, token_usage ..."""
        data = await self._call("GET", "/v1/loads")
        return (data.get("loads") or [{}])[0]

    async def pause(self, mode: str = "retract") -> None:
        await self._call("POST", "/pause_generation", {"mode": mode})

    async def release(self) -> None:
        await self._call("POST", "/release_memory_occupation", {})

    async def resume(self) -> None:
        await self._call("POST", "/resume_memory_occupation", {})

    async def cont(self) -> None:
        await self._call("POST", "/continue_generation", {})

    async def generate(self, rid: str, input_ids: list[int], params: dict) -> AsyncIterator[dict]:
        """Stream /generate chunks (cumulative `text`, `output_ids`, `meta_info`) until [DONE]."""
        body = {"rid": rid, "input_ids": input_ids, "sampling_params": params, "stream": True}
        try:
            async with self.http.stream(
                "POST", "/generate", json=body, timeout=httpx.Timeout(30.0, read=None)
            ) as r:
                if r.status_code != 200:
                    raise SGLangError(
                        f"/generate: HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                    )
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    yield json.loads(data)
        except httpx.HTTPError as err:
            raise SGLangError(
                f"/generate: {type(err).__name__}: {err or 'connection lost'}"
            ) from None
        raise SGLangError("/generate: the stream ended without [DONE]")
