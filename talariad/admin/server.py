"""The gRPC admin service on a unix socket, with the standard health service."""

from __future__ import annotations

import asyncio
import grp
import os
import pathlib
import time
from collections.abc import Awaitable, Callable

import grpc
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from talariad.admin import admin_pb2, admin_pb2_grpc, views
from talariad.admin.operator import ActionRefused, Operator
from talariad.admin.planning import PlannerShell
from talariad.calls.spec import bare_call_id
from talariad.config import ConfigError
from talariad.router import Router

SERVICE = "talaria.admin.v1.Admin"
_CODES = {
    "not_found": grpc.StatusCode.NOT_FOUND,
    "failed_precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "invalid_argument": grpc.StatusCode.INVALID_ARGUMENT,
}


async def _act(context, action):
    """Run an operator action (sync or async); a refusal becomes its gRPC status."""
    try:
        result = action()
        return await result if asyncio.iscoroutine(result) else result
    except ActionRefused as r:
        await context.abort(_CODES[r.kind], str(r))


class AdminService(admin_pb2_grpc.AdminServicer):
    def __init__(
        self,
        status: Callable[[], admin_pb2.StatusReply],
        router: Router,
        clock: Callable[[], float] = time.monotonic,
        memory: Callable[[str], Awaitable[dict | None]] | None = None,
        operator: Operator | None = None,
        planning: PlannerShell | None = None,
    ):
        self._status, self.router, self.clock, self._memory = status, router, clock, memory
        self.op = operator
        self.planning = planning

    async def Status(self, request, context):  # noqa: N802 (gRPC method names)
        return self._status()

    async def WatchStatus(self, request, context):  # noqa: N802
        interval = request.interval_s if request.interval_s > 0 else 1.0
        if interval < 0.05:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "interval_s must be at least 0.05"
            )
        while True:
            yield self._status()
            await asyncio.sleep(interval)

    async def WatchRouter(self, request, context):  # noqa: N802
        interval = request.interval_s if request.interval_s > 0 else 1.0
        if interval < 0.05 or request.sessions < 0 or request.decisions < 0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "interval_s must be >= 0.05, limits >= 0"
            )
        while True:
            now = self.clock()
            yield admin_pb2.RouterState(
                leases=views.leases(self.router, now).leases,
                sessions=views.sessions(self.router, now, request.sessions or 200).sessions,
                decisions=[
                    views.decision(d, now) for d in self.router.recent(request.decisions or 50)
                ],
            )
            await asyncio.sleep(interval)

    async def Sessions(self, request, context):  # noqa: N802
        if request.limit < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "limit must be >= 0")
        return views.sessions(self.router, self.clock(), request.limit)

    async def Leases(self, request, context):  # noqa: N802
        return views.leases(self.router, self.clock())

    async def Explain(self, request, context):  # noqa: N802
        found = self.router.explain(bare_call_id(request.call_id))
        if found is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no routing decision recorded for call {request.call_id!r}",
            )
        return views.decision(found, self.clock())

    async def Decisions(self, request, context):  # noqa: N802
        if request.limit < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "limit must be >= 0")
        now = self.clock()
        return admin_pb2.DecisionsReply(
            decisions=[views.decision(d, now) for d in self.router.recent(request.limit or 20)]
        )

    async def Memory(self, request, context):  # noqa: N802
        report = await self._memory(request.instance) if self._memory else None
        if report is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"no ready instance named {request.instance!r}"
            )
        return views.memory(request.instance, report)

    # ---- actions (need the daemon's operator) --------------------------------------------------

    async def _operator(self, context) -> Operator:
        if self.op is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED, "this server has no operator actions"
            )
        return self.op

    async def DrainInstance(self, request, context):  # noqa: N802
        op = await self._operator(context)
        return await _act(context, lambda: op.drain(request.instance, request.force))

    async def UndrainInstance(self, request, context):  # noqa: N802
        op = await self._operator(context)
        return await _act(context, lambda: op.undrain(request.instance))

    async def CordonInstance(self, request, context):  # noqa: N802
        op = await self._operator(context)
        return await _act(context, lambda: op.cordon(request.instance, request.force))

    async def RestartInstance(self, request, context):  # noqa: N802
        op = await self._operator(context)
        return await _act(context, lambda: op.restart(request.instance))

    async def MoveInstance(self, request, context):  # noqa: N802
        op = await self._operator(context)
        return await _act(
            context, lambda: op.move(request.instance, request.to, request.model, request.force)
        )

    async def Models(self, request, context):  # noqa: N802
        op = await self._operator(context)
        return op.models()

    async def PinModel(self, request, context):  # noqa: N802
        op = await self._operator(context)
        return await _act(context, lambda: op.pin(request.model, request.instance, request.force))

    async def UnpinModel(self, request, context):  # noqa: N802
        op = await self._operator(context)
        return await _act(context, lambda: op.unpin(request.model, request.instance, request.force))

    async def LoadModel(self, request, context):  # noqa: N802
        op = await self._operator(context)
        return await _act(context, lambda: op.rotation(request.model, request.instance, True))

    async def UnloadModel(self, request, context):  # noqa: N802
        op = await self._operator(context)
        return await _act(
            context, lambda: op.rotation(request.model, request.instance, False, request.force)
        )

    async def Pools(self, request, context):  # noqa: N802
        op = await self._operator(context)
        return op.pools()

    async def PoolPlan(self, request, context):  # noqa: N802
        if self.planning is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, "the planner is off (planner.mode: off)"
            )
        return await _act(context, lambda: self.planning.plan(request.apply))

    async def RevokeLease(self, request, context):  # noqa: N802
        op = await self._operator(context)
        return await _act(context, lambda: op.revoke(request.session_id, request.model))

    async def ForgetSession(self, request, context):  # noqa: N802
        op = await self._operator(context)
        return await _act(context, lambda: op.forget(request.session_id))

    async def ReloadConfig(self, request, context):  # noqa: N802
        op = await self._operator(context)
        try:
            applied, needs_restart = op.reload()
        except ConfigError as err:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "; ".join(err.lines))
        return admin_pb2.ReloadReply(applied=applied, needs_restart=needs_restart)

    async def ShowConfig(self, request, context):  # noqa: N802
        op = await self._operator(context)
        path, data = op.config()
        return admin_pb2.ConfigReply(path=path, yaml=yaml.safe_dump(data, sort_keys=False))

    async def Rounds(self, request, context):  # noqa: N802
        op = await self._operator(context)
        if request.limit < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "limit must be >= 0")
        return await _act(context, lambda: op.rounds(request.instance, request.limit or 50))

    async def WatchRounds(self, request, context):  # noqa: N802
        """Each reply carries the rounds and switches not sent before (the open round each time)."""
        op = await self._operator(context)
        interval = request.interval_s if request.interval_s > 0 else 0.5
        if interval < 0.05 or request.limit < 0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "interval_s must be >= 0.05 and limit >= 0"
            )
        sent: dict[tuple[str, int], bool] = {}
        seen_switch: set[tuple] = set()
        while True:
            reply = await _act(context, lambda: op.rounds(request.instance, request.limit or 50))
            fresh = admin_pb2.RoundsReply()
            for r in reply.rounds:
                if (r.instance, r.index) not in sent or r.open or sent[(r.instance, r.index)]:
                    fresh.rounds.append(r)
                    sent[(r.instance, r.index)] = r.open
            for w in reply.switches:
                key = (w.instance, w.round_index, w.from_model, w.to_model, w.total_ms)
                if key not in seen_switch:
                    seen_switch.add(key)
                    fresh.switches.append(w)
            yield fresh
            await asyncio.sleep(interval)


def socket_target(path: str) -> str:
    return f"unix://{os.path.abspath(path)}"


async def start(path: str, service: AdminService, group: str | None = None) -> grpc.aio.Server:
    """Bind the admin socket (replacing a stale one: the caller holds the socket's lock) and start
    serving; the socket gets mode 0660 and, when given, `group`."""
    sock = pathlib.Path(path)
    sock.parent.mkdir(parents=True, exist_ok=True)
    if sock.is_socket():
        sock.unlink()
    server = grpc.aio.server()
    admin_pb2_grpc.add_AdminServicer_to_server(service, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    server.add_insecure_port(socket_target(path))
    await server.start()
    _restrict(sock, group)
    await health_servicer.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return server


def _restrict(sock: pathlib.Path, group: str | None) -> None:
    """Owner and group may connect (talaria-ctl for members of the service's group), others not."""
    if group is not None:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise RuntimeError(f"listen.admin_group: no group named {group!r}") from None
        os.chown(sock, -1, gid)
    os.chmod(sock, 0o660)
