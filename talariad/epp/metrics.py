"""The EPP's Prometheus series, in a registry of its own, and the HTTP listener that shows them."""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

OUTCOMES = ("picked", "refused", "too_large", "error")
"""A decision: routed; refused by the picker; body over the bound (413); picker failed (503)."""


class EPPMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.streams = Counter(
            "talaria_epp_streams", "ext_proc streams opened (one per HTTP request)", registry=r
        )
        self.in_flight = Gauge(
            "talaria_epp_streams_in_flight", "ext_proc streams open now", registry=r
        )
        self.decisions = Counter(
            "talaria_epp_decisions", "Routing decisions by outcome", ["outcome"], registry=r
        )
        for outcome in OUTCOMES:  # every outcome shows, at 0, from the start
            self.decisions.labels(outcome)
        self.decision_seconds = Histogram(
            "talaria_epp_decision_seconds",
            "From the request's end of stream to the routing reply",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.0),
            registry=r,
        )
        self.served_mismatch = Counter(
            "talaria_epp_served_mismatch",
            "Responses Envoy reports served by an endpoint other than the one picked",
            registry=r,
        )

    def decided(self, outcome: str, seconds: float) -> None:
        self.decisions.labels(outcome).inc()
        self.decision_seconds.observe(seconds)


def serve_metrics(metrics: EPPMetrics, port: int, host: str = "127.0.0.1") -> WSGIServer:
    """Serve `metrics` at http://host:port/metrics from a daemon thread; port 0 takes a free one
    (`.server_port`). Stop it with `.shutdown()`."""
    server, _thread = start_http_server(port, host, registry=metrics.registry)
    return server
