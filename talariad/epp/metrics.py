"""The EPP's Prometheus series, in a registry of its own (served on the operators' HTTP side,
`epp.admin`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from talariad.epp.contract import ImmediateAnswer

OUTCOMES = ("picked", "refused", "too_large", "body_timeout", "overloaded", "error")
"""A decision: routed; refused by the picker (400 for a body its API refuses, 429 when no box
can take it, 503 when none is healthy); body over the bound (413, from its Content-Length or as
it arrived); body not whole in time (408); the picker at its own limit (429: its streams, the
bodies it holds); picker failed (503)."""

REFUSALS = (
    ("400", "invalid_request_error"),
    ("408", "request_timeout"),
    ("413", "request_too_large"),
    ("429", "pool_full"),
    ("429", "epp_stream_limit"),
    ("429", "epp_body_buffer_full"),
    ("429", "boxes_late"),
    ("503", "no_healthy_box"),
    ("503", "epp_error"),
)
"""The refusals an operator watches, shown at 0 from the start (others appear when they occur)."""


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
        self.lag_seconds = Histogram(
            "talaria_epp_arrival_to_decision_seconds",
            "From the request's headers reaching the picker to its routing reply: the body's "
            "transfer and the wait for the picker (a lease is judged at the arrival)",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r,
        )
        self.kinds = Counter(
            "talaria_epp_decision_kinds",
            "Placed calls by the kind of decision (lease_hit, cost, replica_open, ...)",
            ["kind"],
            registry=r,
        )
        self.at_headers = Counter(
            "talaria_epp_at_headers",
            "Calls checked at their request headers: placed at their headers as lease returns "
            "(placed), or left to the full-duplex filter to decide on the body (deferred)",
            ["result"],
            registry=r,
        )
        for result in ("placed", "deferred"):
            self.at_headers.labels(result)
        self.logged = Counter(
            "talaria_epp_access_log_entries",
            "Envoy's access-log entries received (the ends of calls placed at their headers)",
            registry=r,
        )
        self.refusals = Counter(
            "talaria_epp_refusals",
            "Calls the picker answered itself instead of routing, by HTTP status and the error's "
            "code (429 pool_full: every box at its connection limit; epp_stream_limit, "
            "epp_body_buffer_full: the picker at its own; 413, 408: the body's size, its time)",
            ["status", "code"],
            registry=r,
        )
        for status, code in REFUSALS:
            self.refusals.labels(status, code)
        self.served_mismatch = Counter(
            "talaria_epp_served_mismatch",
            "Responses Envoy reports served by an endpoint other than the pick and its fallback",
            registry=r,
        )

    def refused(self, answer: ImmediateAnswer) -> None:
        self.refusals.labels(str(answer.status), answer.code or "unknown").inc()

    def decided(self, outcome: str, seconds: float, lag_s: float | None = None) -> None:
        self.decisions.labels(outcome).inc()
        self.decision_seconds.observe(seconds)
        if lag_s is not None:
            self.lag_seconds.observe(max(lag_s, 0.0))
