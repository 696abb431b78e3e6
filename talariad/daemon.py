"""`talariad run`: supervisor, gateway, router and admin API in one asyncio process."""

from __future__ import annotations

import asyncio
import gc
import logging
import time

import httpx

from talariad import __version__, httpserver, sdnotify
from talariad.admin import admin_pb2, server as admin_server
from talariad.admin.operator import Operator
from talariad.admin.sockets import daemon_socket
from talariad.config import TalariaConfig, load_config
from talariad.gateway.app import Gateway, build_app
from talariad.gateway.instances import InstanceDirectory
from talariad.gateway.metrics import InstanceMetrics
from talariad.knobs import config_router_knobs as router_knobs, model_profile
from talariad.gateway.routing import RouterShell
from talariad.supervisor import ProcState, Supervisor

log = logging.getLogger("talariad")


class Daemon:
    def __init__(self, cfg: TalariaConfig, config_path: str):
        self.cfg, self.config_path = cfg, config_path
        self.admin_socket = daemon_socket(cfg.listen.admin_socket)
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
        self.operator = Operator(self)
        self.instance_metrics = InstanceMetrics(self.gateway.metrics.registry, self.metric_sample)
        self._marks: dict[str, tuple[int | None, int, int]] = {}  # instance -> (pid, last round, last switch seq)
        self._hbm: dict[str, dict[str, int]] = {}
        self._host_kv: dict[str, int] = {}

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
                                     instances=[self.instance_status(i.name, now) for i in self.cfg.instances])

    def pool_of(self, name: str) -> str:
        m = self.supervisor.procs[name]
        return (m.role or {}).get("pool", m.inst.pool)

    def serving_models(self, name: str) -> list[str]:
        """Models the instance serves now: its telemetry's rotation, else its (re-roled) config."""
        m, snap = self.supervisor.procs[name], self.directory.snapshot(name)
        if snap is not None and m.state == ProcState.READY:
            return list(snap.models)
        return list((m.role or {}).get("models", m.inst.models))

    def admission(self, name: str, snap) -> str:
        router = self.routing.router
        if name not in router.closed_instances():
            return "open"
        if name not in router.drained_instances():
            return "cordoned"
        busy = snap is None or snap.running or any(snap.queued.values()) or name in router.in_flight().values()
        return "draining" if busy else "drained"

    def instance_status(self, name: str, now: float | None = None) -> admin_pb2.InstanceStatus:
        now = time.monotonic() if now is None else now
        inst = self.supervisor.procs[name].inst
        m, snap = self.supervisor.procs[inst.name], self.directory.snapshot(inst.name)
        age = self.directory.age_s(inst.name, now)
        return admin_pb2.InstanceStatus(
            name=inst.name, pool=self.pool_of(name), configured_pool=inst.pool, executor=inst.executor,
            rotation=self.serving_models(name), admission=self.admission(name, snap),
            devices=inst.devices if isinstance(inst.devices, str) else ",".join(map(str, inst.devices)),
            models=(m.role or {}).get("models", inst.models), state=m.state.value, healthy=self._healthy(inst.name), pid=m.pid or 0,
            restarts=m.restarts, active_model=(snap.active_model or "") if snap else "",
            loaded_models=snap.loaded_models if snap else [], running=snap.running if snap else 0,
            queued=sum(snap.queued.values()) if snap else 0, switches=snap.switches if snap else 0,
            telemetry_age_s=age if age != float("inf") else -1.0)

    def metric_sample(self) -> dict[str, dict]:
        """Per-instance gauge values for a /metrics scrape."""
        out = {}
        leases = self.routing.router.leases()
        now = time.monotonic()
        for name, m in self.supervisor.procs.items():
            snap = self.directory.snapshot(name)
            out[name] = {"queued": sum(snap.queued.values()) if snap else 0, "running": snap.running if snap else 0,
                         "leases": sum(le.instance == name and le.live(now) for le in leases),
                         "restarts": m.restarts, "hbm": self._hbm.get(name, {}),
                         "host_kv_bytes": self._host_kv.get(name)}
        return out

    async def collect_records(self) -> None:
        """Fold new closed rounds and switch records of every ready instance into the metrics, and
        refresh the HBM layout of managed ones."""
        for name, m in self.supervisor.procs.items():
            if m.base_url is None:
                continue
            try:
                r = await self.directory.client.get(f"{m.base_url}/internal/rounds", params={"limit": 256}, timeout=5.0)
                r.raise_for_status()
                data = r.json()
            except (httpx.HTTPError, ValueError):
                continue
            pid, last_round, last_seq = self._marks.get(name, (None, -1, 0))
            if pid != m.pid:
                last_round, last_seq = -1, 0
            for rnd in data.get("rounds", []):
                if not rnd["open"] and rnd["index"] > last_round:
                    self.instance_metrics.observe_round(name, rnd)
                    last_round = rnd["index"]
            for sw in data.get("switches", []):
                if sw["seq"] > last_seq:
                    self.instance_metrics.observe_switch(name, sw)
                    last_seq = sw["seq"]
            self._marks[name] = (m.pid, last_round, last_seq)
            report = await self.directory.memory(name)
            if report and report.get("layout"):
                self._hbm[name] = _regions(report)
                self._host_kv[name] = report.get("host_kv_bytes", 0)

    async def _collect_forever(self, interval_s: float = 1.0) -> None:
        while True:
            await self.collect_records()
            await asyncio.sleep(interval_s)

    def reload_config(self) -> tuple[list[str], list[str]]:
        """Re-read the config file and apply what can change live (policy knobs, supervisor
        timings); returns (applied, needs_restart) as field paths. Raises ConfigError."""
        new = load_config(self.config_path)
        old = self.cfg
        live_policy = new.policy.model_copy(update={"router": old.policy.router,
                                                    "mem_fraction_bump": old.policy.mem_fraction_bump})
        applied_cfg = old.model_copy(update={"policy": live_policy, "supervisor": new.supervisor})
        applied = _changed(old, applied_cfg)
        needs_restart = [p for p in _changed(applied_cfg, new)]
        # knobs the instance schedulers also read take effect there only when they restart
        needs_restart += [f"{p} (instance schedulers)" for p in applied if p in _SCHEDULER_KNOBS]
        self.cfg = self.supervisor.cfg = self.gateway.cfg = applied_cfg
        self.routing.router.set_knobs(router_knobs(applied_cfg))
        self.directory.interval_s = applied_cfg.policy.telemetry_interval_s
        log.info("config reloaded: applied %s; needs restart %s", applied or "-", needs_restart or "-")
        return applied, needs_restart

    async def run(self) -> None:
        stop = httpserver.stop_event()
        sock = httpserver.bind(self.cfg.listen.http_host, self.cfg.listen.http_port)
        host, port = sock.getsockname()[:2]
        self.endpoint = f"http://{host}:{port}"
        http, http_task = await httpserver.start(build_app(self.gateway), sock)
        admin = await admin_server.start(self.admin_socket,
                                         admin_server.AdminService(self.status, self.routing.router,
                                                                   memory=self.directory.memory,
                                                                   operator=self.operator))
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
        collector = asyncio.create_task(self._collect_forever())
        watchdog = asyncio.create_task(_watchdog())
        sdnotify.notify("READY=1", f"STATUS=serving {len(self.cfg.models)} models on {len(self.cfg.instances)} instances")
        print(f"talariad: listening on {self.endpoint}/v1 (admin: unix:{self.admin_socket})", flush=True)
        await stop.wait()
        poller.cancel()
        collector.cancel()
        watchdog.cancel()


