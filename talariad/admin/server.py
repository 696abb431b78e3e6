"""The gRPC admin service on a unix socket, with the standard health service and reflection."""

from __future__ import annotations

import asyncio
import os
import pathlib
from collections.abc import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from talariad.admin import admin_pb2, admin_pb2_grpc

SERVICE = "talaria.admin.v1.Admin"


class AdminService(admin_pb2_grpc.AdminServicer):
    def __init__(self, status: Callable[[], admin_pb2.StatusReply]):
        self._status = status

    async def Status(self, request, context):  # noqa: N802 (gRPC method name)
        return self._status()

    async def WatchStatus(self, request, context):  # noqa: N802
        interval = request.interval_s if request.interval_s > 0 else 1.0
        if interval < 0.05:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "interval_s must be at least 0.05")
        while True:
            yield self._status()
            await asyncio.sleep(interval)


def socket_target(path: str) -> str:
    return f"unix://{os.path.abspath(path)}"


async def start(path: str, status: Callable[[], admin_pb2.StatusReply]) -> grpc.aio.Server:
    """Bind the admin socket (replacing a stale one) and start serving."""
    sock = pathlib.Path(path)
    sock.parent.mkdir(parents=True, exist_ok=True)
    if sock.is_socket():
        sock.unlink()
    server = grpc.aio.server()
    admin_pb2_grpc.add_AdminServicer_to_server(AdminService(status), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    server.add_insecure_port(socket_target(path))
    await server.start()
    await health_servicer.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return server
