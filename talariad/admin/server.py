"""The gRPC admin service on a unix socket, with the standard health service."""

from __future__ import annotations

import asyncio
import os
import pathlib
import time
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from talariad.admin import admin_pb2, admin_pb2_grpc, views
from talariad.router import Router

SERVICE = "talaria.admin.v1.Admin"


class AdminService(admin_pb2_grpc.AdminServicer):
    def __init__(self, status: Callable[[], admin_pb2.StatusReply], router: Router,
                 clock: Callable[[], float] = time.monotonic,
                 memory: Callable[[str], Awaitable[dict | None]] | None = None):
        self._status, self.router, self.clock, self._memory = status, router, clock, memory

    async def Status(self, request, context):  # noqa: N802 (gRPC method names)
        return self._status()

    async def WatchStatus(self, request, context):  # noqa: N802
        interval = request.interval_s if request.interval_s > 0 else 1.0
        if interval < 0.05:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "interval_s must be at least 0.05")
        while True:
            yield self._status()
            await asyncio.sleep(interval)

    async def Sessions(self, request, context):  # noqa: N802
        if request.limit < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "limit must be >= 0")
        return views.sessions(self.router, self.clock(), request.limit)

    async def Leases(self, request, context):  # noqa: N802
        return views.leases(self.router, self.clock())

    async def Explain(self, request, context):  # noqa: N802
        found = self.router.explain(views.bare_call_id(request.call_id))
        if found is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no routing decision recorded for call {request.call_id!r}")
        return views.decision(found, self.clock())

    async def Decisions(self, request, context):  # noqa: N802
        if request.limit < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "limit must be >= 0")
        now = self.clock()
        return admin_pb2.DecisionsReply(decisions=[views.decision(d, now)
                                                   for d in self.router.recent(request.limit or 20)])


    async def Memory(self, request, context):  # noqa: N802
        report = await self._memory(request.instance) if self._memory else None
        if report is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no ready instance named {request.instance!r}")
        return views.memory(request.instance, report)


def socket_target(path: str) -> str:
    return f"unix://{os.path.abspath(path)}"


async def start(path: str, service: AdminService) -> grpc.aio.Server:
    """Bind the admin socket (replacing a stale one) and start serving."""
    sock = pathlib.Path(path)
    sock.parent.mkdir(parents=True, exist_ok=True)
    if sock.is_socket():
        sock.unlink()
    server = grpc.aio.server()
    admin_pb2_grpc.add_AdminServicer_to_server(service, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    server.add_insecure_port(socket_target(path))
    await server.start()
    await health_servicer.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return server
