"""`talariad run`: supervisor, gateway, router and admin API in one asyncio process."""

from __future__ import annotations

import asyncio
import gc
import logging
import time

from talariad import __version__, httpserver, sdnotify
from talariad.admin import admin_pb2, server as admin_server
from talariad.config import TalariaConfig
from talariad.gateway.app import Gateway, build_app
from talariad.gateway.instances import InstanceDirectory
from talariad.knobs import model_profile
from talariad.gateway.routing import RouterShell
from talariad.supervisor import ProcState, Supervisor

log = logging.getLogger("talariad")


class Daemon:
    def __init__(self, cfg: TalariaConfig, config_path: str):
        self.cfg = cfg
        self.started = time.monotonic()
        self.supervisor = Supervisor(cfg, config_path)
        self.routing = RouterShell(cfg, {m.name: model_profile(cfg, m.name) for m in cfg.models})
        self.directory = InstanceDirectory(self._urls, cfg.policy.telemetry_interval_s,
                                           on_telemetry=self.routing.observe,
                                           on_down=self.routing.instance_down,
                                           on_unhealthy=self.routing.unhealthy,
                                           sockets=self._sockets,
                                           on_payload=self._telemetry_payload)
        self.gateway = Gateway(cfg, self.directory, self.routing, self._healthy)
        self.endpoint = ""

    def _urls(self) -> dict[str, str | None]:
        return {name: m.base_url for name, m in self.supervisor.procs.items()}

    def _telemetry_payload(self, instance: str, nbytes: int) -> None:
        self.gateway.metrics.telemetry_bytes.labels(instance).set(nbytes)

    def _sockets(self) -> dict[str, str | None]:
        return {name: m.call_socket for name, m in self.supervisor.procs.items()}

    def _healthy(self, name: str) -> bool:
        m = self.supervisor.procs[name]
        return m.state == ProcState.READY and self.directory.age_s(name, time.monotonic()) < self.cfg.policy.staleness_s

    def status(self) -> admin_pb2.StatusReply:
        now = time.monotonic()
        return admin_pb2.StatusReply(version=__version__, uptime_s=now - self.started, http_endpoint=self.endpoint,
                                     instances=[self._instance_status(i, now) for i in self.cfg.instances])

    def _instance_status(self, inst, now: float) -> admin_pb2.InstanceStatus:
        m, snap = self.supervisor.procs[inst.name], self.directory.snapshot(inst.name)
        age = self.directory.age_s(inst.name, now)
        return admin_pb2.InstanceStatus(
            name=inst.name, pool=inst.pool, executor=inst.executor,
            devices=inst.devices if isinstance(inst.devices, str) else ",".join(map(str, inst.devices)),
            models=inst.models, state=m.state.value, healthy=self._healthy(inst.name), pid=m.pid or 0,
            restarts=m.restarts, active_model=(snap.active_model or "") if snap else "",
            loaded_models=snap.loaded_models if snap else [], running=snap.running if snap else 0,
            queued=sum(snap.queued.values()) if snap else 0, switches=snap.switches if snap else 0,
            telemetry_age_s=age if age != float("inf") else -1.0)

    async def run(self) -> None:
        stop = httpserver.stop_event()
        sock = httpserver.bind(self.cfg.listen.http_host, self.cfg.listen.http_port)
        host, port = sock.getsockname()[:2]
        self.endpoint = f"http://{host}:{port}"
        http, http_task = await httpserver.start(build_app(self.gateway), sock)
        admin = await admin_server.start(self.cfg.listen.admin_socket,
                                         admin_server.AdminService(self.status, self.routing.router,
                                                                   memory=self.directory.memory))
        try:
            await self._serve(stop)
        finally:
            sdnotify.notify("STOPPING=1")
            http.should_exit = True
            await admin.stop(grace=1.0)
            await self.supervisor.stop()
            await http_task
            await self.directory.aclose()

    async def _serve(self, stop: asyncio.Event) -> None:
        starting = asyncio.create_task(self.supervisor.start())
        await asyncio.wait([starting, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            starting.cancel()
            return
        starting.result()
        await self.directory.poll_once()
        gc.freeze()  # start-up objects never die; keeping them out of GC passes trims routing tail latency
        poller = asyncio.create_task(self.directory.poll_forever())
        watchdog = asyncio.create_task(_watchdog())
        sdnotify.notify("READY=1", f"STATUS=serving {len(self.cfg.models)} models on {len(self.cfg.instances)} instances")
        print(f"talariad: listening on {self.endpoint}/v1 (admin: unix:{self.cfg.listen.admin_socket})", flush=True)
        await stop.wait()
        poller.cancel()
        watchdog.cancel()


async def _watchdog() -> None:
    """Ping systemd from the event loop itself, so a wedged loop is caught."""
    interval = sdnotify.watchdog_interval_s()
    while interval:
        sdnotify.notify("WATCHDOG=1")
        await asyncio.sleep(interval)
