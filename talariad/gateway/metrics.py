"""Prometheus series of the gateway (`talaria_` prefix, vLLM stems, seconds, a `model` label)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.finished = Counter("talaria_requests_finished", "Calls finished, by reason", ["model", "reason"], registry=r)
        self.ttft = Histogram("talaria_time_to_first_token_seconds", "Gateway-observed TTFT", ["model"],
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("talaria_e2e_request_latency_seconds", "Call latency", ["model"],
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("talaria_prompt_tokens", "Prompt tokens", ["model"], registry=r)
        self.generation_tokens = Counter("talaria_generation_tokens", "Completion tokens", ["model"], registry=r)
        self.cached_tokens = Counter("talaria_prefix_cache_hit_tokens", "Prompt tokens served from a reused prefix",
                                     ["model", "source"], registry=r)
        self.running = Gauge("talaria_requests_running", "Calls in flight at the gateway", ["model"], registry=r)
        self.telemetry_bytes = Gauge("talaria_telemetry_payload_bytes", "Size of an instance's latest telemetry reply",
                                     ["instance"], registry=r)
