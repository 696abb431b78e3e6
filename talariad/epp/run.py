"""`talariad epp`: discovery → box poller → picker ← ext_proc server, and the operators' HTTP
side (`/metrics` of the server's series, `/status`, `/calls/ID`)."""

from __future__ import annotations

import asyncio
import logging
import pathlib
import sys
from collections.abc import AsyncIterator

from talariad import httpserver
from talariad.config import split_host_port
from talariad.epp import server
from talariad.epp.admin import admin_app
from talariad.epp.boxpicker import BoxPicker
from talariad.epp.config import GATEWAY_HEALTH_CHECK, EPPConfig
from talariad.epp.discovery import endpoints
from talariad.epp.discovery.file import FileSource
from talariad.epp.metrics import EPPMetrics
from talariad.epp.poller import BoxPoller, Discovery
from talariad.gc_tuning import PacedCollector
from talariad.router import Router
from talariad.secretfiles import load_token

log = logging.getLogger("talariad.epp")


def build_picker(cfg: EPPConfig) -> BoxPicker:
    """A picker over an empty pool (the poller adds the boxes); profiles come from the boxes."""
    return BoxPicker(
        Router(cfg.knobs(), {}),
        cfg.max_branches,
        cfg.policy,
        cfg.box_max_connections,
        cfg.conversation_bytes,
    )


async def discovered(cfg: EPPConfig, base: pathlib.Path) -> Discovery:
    """The configured discovery source as `{name: "ip:port"}` sets."""
    if cfg.discovery.static is not None:
        source = FileSource(base / cfg.discovery.static.file)
    else:
        from talariad.epp.discovery.kube import KubeSource  # lightkube: the `k8s` extra

        k = cfg.discovery.kubernetes
        source = KubeSource(k.pool, k.namespace)  # type: ignore[union-attr]
    changes: AsyncIterator = source.changes()
    async for boxes in changes:
        yield endpoints(boxes)


async def serve_ext_proc(
    picker: BoxPicker, cfg: EPPConfig, base: pathlib.Path, metrics: EPPMetrics
) -> None:
    """Serve Envoy's ext_proc with `picker` until SIGTERM/SIGINT, then drain: NOT_SERVING for as
    long as the gateway's health check needs to notice, then the open streams' end."""
    tls = None
    if cfg.tls is not None:
        ca = cfg.tls.client_ca_file
        tls = server.TLSFiles(
            base / cfg.tls.cert_file, base / cfg.tls.key_file, None if ca is None else base / ca
        )
    processor = server.ExtProcServicer(
        picker,
        metrics=metrics,
        max_body_bytes=cfg.max_body_bytes,
        failure_mode=cfg.failure_mode,
        body_timeout_s=cfg.body_timeout_s,
        max_streams=cfg.max_streams,
        body_buffer_bytes=cfg.body_buffer_bytes,
    )
    started = await server.start(processor, cfg.listen, tls)
    print(f"talariad epp: ext_proc listening on {cfg.listen}", file=sys.stderr, flush=True)
    await server.serve(started, cfg.drain_s, GATEWAY_HEALTH_CHECK.notice_s)


async def run_epp(cfg: EPPConfig, config_path: str) -> None:
    """Run until the ext_proc server stops (SIGTERM/SIGINT)."""
    base = pathlib.Path(config_path).parent
    picker = build_picker(cfg)
    poller = BoxPoller(
        picker,
        load_token(base / cfg.token_file, "token_file"),
        cfg.poll_interval_s,
        cfg.stale_after_s,
        cfg.poll_hold_s,
        stream=cfg.poll_stream,
    )
    metrics = EPPMetrics()
    host, port = split_host_port(cfg.metrics)
    http, http_task = await httpserver.start(
        admin_app(picker, metrics.registry), httpserver.bind(host, port)
    )
    # start-up is done: the picker's p99 is the collector's as much as its own (passes of
    # bounded length, a burst's state frozen)
    picker.collector = PacedCollector.started()
    polling = asyncio.create_task(poller.run(discovered(cfg, base)))
    serving = asyncio.create_task(serve_ext_proc(picker, cfg, base, metrics))
    try:
        # either ending ends both: no picker without boxes, no boxes without a server
        done, _ = await asyncio.wait((polling, serving), return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()  # raises what stopped it
    finally:
        for task in (polling, serving):
            task.cancel()
        await asyncio.gather(polling, serving, return_exceptions=True)
        picker.collector.stop()
        http.should_exit = True
        await asyncio.gather(http_task, return_exceptions=True)
