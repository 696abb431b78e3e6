"""`talariad run`: supervisor, gateway, router and admin API in one asyncio process.

Signals: SIGTERM (or a first SIGINT) drains: no new connections, in-flight and queued calls run
to completion for up to `supervisor.shutdown_grace_s`, the rest end with an error event, then the
instances stop and the daemon exits 0. A second SIGINT exits at once (instances are killed).
SIGHUP re-reads the config file and applies what can change live (`reload_config`).
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import os
import pathlib
import signal
import time
from collections.abc import Callable
from typing import TypeVar

from talariad import __version__, httpserver, lockfile, sdnotify
from talariad.admin import admin_pb2
from talariad.admin import server as admin_server
from talariad.admin.operator import Operator, Services
from talariad.admin.planning import PlannerShell
from talariad.admin.sockets import daemon_socket
from talariad.checks import load_checked, parse_checked
from talariad.config import ConfigError, TalariaConfig, split_host_port
from talariad.gateway.app import Gateway, build_app, metrics_app
from talariad.gateway.health import Availability, InstanceView, Readiness, availability
from talariad.gateway.instances import InstanceDirectory
from talariad.gateway.metrics import InstanceMetrics
from talariad.gateway.routing import RouterShell
from talariad.gc_tuning import settle_gc
from talariad.knobs import config_router_knobs, model_profile
from talariad.secretfiles import load_keys, load_token
from talariad.supervisor import ProcState, Supervisor

log = logging.getLogger("talariad")
T = TypeVar("T")

LIVE_FIELDS = (
    "policy.tau_s",
    "policy.admission_unit_s",
    "policy.replica_penalty_s",
    "policy.staleness_s",
    "policy.overload",
    "policy.queue_limit",
    "policy.queue_timeout_s",
    "policy.telemetry_interval_s",
    "policy.unready_after_polls",
    "ablations.reservations",
    "ablations.residency_terms",
    "limits.*",
    "listen.api_keys_file",
    "pool.*",
    "listen.allow_unauthenticated",
    "supervisor.*",
    "models.*.aliases",
)
"""Config fields `reload_config` applies to the running daemon (fnmatch patterns over dotted paths).
Everything else (models, instances, listen addresses, instance-side scheduler knobs) needs a restart."""

_SCHEDULER_KNOBS = {"policy.gamma", "policy.ttft_target_s", "policy.tpot_target_s", "policy.tau_s"}
_HTTP_BACKSTOP_S = 10.0  # uvicorn cancels what is still running this long after our own grace
FAST_EXIT = 130  # a second SIGINT: the conventional status of a process ended by SIGINT


class Daemon:
    def __init__(self, cfg: TalariaConfig, config_path: str):
        self.cfg, self.config_path = cfg, config_path
        self.admin_socket = daemon_socket(cfg.listen.admin_socket)
        self.started = time.monotonic()
        self.supervisor = Supervisor(cfg, config_path)
        self.routing = RouterShell.from_config(
            cfg, {m.name: model_profile(cfg, m.name) for m in cfg.models}
        )
        self.readiness = Readiness(cfg.policy.unready_after_polls)
        self.directory = InstanceDirectory(
            self._urls,
            cfg.policy.telemetry_interval_s,
            on_telemetry=self._observed,
            on_down=self._down,
            on_unhealthy=self._missed,
            token_for=self.supervisor.token_for,
            sockets=self._sockets,
            on_payload=self._telemetry_payload,
        )
        self.gateway = Gateway(cfg, self.directory, self.routing, self._ready, self._describe)
        self.gateway.availability = self.availability
        self.routing.unavailable = lambda model: self.availability(model).why
        self.gateway.api_keys = self._keys(cfg)
        self.gateway.pool.token = self._pool_token(cfg)
        self.endpoint = ""
        self.operator = Operator(
            Services(
                self, self.supervisor, self.routing.router, self.routing.branches, self.directory
            )
        )
        self.instance_metrics = InstanceMetrics(self.gateway.metrics.registry, self.metric_sample)
        self.planning = None if cfg.planner.mode == "off" else self._planner(cfg)
        self._marks: dict[
            str, tuple[int | None, int, int]
        ] = {}  # instance -> (pid, last round, last switch seq)
        self._hbm: dict[str, dict[str, int]] = {}
        self._host_kv: dict[str, int] = {}
        self._stop = asyncio.Event()
        self._background: list[asyncio.Task] = []
        self._http: httpserver.Server | None = None
        self.metrics_endpoint = ""  # `listen.metrics`, once bound

    def _planner(self, cfg: TalariaConfig) -> PlannerShell | None:
        try:
            return PlannerShell(
                cfg,
                self,
                self.operator,
                self.routing.router,
                self.gateway.metrics.registry,
                self.directory.snapshot,
            )
        except ValueError as err:  # the daemon serves without it rather than not at all
            log.error("planner not started: %s", err)
            return None

    # -- instances as the gateway sees them ----------------------------------------------------

    def _urls(self) -> dict[str, str | None]:
        return {name: m.base_url for name, m in self.supervisor.procs.items()}

    def _telemetry_payload(self, instance: str, nbytes: int) -> None:
        self.gateway.metrics.telemetry_bytes.labels(instance).set(nbytes)

    def _sockets(self) -> dict[str, str | None]:
        return {name: m.call_socket for name, m in self.supervisor.procs.items()}

    def _observed(self, telemetry, now: float) -> None:
        self.routing.observe(telemetry, now)
        if self.readiness.polled(telemetry.instance, True, now):
            log.info("instance %s is ready", telemetry.instance)

    def _missed(self, name: str, now: float) -> None:
        self.routing.unhealthy(name, now)
        if self.readiness.polled(name, False, now):
            log.warning(
                "instance %s is not ready: %d telemetry polls failed in a row "
                "(policy.unready_after_polls)",
                name,
                self.readiness.failed_polls(name),
            )

    def _down(self, name: str, now: float) -> None:
        self.routing.instance_down(name, now)
        self.readiness.down(name)

    def _ready(self, name: str) -> bool:
        return self.supervisor.procs[name].state == ProcState.READY and self.readiness.ready(name)

    def instance_view(self, name: str) -> InstanceView:
        m = self.supervisor.procs[name]
        return InstanceView(
            name,
            hosts=tuple((m.role or {}).get("models", m.inst.models)),
            serving=tuple(self.serving_models(name)),
            state=m.state.value,
            ready=self.readiness.ready(name),
            admission=self.admission(name, self.directory.snapshot(name)),
            failed_polls=self.readiness.failed_polls(name),
        )

    def availability(self, model: str) -> Availability:
        """Which instances take `model`'s new calls now, and why the others do not."""
        return availability(model, [self.instance_view(n) for n in self.supervisor.procs])

    def _describe(self) -> list[dict]:
        now = time.monotonic()
        out = []
        for name, m in self.supervisor.procs.items():
            age = self.directory.age_s(name, now)
            out.append(
                {
                    "name": name,
                    "state": m.state.value,
                    "ready": self._ready(name),
                    "telemetry_age_s": round(age, 3) if age != float("inf") else None,
                    "failed_polls": self.readiness.failed_polls(name),
                    "restarts": m.restarts,
                }
            )
        return out

    def status(self) -> admin_pb2.StatusReply:
        now = time.monotonic()
        return admin_pb2.StatusReply(
            version=__version__,
            uptime_s=now - self.started,
            http_endpoint=self.endpoint,
            instances=[self.instance_status(i.name, now) for i in self.cfg.instances],
        )

    async def _memory_report(self, name: str) -> dict | None:
        """`talaria-ctl instance memory`: the instance's memory report and its process figures
        (asked for apart: the daemon reads the layout every second, the figures on demand)."""
        report = await self.directory.client.memory(name)
        if report is not None:
            report["process"] = await self.directory.client.process(name) or {}
        return report

    def residency(self, model: str) -> str:
        return self.gateway.residency(model)

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
        busy = (
            snap is None
            or snap.running
            or any(snap.queued.values())
            or name in router.in_flight().values()
        )
        return "draining" if busy else "drained"

    def instance_status(self, name: str, now: float | None = None) -> admin_pb2.InstanceStatus:
        now = time.monotonic() if now is None else now
        inst = self.supervisor.procs[name].inst
        m, snap = self.supervisor.procs[inst.name], self.directory.snapshot(inst.name)
        age = self.directory.age_s(inst.name, now)
        return admin_pb2.InstanceStatus(
            name=inst.name,
            pool=self.pool_of(name),
            configured_pool=inst.pool,
            executor=inst.executor,
            rotation=self.serving_models(name),
            retired=self.routing.router.retired(name, now),
            admission=self.admission(name, snap),
            devices=inst.devices
            if isinstance(inst.devices, str)
            else ",".join(map(str, inst.devices)),
            models=(m.role or {}).get("models", inst.models),
            state=m.state.value,
            healthy=self._ready(inst.name),
            pid=m.pid or 0,
            restarts=m.restarts,
            active_model=(snap.active_model or "") if snap else "",
            loaded_models=snap.loaded_models if snap else [],
            running=snap.running if snap else 0,
            queued=sum(snap.queued.values()) if snap else 0,
            switches=snap.switches if snap else 0,
            telemetry_age_s=age if age != float("inf") else -1.0,
        )

    def metric_sample(self) -> dict[str, dict]:
        """Per-instance gauge values for a /metrics scrape."""
        out = {}
        leases = self.routing.router.leases()
        now = time.monotonic()
        for name, m in self.supervisor.procs.items():
            snap = self.directory.snapshot(name)
            out[name] = {
                "queued": sum(snap.queued.values()) if snap else 0,
                "running": snap.running if snap else 0,
                "leases": sum(le.instance == name and le.live(now) for le in leases),
                "restarts": m.restarts,
                "hbm": self._hbm.get(name, {}),
                "host_kv_bytes": self._host_kv.get(name),
            }
        return out

    async def collect_records(self) -> None:
        """Fold new closed rounds and switch records of every ready instance into the metrics, and
        refresh the HBM layout of managed ones."""
        for name, m in self.supervisor.procs.items():
            if m.base_url is None:
                continue
            data = await self.directory.client.rounds(name, 256)
            if data is None:
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
            report = await self.directory.client.memory(name)
            if report and report.get("layout"):
                self._hbm[name] = _regions(report)
                self._host_kv[name] = report.get("host_kv_bytes", 0)

    async def _collect_forever(self, interval_s: float = 1.0) -> None:
        while True:
            await self.collect_records()
            await asyncio.sleep(interval_s)

    # -- configuration -------------------------------------------------------------------------

    def _keys(self, cfg: TalariaConfig) -> frozenset[str] | None:
        return self._secret(cfg.listen.api_keys_file, load_keys)

    def _pool_token(self, cfg: TalariaConfig) -> str | None:
        return self._secret(cfg.pool.token_file, load_token)

    def _secret(self, name: str | None, load: Callable[[pathlib.Path], T]) -> T | None:
        """A secrets file named in the config, read beside it (None when not configured)."""
        if not name:
            return None
        try:
            return load(pathlib.Path(self.config_path).parent / name)
        except ValueError as err:
            raise RuntimeError(str(err)) from None

    def reload_config(self) -> tuple[list[str], list[str]]:
        """Re-read the config file and apply what can change live (LIVE_FIELDS): router knobs,
        limits, API keys, supervisor timings, model aliases. Returns (applied, needs_restart) as
        dotted field paths. Raises ConfigError (nothing applied) when the file is invalid."""
        new = load_checked(self.config_path, serving=False)
        old_flat, new_flat = _flatten(self.cfg.model_dump()), _flatten(new.model_dump())
        changed = sorted(
            k for k in old_flat.keys() | new_flat.keys() if old_flat.get(k) != new_flat.get(k)
        )
        applied = [k for k in changed if _live(k)]
        restart = [k for k in changed if not _live(k)]
        # knobs the instance schedulers also read reach them only when they restart
        restart += [f"{k} (instance schedulers)" for k in applied if k in _SCHEDULER_KNOBS]
        if restart:  # keep what cannot change live as it runs; take the rest from the file
            merged = self.cfg.model_dump()
            for k in applied:
                _assign(merged, k, new_flat.get(k))
            new = parse_checked(merged, self.config_path)
        keys = self._keys(new)  # re-read even when the path is unchanged: keys may have rotated
        self.gateway.pool.token = self._pool_token(new)  # the same: a pool token may rotate
        if keys != self.gateway.api_keys and "listen.api_keys_file" not in applied:
            applied.append("listen.api_keys_file (keys re-read)")
        self._apply(new, keys)
        return applied, restart

    def _apply(self, cfg: TalariaConfig, keys: frozenset[str] | None) -> None:
        self.cfg = self.gateway.cfg = self.supervisor.cfg = cfg
        self.gateway.api_keys = keys
        self.gateway.pool.max_sessions = cfg.pool.max_sessions_per_instance
        self.routing.router.retune(config_router_knobs(cfg))
        self.directory.interval_s = cfg.policy.telemetry_interval_s
        self.readiness.unready_after = cfg.policy.unready_after_polls
        if self._http is not None:
            self._http.config.timeout_graceful_shutdown = (
                cfg.supervisor.shutdown_grace_s + _HTTP_BACKSTOP_S
            )

    def _on_hangup(self) -> None:
        try:
            applied, restart = self.reload_config()
        except (ConfigError, RuntimeError) as err:
            log.error("SIGHUP: config not reloaded: %s", err)
            return
        log.info(
            "SIGHUP: config reloaded; applied: %s; needs a restart: %s",
            ", ".join(applied) or "nothing",
            ", ".join(restart) or "nothing",
        )

    # -- lifecycle -----------------------------------------------------------------------------

    def _on_interrupt(self) -> None:
        if self._stop.is_set():  # the second SIGINT: do not wait for the drain
            log.warning("second SIGINT: exiting without draining")
            self.supervisor.kill_now()
            os._exit(FAST_EXIT)
        self._begin_drain("SIGINT")

    def _begin_drain(self, signame: str) -> None:
        if not self._stop.is_set():
            log.info(
                "%s: draining: no new connections; calls in flight and queued may run for up "
                "to %gs (supervisor.shutdown_grace_s)",
                signame,
                self.cfg.supervisor.shutdown_grace_s,
            )
        self._stop.set()

    def _signals(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._begin_drain, "SIGTERM")
        loop.add_signal_handler(signal.SIGINT, self._on_interrupt)
        loop.add_signal_handler(signal.SIGHUP, self._on_hangup)

    async def run(self) -> None:
        try:
            self._lock = lockfile.acquire(self.admin_socket)  # before the socket is touched
        except lockfile.Busy as err:
            raise RuntimeError(str(err)) from None
        self._signals()
        sock = httpserver.bind(self.cfg.listen.http_host, self.cfg.listen.http_port)
        host, port = sock.getsockname()[:2]
        self.endpoint = f"http://{host}:{port}"
        # uvicorn's own cancel-on-timeout only backs up our drain (which ends calls cleanly first)
        scrape = await self._start_metrics()
        http, http_task = await httpserver.start(
            build_app(self.gateway, metrics=scrape is None),
            sock,
            keep_alive_s=self.cfg.limits.keep_alive_timeout_s,
            head_timeout_s=self.cfg.limits.header_timeout_s,
            body_timeout_s=self.cfg.limits.body_timeout_s,
            max_connections=self.cfg.limits.max_connections,
            graceful_s=self.cfg.supervisor.shutdown_grace_s + _HTTP_BACKSTOP_S,
        )
        self._http = http
        admin = await admin_server.start(
            self.admin_socket,
            admin_server.AdminService(
                self.status,
                self.routing.router,
                memory=self._memory_report,
                operator=self.operator,
                planning=self.planning,
            ),
            group=self.cfg.listen.admin_group,
        )
        try:
            await self._serve()
        finally:
            sdnotify.notify("STOPPING=1")
            await self._drain(http, http_task)
            if scrape is not None:
                scrape[0].should_exit = True
                await scrape[1]
            await admin.stop(grace=1.0)
            await self.supervisor.stop()
            for t in self._background:
                t.cancel()
            await asyncio.gather(*self._background, return_exceptions=True)
            await self.directory.aclose()

    async def _start_metrics(self) -> tuple[httpserver.Server, asyncio.Task] | None:
        """`/metrics` on `listen.metrics`, when configured (else it stays on the HTTP endpoint)."""
        if self.cfg.listen.metrics is None:
            return None
        host, port = split_host_port(self.cfg.listen.metrics)
        sock = httpserver.bind(host, port)
        bound = sock.getsockname()[:2]
        self.metrics_endpoint = f"http://{bound[0]}:{bound[1]}/metrics"
        return await httpserver.start(metrics_app(self.gateway), sock)

    async def _serve(self) -> None:
        starting = asyncio.create_task(self.supervisor.start())
        await asyncio.wait(
            [starting, asyncio.create_task(self._stop.wait())], return_when=asyncio.FIRST_COMPLETED
        )
        if self._stop.is_set():
            starting.cancel()
            return
        starting.result()
        await self.directory.poll_once()
        settle_gc()
        # both keep running through the drain: held calls need fresh telemetry to be placed
        self._background = [
            asyncio.create_task(self.directory.poll_forever()),
            asyncio.create_task(self._collect_forever()),
            asyncio.create_task(_watchdog()),
        ]
        if self.planning is not None:
            self._background.append(asyncio.create_task(self.planning.run_forever()))
        sdnotify.notify(
            "READY=1",
            f"STATUS=serving {len(self.cfg.models)} models on {len(self.cfg.instances)} instances",
        )
        print(
            f"talariad: listening on {self.endpoint}/v1 (admin: unix:{self.admin_socket}"
            + (f", metrics: {self.metrics_endpoint})" if self.metrics_endpoint else ")"),
            flush=True,
        )
        await self._stop.wait()

    async def _drain(self, http, http_task: asyncio.Task) -> None:
        """Stop accepting; let running calls finish within the grace; then end the rest with an error."""
        http.should_exit = True
        self.gateway.pool.close()  # a picker's snapshot stream would hold the drain to its grace
        grace = self.cfg.supervisor.shutdown_grace_s
        sdnotify.notify(f"STATUS=draining (up to {grace:g}s)")
        done, _ = await asyncio.wait([http_task], timeout=grace)
        if not done:
            self.routing.close()
            ended = await self.directory.client.abort_all()
            log.warning(
                "shutdown grace of %gs ran out: ended %d call(s) with an error", grace, ended
            )
        await http_task


def _flatten(data, prefix: str = "") -> dict[str, object]:
    """Dotted leaf paths of a config dump (`models.0.aliases`); lists of scalars are leaves."""
    out: dict[str, object] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(data, list) and any(isinstance(v, dict) for v in data):
        for i, v in enumerate(data):
            out.update(_flatten(v, f"{prefix}.{i}"))
    else:
        out[prefix] = data
    return out


def _live(path: str) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in LIVE_FIELDS)


def _assign(tree: dict, path: str, value) -> None:
    *parents, leaf = path.split(".")
    node = tree
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if isinstance(node, list):
        node[int(leaf)] = value
    else:
        node[leaf] = value


async def _watchdog() -> None:
    """Ping systemd from the event loop itself, so a wedged loop is caught."""
    interval = sdnotify.watchdog_interval_s()
    while interval:
        sdnotify.notify("WATCHDOG=1")
        await asyncio.sleep(interval)


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