async def _watchdog() -> None:
    """Ping systemd from the event loop itself, so a wedged loop is caught."""
    interval = sdnotify.watchdog_interval_s()
    while interval:
        sdnotify.notify("WATCHDOG=1")
        await asyncio.sleep(interval)


_SCHEDULER_KNOBS = {"policy.gamma", "policy.ttft_target_s", "policy.tpot_target_s", "policy.tau_s"}


def _changed(a: TalariaConfig, b: TalariaConfig) -> list[str]:
    """Dotted paths of the fields that differ (a list-valued section counts as one field)."""
    da, db = a.model_dump(), b.model_dump()
    out = []
    for section in da:
        va, vb = da[section], db[section]
        if isinstance(va, dict):
            out += [f"{section}.{k}" for k in va if va[k] != vb.get(k)]
        elif va != vb:
            out.append(section)
    return out


def _regions(report: dict) -> dict[str, int]:
    """Layout rows summed by region kind, plus the free bytes. Staged chunks sit inside the KV
    pool's free tail, so they are carved out of `kv_pool` rather than counted twice."""
    out: dict[str, int] = {}
    for row in report["layout"]:
        kind, size = row["region"].split("[")[0], int(row["size"])
        if kind == "staged":
            out["kv_pool"] = out.get("kv_pool", 0) - size
        out[kind] = out.get(kind, 0) + size
    out["free"] = int(report.get("hbm_free_bytes", 0))
    return out
