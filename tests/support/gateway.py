"""The gateway in-process over sim workers, with the instance hop's serialization kept: a request
the hop cannot encode fails there, as it does over the socket."""

from __future__ import annotations

import pytest

from talariad.wire.messages import ErrorEvent, GenerateRequest
from tests.support.scripted import LocalClient, local_gateway


def _wire(req: GenerateRequest) -> GenerateRequest:
    """The request as the instance receives it over the hop (ValueError: it cannot be sent)."""
    return GenerateRequest.model_validate_json(req.model_dump_json().encode())


@pytest.fixture
async def hop_client(monkeypatch):
    """An httpx client on the gateway; `.counted`: the instances asked to count tokens."""
    calls: list[str] = []
    local_generate, local_count = LocalClient.generate, LocalClient.count_tokens

    async def generate(self, instance, req):
        try:
            req = _wire(req)
        except ValueError as err:
            yield ErrorEvent(message=f"instance {instance} failed: {err!r}")
            return
        async for event in local_generate(self, instance, req):
            yield event

    async def count_tokens(self, instance, req):
        calls.append(instance)
        return await local_count(self, instance, _wire(req))

    monkeypatch.setattr(LocalClient, "generate", generate)
    monkeypatch.setattr(LocalClient, "count_tokens", count_tokens)
    # τ on the instances' clock (time_scale 0.01): a switch away from a drained slot waits 10 ms
    # for a returning call, not a whole second, while nothing here tests that wait
    async with local_gateway(overrides={"policy": {"tau_s": 0.01}}) as c:
        c.counted = calls
        yield c
