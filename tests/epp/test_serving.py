"""Serving the EPP: health for Envoy's health checker, drain, SIGTERM, TLS, the metrics port."""

from __future__ import annotations

import asyncio
import os
import signal

import grpc
import pytest
from fastapi.testclient import TestClient
from grpc_health.v1 import health_pb2, health_pb2_grpc

from talariad.epp.admin import admin_app
from talariad.epp.boxpicker import BoxPicker
from talariad.epp.config import FAILURE_MODE_KEY
from talariad.epp.metrics import EPPMetrics
from talariad.epp.server import SERVICE, TLSFiles, serve
from talariad.router import Router, RouterKnobs
from tests.epp import fake_envoy as envoy
from tests.epp.fake_envoy import ENDPOINT
from tests.support import certs

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def health_of(channel: grpc.aio.Channel, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return reply.status


async def test_health_serves_then_drain_finishes_streams_in_flight(epp):
    run = await epp()
    assert await health_of(run.channel, "") == SERVING
    assert await health_of(run.channel, SERVICE) == SERVING
    call = run.stream()  # in flight: routed, the response under way
    await call.routed()
    await call.send(envoy.response_headers())
    await call.read()

    drain = asyncio.create_task(run.server.drain(grace_s=10, announce_s=0.3))
    await asyncio.sleep(0.1)
    assert await health_of(run.channel, SERVICE) == NOT_SERVING  # still answering, for Envoy
    assert await health_of(run.channel, "") == NOT_SERVING
    await asyncio.sleep(0.4)  # past the announcement: no new streams
    late = run.stream()
    with pytest.raises(grpc.aio.AioRpcError):
        await late.send(envoy.request_headers("GET", "/", end_of_stream=True))
        await late.read()
    assert not drain.done()  # waits for the stream in flight
    await call.send(envoy.body(b"", end_of_stream=True, response=True))
    await call.read()
    assert await call.end() == grpc.StatusCode.OK
    await asyncio.wait_for(drain, 5)
    assert run.picker.finished_calls == [("req-1", True)]


async def test_drain_cuts_streams_still_open_after_the_grace(epp):
    run = await epp()
    call = run.stream()
    await call.routed()
    await asyncio.wait_for(run.server.drain(grace_s=0.2), 5)
    assert await run.picker.settled() == [("req-1", False)]


async def test_sigterm_drains_and_stops(epp):
    run = await epp()
    serving = asyncio.create_task(serve(run.server, grace_s=1))
    await asyncio.sleep(0.05)  # the handler is installed
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(serving, 5)
    await asyncio.wait_for(run.server.wait(), 5)
    with pytest.raises(grpc.aio.AioRpcError):
        await health_of(run.channel, "")


def server_tls(tmp_path, client_ca: bool = False) -> tuple[TLSFiles, certs.Leaf]:
    """The picker's certificate (and, with `client_ca`, mutual TLS) and the CA that signed it."""
    authority = certs.ca(tmp_path)
    mine = certs.leaf(tmp_path, "epp", authority)
    return TLSFiles(mine.cert, mine.key, authority.cert if client_ca else None), authority


def channel_to(authority: certs.Leaf, client: certs.Leaf | None = None):
    """A TLS channel maker trusting `authority`, presenting `client` when given."""
    creds = grpc.ssl_channel_credentials(
        root_certificates=authority.cert.read_bytes(),
        private_key=None if client is None else client.key.read_bytes(),
        certificate_chain=None if client is None else client.cert.read_bytes(),
    )
    return lambda port: grpc.aio.secure_channel(f"127.0.0.1:{port}", creds)


@pytest.mark.proc
async def test_tls(epp, tmp_path):
    tls, authority = server_tls(tmp_path)
    run = await epp(tls=tls, channel=channel_to(authority))
    assert await health_of(run.channel, SERVICE) == SERVING
    call = run.stream()
    await call.send(envoy.request_headers("GET", "/v1/models", end_of_stream=True))
    (routing,) = await call.read()
    assert (
        routing.request_headers.response.header_mutation.set_headers[0].header.raw_value
        == ENDPOINT.encode()
    )
    plain = grpc.aio.insecure_channel(f"127.0.0.1:{run.server.port}")
    with pytest.raises(grpc.aio.AioRpcError):  # TLS only
        await health_of(plain, SERVICE)
    await plain.close()


@pytest.mark.proc
async def test_mutual_tls_takes_only_clients_its_ca_signed(epp, tmp_path):
    tls, authority = server_tls(tmp_path, client_ca=True)
    gateway = certs.leaf(tmp_path, "gateway", authority, usage="clientAuth")
    run = await epp(tls=tls, channel=channel_to(authority, gateway))
    assert await health_of(run.channel, SERVICE) == SERVING
    stranger_ca = certs.ca(tmp_path, "stranger-ca")
    stranger = certs.leaf(tmp_path, "stranger", stranger_ca, usage="clientAuth")
    for refused in (channel_to(authority), channel_to(authority, stranger)):
        channel = refused(run.server.port)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await health_of(channel, SERVICE)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        await channel.close()


async def test_a_gateway_rendered_with_the_other_failure_mode_is_warned_of_once(epp, caplog):
    run = await epp(failure_mode="fail_open")
    mode = lambda m: ((FAILURE_MODE_KEY, m),)  # noqa: E731
    for metadata in (mode("fail_open"), (), mode("fail_closed"), mode("fail_closed")):
        call = run.stream(metadata)
        await call.routed()
        await call.end()
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [
        "the Envoy config streaming to this picker was rendered fail_closed, this picker's "
        "failure_mode is fail_open: make them agree"
    ]


def test_the_operators_http_side_shows_the_metrics():
    metrics = EPPMetrics()
    metrics.decided("picked", 0.001)
    picker = BoxPicker(Router(RouterKnobs(), {}))
    text = TestClient(admin_app(picker, metrics.registry)).get("/metrics").text
    assert 'talaria_epp_decisions_total{outcome="picked"} 1.0' in text
    assert 'talaria_epp_decisions_total{outcome="error"} 0.0' in text
    for name in (
        "streams_total",
        "streams_in_flight",
        "decision_seconds_bucket",
        "served_mismatch_total",
    ):
        assert f"talaria_epp_{name}" in text
