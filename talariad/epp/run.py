"""`talariad epp`: discovery → box poller → picker ← ext_proc server, and the operators' HTTP
side. The ext_proc server (`epp.server`) and discovery (`epp.discovery`) are reached through
one function each (`serve_ext_proc`, `discovered`), so each is changed in one place."""

from __future__ import annotations

import asyncio
import logging
import pathlib
import sys
from collections.abc import AsyncIterator

from prometheus_client import CollectorRegistry

from talariad import httpserver
from talariad.epp.admin import admin_app
from talariad.epp.boxes import BoxPoller, Discovery
from talariad.epp.boxpicker import BoxPicker
from talariad.epp.config import EPPConfig, read_token
from talariad.gc_tuning import settle_gc
from talariad.router import Router

log = logging.getLogger("talariad.epp")


def build_picker(cfg: EPPConfig) -> BoxPicker:
    """A picker over an empty pool (the poller adds the boxes); profiles come from the boxes."""
    return BoxPicker(Router(cfg.knobs(), {}), cfg.max_branches)


async def discovered(cfg: EPPConfig, base: pathlib.Path) -> Discovery:
    """The configured discovery source as `{name: "ip:port"}` sets."""
    try:
        from talariad.epp import discovery
    except ImportError:  # the discovery sources land on their own branch
        raise RuntimeError("discovery (talariad.epp.discovery) is not in this build") from None
    if cfg.discovery.static is not None:
        from talariad.epp.discovery.file import FileSource

        source = FileSource(base / cfg.discovery.static.file)
    else:
        from talariad.epp.discovery.kube import KubeSource

        k = cfg.discovery.kubernetes
        source = KubeSource(k.pool, k.namespace)  # type: ignore[union-attr]
    changes: AsyncIterator = source.changes()
    async for boxes in changes:
        yield discovery.endpoints(boxes)


async def serve_ext_proc(
    picker: BoxPicker, cfg: EPPConfig, base: pathlib.Path, registries: list[CollectorRegistry]
) -> None:
    """Serve Envoy's ext_proc with `picker` until SIGTERM/SIGINT, then drain: the one call into
    `epp.server` (it adds its metrics registry to `registries`)."""
    try:
        from talariad.epp import server
        from talariad.epp.metrics import EPPMetrics
    except ImportError:  # the server lands on its own branch
        raise RuntimeError(
            "the ext_proc server (talariad.epp.server) is not in this build"
        ) from None
    metrics = EPPMetrics()
    registries.append(metrics.registry)
    tls = None
    if cfg.tls is not None:
        tls = server.TLSFiles(base / cfg.tls.cert_file, base / cfg.tls.key_file)
    started = await server.start(server.ExtProcServicer(picker, metrics=metrics), cfg.listen, tls)
    print(f"talariad epp: ext_proc listening on {cfg.listen}", file=sys.stderr, flush=True)
    await server.serve(started, cfg.drain_s)


async def run_epp(cfg: EPPConfig, config_path: str) -> None:
    """Run until the ext_proc server stops (SIGTERM/SIGINT)."""
    base = pathlib.Path(config_path).parent
    picker = build_picker(cfg)
    poller = BoxPoller(
        picker, read_token(base / cfg.token_file), cfg.poll_interval_s, cfg.stale_after_s
    )
    registries: list[CollectorRegistry] = []
    host, _, port = cfg.metrics.rpartition(":")
    http, http_task = await httpserver.start(
        admin_app(picker, registries), httpserver.bind(host.strip("[]"), int(port))
    )
    settle_gc()  # start-up is done: the picker's p99 is the collector's as much as its own
    polling = asyncio.create_task(poller.run(discovered(cfg, base)))
    serving = asyncio.create_task(serve_ext_proc(picker, cfg, base, registries))
    try:
        # either ending ends both: no picker without boxes, no boxes without a server
        done, _ = await asyncio.wait((polling, serving), return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()  # raises what stopped it
    finally:
        for task in (polling, serving):
            task.cancel()
        await asyncio.gather(polling, serving, return_exceptions=True)
        http.should_exit = True
        await asyncio.gather(http_task, return_exceptions=True)
