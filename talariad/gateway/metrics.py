"""Prometheus series of the gateway (`talaria_` prefix, vLLM stems, seconds, a `model` label)."""

from __future__ import annotations

import asyncio
import gc

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.metrics import MetricWrapperBase

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.finished = Counter(
            "talaria_requests_finished",
            "Calls finished, by reason",
            ["model", "reason"],
            registry=r,
        )
        self.ttft = Histogram(
            "talaria_time_to_first_token_seconds",
            "Gateway-observed TTFT",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "talaria_e2e_request_latency_seconds",
            "Call latency",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "talaria_prompt_tokens", "Prompt tokens", ["model"], registry=r
        )
        self.generation_tokens = Counter(
            "talaria_generation_tokens", "Completion tokens", ["model"], registry=r
        )
        self.cached_tokens = Counter(
            "talaria_prefix_cache_hit_tokens",
            "Prompt tokens served from a reused prefix",
            ["model", "source"],
            registry=r,
        )
        self.running = Gauge(
            "talaria_requests_running", "Calls in flight at the gateway", ["model"], registry=r
        )
        self.telemetry_bytes = Gauge(
            "talaria_telemetry_payload_bytes",
            "Size of an instance's latest telemetry reply",
            ["instance"],
            registry=r,
        )
        self.responses = Counter(
            "talaria_http_responses",
            "HTTP responses of the gateway, by status code",
            ["code"],
            registry=r,
        )
        self._models: dict[str, ModelSeries] = {}
        _process_series(r)

    def model(self, name: str) -> ModelSeries:
        """The model's series, looked up once (`labels()` costs a lock and a tuple per call)."""
        series = self._models.get(name)
        if series is None:
            series = self._models[name] = ModelSeries(self, name)
        return series


def _process_series(r: CollectorRegistry) -> None:
    """The daemon's own process: flat over weeks in a daemon that ages well."""
    ProcessCollector(registry=r)  # process_resident_memory_bytes, process_open_fds, ...
    Gauge("talaria_process_asyncio_tasks", "Asyncio tasks of the daemon", registry=r).set_function(
        _asyncio_tasks
    )
    Gauge(
        "talaria_process_gc_objects",
        "Objects the daemon's cyclic garbage collector tracks (counted at scrape)",
        registry=r,
    ).set_function(lambda: len(gc.get_objects()))


def _asyncio_tasks() -> int:
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:  # scraped off the event loop's thread
        return 0


class ModelSeries:
    """One model's children of the gateway's per-call series."""

    __slots__ = (
        "running",
        "ttft",
        "e2e",
        "prompt_tokens",
        "generation_tokens",
        "_finished",
        "_cached",
    )

    def __init__(self, m: GatewayMetrics, model: str) -> None:
        self.running = m.running.labels(model)
        self.ttft = m.ttft.labels(model)
        self.e2e = m.e2e.labels(model)
        self.prompt_tokens = m.prompt_tokens.labels(model)
        self.generation_tokens = m.generation_tokens.labels(model)
        self._finished = Children(m.finished, model)
        self._cached = Children(m.cached_tokens, model)

    def finished(self, reason: str):
        return self._finished.get(reason)

    def cached_tokens(self, source: str):
        return self._cached.get(source)


class Children:
    """A labelled series' children by the value of its last label (the others fixed), looked up
    once each."""

    __slots__ = ("metric", "head", "_by")

    def __init__(self, metric: MetricWrapperBase, *head: str) -> None:
        self.metric, self.head, self._by = metric, head, {}

    def get(self, value: str):
        child = self._by.get(value)
        if child is None:
            child = self._by[value] = self.metric.labels(*self.head, value)
        return child


_SWITCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20)
_ROUND_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32)


class InstanceMetrics:
    """Per-instance series. Histograms and counters are fed from the instances' round and switch
    records (`observe_round`, `observe_switch`); gauges are read at scrape time from `sample()`."""

    def __init__(self, registry: CollectorRegistry, sample) -> None:
        r = registry
        self.switch = Histogram(
            "talaria_switch_duration_seconds",
            "Model switch time, by path",
            ["instance", "path"],
            buckets=_SWITCH_BUCKETS,
            registry=r,
        )
        self.round_wall = Histogram(
            "talaria_round_duration_seconds",
            "Round wall time (active + switch)",
            ["instance"],
            buckets=_ROUND_BUCKETS,
            registry=r,
        )
        self.round_switch = Histogram(
            "talaria_round_switch_seconds",
            "Switch time inside one round",
            ["instance"],
            buckets=_ROUND_BUCKETS,
            registry=r,
        )
        self.sp_admitted = Counter(
            "talaria_sp_admitted",
            "Returns admitted mid-slot by session-prefill",
            ["instance"],
            registry=r,
        )
        self.sp_parked = Counter(
            "talaria_sp_parked", "Returns parked to a later slot", ["instance"], registry=r
        )
        r.register(_GaugeCollector(sample))

    def observe_round(self, instance: str, rnd: dict) -> None:
        self.round_wall.labels(instance).observe(rnd["wall_s"])
        self.round_switch.labels(instance).observe(rnd["switch_s"])
        self.sp_admitted.labels(instance).inc(rnd["sp_admitted"])
        self.sp_parked.labels(instance).inc(rnd["sp_parked"])

    def observe_switch(self, instance: str, sw: dict) -> None:
        self.switch.labels(instance, sw["path"]).observe(sw["total_s"])


_GAUGES = {
    "talaria_num_requests_waiting": "Calls queued at the instance",
    "talaria_num_requests_running": "Calls in the instance's running batch",
    "talaria_leases_live": "Live soft reservations on the instance",
    "talaria_hbm_bytes": "Managed device memory by layout region",
    "talaria_host_kv_bytes": "Host KV registry bytes in use",
}


class _GaugeCollector:
    """Gauges and the restart counter, read from the daemon when scraped (never stale)."""

    def __init__(self, sample) -> None:
        self.sample = sample

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.sample()
        families = {
            name: GaugeMetricFamily(
                name,
                doc,
                labels=["instance", "region"] if name == "talaria_hbm_bytes" else ["instance"],
            )
            for name, doc in _GAUGES.items()
        }
        restarts = CounterMetricFamily(
            "talaria_instance_restarts", "Instance process restarts", labels=["instance"]
        )
        for inst, row in s.items():
            families["talaria_num_requests_waiting"].add_metric([inst], row["queued"])
            families["talaria_num_requests_running"].add_metric([inst], row["running"])
            families["talaria_leases_live"].add_metric([inst], row["leases"])
            for region, nbytes in row.get("hbm", {}).items():
                families["talaria_hbm_bytes"].add_metric([inst, region], nbytes)
            if row.get("host_kv_bytes") is not None:
                families["talaria_host_kv_bytes"].add_metric([inst], row["host_kv_bytes"])
            restarts.add_metric([inst], row["restarts"])
        yield from families.values()
        yield restarts
