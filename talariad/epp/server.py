"""The EPP's gRPC server: Envoy's ExternalProcessor (one `Stream` per HTTP request), its
Authorization (one unary check per request at its headers: a lease return placed there) and its
access-log service (the ends of the calls placed at headers), beside the standard health
service, over TLS or plaintext, drained on SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from talariad.epp import (
    als_pb2,
    als_pb2_grpc,
    ext_authz_pb2,
    ext_authz_pb2_grpc,
    ext_proc_pb2_grpc,
    replies,
)
from talariad.epp.config import FAILURE_MODE_KEY, MAX_STREAMS
from talariad.epp.contract import EPPRequest, Pick, Picker
from talariad.epp.metrics import EPPMetrics
from talariad.epp.stream import (
    BODY_TIMEOUT_S,
    MAX_BODY_BYTES,
    BodyBudget,
    Stream,
    check_endpoint,
)

log = logging.getLogger("talariad.epp")

SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
MAX_ANSWERS = 4096  # the check's answers kept built, one per (pick, fallback)
MAX_MESSAGE_BYTES = 16 * 2**20
"""Largest message taken from Envoy; it sends body chunks of up to 1 MiB."""
PENDING_PER_STREAM = 100
"""gRPC's streams waiting for the server to take them, per stream of `max_streams`: the gateway
opens at most as many streams as it admits calls (pickers x `max_streams` connections, 100
HTTP/2 calls each), and gRPC's own bound (1,000, or 3,000 hard) must never refuse one first: a
refused stream is a 500, or under fail-open a call routed unpicked. Measured through Envoy:
2,000 bodies trickling in at once had 68-138 streams refused by the default."""


class ExtProcServicer(ext_proc_pb2_grpc.ExternalProcessorServicer):
    def __init__(
        self,
        picker: Picker,
        clock: Callable[[], float] = time.monotonic,
        metrics: EPPMetrics | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        failure_mode: str | None = None,
        body_timeout_s: float = BODY_TIMEOUT_S,
        max_streams: int | None = None,
        body_buffer_bytes: int | None = None,
    ) -> None:
        """`failure_mode`: the picker config's; a stream whose Envoy config names another one
        (`FAILURE_MODE_KEY` metadata) gets a warning logged, once for each mode named.
        `body_timeout_s`: a request body not whole this long after its headers gets 408.
        `max_streams`: streams held at once, past which a call is answered 429 at its headers;
        `body_buffer_bytes`: request-body bytes held at once over every stream (None: no bound)."""
        self.picker, self.clock, self.max_body = picker, clock, max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.max_streams = max_streams
        self.open = 0
        self.budget = BodyBudget(body_buffer_bytes)
        self.metrics = metrics or EPPMetrics()
        self.failure_mode = failure_mode
        self.told: set[str] = set()

    def _check_failure_mode(self, context) -> None:
        if self.failure_mode is None:
            return
        for key, value in context.invocation_metadata() or ():
            if key == FAILURE_MODE_KEY and value != self.failure_mode and value not in self.told:
                self.told.add(value)
                log.warning(
                    "the Envoy config streaming to this picker was rendered %s, this picker's "
                    "failure_mode is %s: make them agree",
                    value,
                    self.failure_mode,
                )

    async def Process(self, request_iterator, context):  # noqa: N802 (gRPC method name)
        self._check_failure_mode(context)
        over = self.max_streams if self.max_streams and self.open >= self.max_streams else None
        stream = Stream(self.picker, self.clock, self.metrics, self.max_body, self.budget, over)
        self.open += 1
        self.metrics.streams.inc()
        self.metrics.in_flight.inc()
        clean = False
        messages = aiter(request_iterator)
        pending: asyncio.Future | None = None  # a read outliving a body's deadline
        loop = asyncio.get_running_loop()
        body_deadline: float | None = None
        try:
            # NOTE: the stream stays open until Envoy ends it. Closing it first (even cleanly,
            # after the last reply) makes Envoy drop response chunks it has not yet handed over.
            while True:
                if body_deadline is None and stream.body_due:
                    body_deadline = loop.time() + self.body_timeout_s
                if body_deadline is not None and stream.body_due:
                    # a body that trickles is refused as the box refuses it; the read goes on
                    # (not cancelled) and takes whatever Envoy sends after the refusal
                    if pending is None:
                        pending = asyncio.ensure_future(anext(messages))
                    done, _ = await asyncio.wait({pending}, timeout=body_deadline - loop.time())
                    if not done:
                        for reply in stream.body_timed_out(self.body_timeout_s):
                            yield reply
                        continue
                try:
                    if pending is not None:
                        request, pending = await pending, None
                    else:
                        request = await anext(messages)
                except StopAsyncIteration:
                    break
                for reply in stream.handle(request):
                    yield reply
            clean = True
        finally:  # also on cancellation: settles a call whose response was cut
            if pending is not None:
                pending.cancel()
                pending.add_done_callback(_retrieved)  # a read Envoy's reset failed: not an error
            stream.ended(clean)
            self.open -= 1
            self.metrics.in_flight.dec()


class LeaseServicer(ext_authz_pb2_grpc.AuthorizationServicer):
    """The gateway's check of each request at its headers (an ext_authz filter before the
    full-duplex ext_proc one): the call routed to its session's lease (`Picker.lease_return`), or
    passed on unchanged, and the full-duplex filter decides on the body. Never a denial."""

    def __init__(
        self, picker: Picker, clock: Callable[[], float], metrics: EPPMetrics | None = None
    ) -> None:
        self.picker, self.clock = picker, clock
        self.metrics = metrics or EPPMetrics()
        self._placed = self.metrics.at_headers.labels("placed")
        self._deferred = self.metrics.at_headers.labels("deferred")
        # built once per (pick, fallback): a pool has few, and building one is most of a check's
        # own CPU (a protobuf Struct)
        self._answers: dict[tuple[str, str], ext_authz_pb2.CheckResponse] = {}

    async def Check(self, request, context):  # noqa: N802 (gRPC method name)
        return self.check(request)

    def check(self, request: ext_authz_pb2.CheckRequest) -> ext_authz_pb2.CheckResponse:
        started, now = time.perf_counter(), self.clock()
        http = request.attributes.request.http
        headers = dict(http.headers)
        call_id = headers.get("x-request-id") or http.id or uuid.uuid4().hex
        call = EPPRequest(call_id, http.method, http.path, headers, arrived=now)
        pick: Pick | None = None
        try:
            pick = self.picker.lease_return(call, now)
            if pick is not None:
                check_endpoint(pick.endpoint)
                check_endpoint(pick.fallback)
        except Exception:  # the full-duplex filter decides: a call is never lost to this one
            log.exception(
                "call %s: placing it at its headers failed; deciding on its body", call_id
            )
            pick = None
        if pick is None:
            self._deferred.inc()
            return replies.unplaced()
        self._placed.inc()
        self.metrics.kinds.labels(pick.kind).inc()
        self.metrics.decided("picked", time.perf_counter() - started, 0.0)
        key = (pick.destination, pick.endpoint)
        answer = self._answers.get(key)
        if answer is None:
            if len(self._answers) >= MAX_ANSWERS:
                self._answers.clear()
            answer = self._answers[key] = replies.placed_at_headers(*key)
        return answer


class AccessLogServicer(als_pb2_grpc.AccessLogServiceServicer):
    """Envoy's gRPC access log of the calls placed at their headers (the gateway logs only
    those): each entry settles its call with the picker (`Picker.logged`)."""

    def __init__(
        self, picker: Picker, clock: Callable[[], float], metrics: EPPMetrics | None = None
    ) -> None:
        self.picker, self.clock = picker, clock
        self.metrics = metrics or EPPMetrics()

    async def StreamAccessLogs(self, request_iterator, context):  # noqa: N802 (gRPC method name)
        async for message in request_iterator:
            if message.WhichOneof("log_entries") == "http_logs":
                for entry in message.http_logs.log_entry:
                    self.settle(entry)
        return als_pb2.StreamAccessLogsResponse()

    def settle(self, entry: als_pb2.HTTPAccessLogEntry) -> None:
        common = entry.common_properties
        if common.intermediate_log_entry:
            return  # the call goes on
        self.metrics.logged.inc()
        status = entry.response.response_code.value
        sock = common.upstream_remote_address.socket_address
        endpoint = None
        if sock.address:
            host = f"[{sock.address}]" if ":" in sock.address else sock.address
            endpoint = f"{host}:{sock.port_value}"
        ok = 0 < status < 400 and not _cut(common.response_flags)
        try:
            self.picker.logged(entry.request.request_id, endpoint, status, ok, self.clock())
        except Exception:  # one bad entry must not end the feed
            log.exception("call %s: settling its access-log entry failed", entry.request.request_id)


def _cut(flags: als_pb2.ResponseFlags) -> bool:
    """The response did not end well: a reset, a timeout, or the client went away."""
    return (
        flags.upstream_request_timeout
        or flags.local_reset
        or flags.upstream_remote_reset
        or flags.upstream_connection_termination
        or flags.downstream_connection_termination
        or flags.stream_idle_timeout
    )


def _retrieved(read: asyncio.Future) -> None:
    if not read.cancelled():
        read.exception()


@dataclass(frozen=True)
class TLSFiles:
    cert: Path
    key: Path
    client_ca: Path | None = None
    """When given, a client must present a certificate this CA signed (mutual TLS)."""


class EPPServer:
    """A started server; `port` is the one bound (useful with port 0)."""

    def __init__(self, server: grpc.aio.Server, health: health.aio.HealthServicer, port: int):
        self.server, self.health, self.port = server, health, port

    async def drain(self, grace_s: float, announce_s: float = 0.0) -> None:
        """Health NOT_SERVING; for `announce_s` keep taking streams (so that the gateway's
        health check sees it and moves new requests away), then take no new streams, give
        those in flight up to `grace_s` to end, cut the rest and stop."""
        await self.health.enter_graceful_shutdown()
        if announce_s > 0:
            await asyncio.sleep(announce_s)
        await self.server.stop(grace_s)

    async def wait(self) -> None:
        await self.server.wait_for_termination()


async def start(
    processor: ExtProcServicer,
    address: str,
    tls: TLSFiles | None = None,
    lease: ext_authz_pb2_grpc.AuthorizationServicer | None = None,
    access_log: als_pb2_grpc.AccessLogServiceServicer | None = None,
) -> EPPServer:
    """Serve `processor`, `lease` (the check at request headers) and `access_log` (the ends of
    the calls it placed) (by default both over `processor`'s picker) and health on `address`
    ("host:port"), over TLS when `tls` is given (mutual TLS when it names a client CA)."""
    pending = PENDING_PER_STREAM * (processor.max_streams or MAX_STREAMS)
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.server.max_pending_requests", pending),
        ("grpc.server.max_pending_requests_hard_limit", pending),
    ]
    server = grpc.aio.server(options=options)
    ext_proc_pb2_grpc.add_ExternalProcessorServicer_to_server(processor, server)
    if lease is None:
        lease = LeaseServicer(processor.picker, processor.clock, processor.metrics)
    ext_authz_pb2_grpc.add_AuthorizationServicer_to_server(lease, server)
    if access_log is None:
        access_log = AccessLogServicer(processor.picker, processor.clock, processor.metrics)
    als_pb2_grpc.add_AccessLogServiceServicer_to_server(access_log, server)
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    for name in ("", SERVICE):
        await checks.set(name, health_pb2.HealthCheckResponse.SERVING)
    if tls is None:
        port = server.add_insecure_port(address)
    else:
        pair = (tls.key.read_bytes(), tls.cert.read_bytes())
        ca = None if tls.client_ca is None else tls.client_ca.read_bytes()
        creds = grpc.ssl_server_credentials(
            [pair], root_certificates=ca, require_client_auth=ca is not None
        )
        port = server.add_secure_port(address, creds)
    await server.start()
    return EPPServer(server, checks, port)


async def serve(server: EPPServer, grace_s: float, announce_s: float = 0.0) -> None:
    """Run until SIGTERM or SIGINT, then drain (`EPPServer.drain`), saying so on stderr."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    print(
        f"talariad epp: draining: NOT_SERVING for {announce_s:g} s, then up to {grace_s:g} s "
        "for the streams still open",
        file=sys.stderr,
        flush=True,
    )
    await server.drain(grace_s, announce_s)
    print("talariad epp: drained", file=sys.stderr, flush=True)
