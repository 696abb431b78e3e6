"""`talariad epp --config POOL.yaml`: the endpoint picker's config, checked in one pass."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from talariad.config import (
    ConfigError,
    LimitsConfig,
    _pydantic_lines,
    _Strict,
    read_config_data,
    split_host_port,
)
from talariad.epp.stream import BODY_TIMEOUT_S, MAX_BODY_BYTES
from talariad.router import RouterKnobs
from talariad.router.box_policies import BOX_POLICIES
from talariad.secretfiles import load_token


@dataclasses.dataclass(frozen=True)
class GatewayHealthCheck:
    """The gateway's active health check of the picker (the `epp` cluster of the rendered Envoy
    config, `talaria_pool/envoy.py`): one definition, read by the renderer and by the picker's
    drain, so the two cannot disagree."""

    interval_s: float = 1.0
    timeout_s: float = 0.5
    unhealthy_threshold: int = 1
    """NOT_SERVING answers in a row that mark a picker down."""

    @property
    def notice_s(self) -> float:
        """How long a draining picker keeps taking streams after it answers NOT_SERVING: the
        checks that mark it down, and one interval more (a check under way when it began)."""
        return self.interval_s * (self.unhealthy_threshold + 1)


GATEWAY_HEALTH_CHECK = GatewayHealthCheck()

GATEWAY_STATS = (
    r"failure_mode_allowed|streams_failed|pool_fallback\.upstream_rq_total"
    r"|(upstream_rq_pending|upstream_cx|upstream_rq_retry|downstream_cx)_overflow"
)
"""The gateway's Envoy admin stats (`/stats?filter=`) that say what Envoy did without the picker:
calls routed unpicked (ext_proc's `failure_mode_allowed`, the fail-open cluster's requests),
picker streams that failed, and every overflow of its limits (docs/pool.md)."""

FailureMode = Literal["fail_open", "fail_closed"]
FAILURE_MODE: FailureMode = "fail_open"
"""The one default of the picker's config and of the rendered Envoy config: while no picker
answers, calls go round robin to the boxes that pass their health check. Every box can serve
every call (a moved session recomputes its KV), so a dead picker costs its stickiness and the
streams it carried, not every call after; failing closed answers those 500 until a picker is
back (why, measured: deploy/envoy/README.md)."""

FAILURE_MODE_KEY = "x-talaria-failure-mode"
"""The ext_proc stream's gRPC metadata in which the rendered Envoy config names its failure mode."""


class TLSConfig(_Strict):
    cert_file: str
    key_file: str
    client_ca_file: str | None = None
    """PEM CA certificates: when set, a client (the gateway) must present a certificate one of
    them signed, or its connection is refused (mutual TLS)."""


class StaticDiscovery(_Strict):
    file: str
    """A YAML list of boxes (llm-d's file discovery), reloaded when it changes."""


class KubernetesDiscovery(_Strict):
    pool: str = Field(min_length=1)
    """The `InferencePool` (inference.networking.k8s.io/v1) whose Ready pods are the boxes."""
    namespace: str = Field(default="default", min_length=1)


class DiscoveryConfig(_Strict):
    static: StaticDiscovery | None = None
    kubernetes: KubernetesDiscovery | None = None

    @model_validator(mode="after")
    def _one(self) -> DiscoveryConfig:
        if (self.static is None) == (self.kubernetes is None):
            raise ValueError("give exactly one of 'static' or 'kubernetes'")
        return self


CONVERSATION_BYTES = 256 << 20
"""`EPPConfig.conversation_bytes`'s default."""
MAX_STREAMS = 4096
"""`EPPConfig.max_streams`'s default: ext_proc streams one picker holds at once."""
BODY_BUFFER_BYTES = 4 * MAX_BODY_BYTES
"""`EPPConfig.body_buffer_bytes`'s default: four largest bodies read at once."""
BOX_MAX_CONNECTIONS = LimitsConfig.model_fields["max_connections"].default
"""A box's own default `limits.max_connections`."""
BOX_RESERVED_CONNECTIONS = 8
"""Connections of a box kept for what is not a call: the pickers' snapshot polls, the gateway's
health checks, an operator's probe. The rest is what the pool sends it calls on."""


def box_call_capacity(max_connections: int) -> int:
    """Calls one box takes at once: its `limits.max_connections` less the reserved ones (the box
    closes a connection past its limit as soon as it is accepted)."""
    return max(max_connections - BOX_RESERVED_CONNECTIONS, 1)


LEASE_SLACK_S = 0.5
"""`EPPConfig.lease_slack_s`'s default (the simulator's picker uses it too)."""


class EPPConfig(_Strict):
    listen: str = "127.0.0.1:9002"
    """The ext_proc gRPC address ("host:port") Envoy's EPP cluster points at. Loopback unless
    configured: a stream reveals the boxes' addresses and drives picks, so another host's
    gateway needs an address given here (with `tls`, or a network that only it reaches)."""
    tls: TLSConfig | None = None
    metrics: str = "127.0.0.1:9090"
    """Prometheus `/metrics` and the operators' JSON (`/status`, `/calls/ID`), "host:port"."""
    discovery: DiscoveryConfig
    token_file: str
    """The boxes' `pool.token_file` token (first line), sent as `Authorization: Bearer`."""
    poll_interval_s: float = Field(default=0.1, gt=0)
    stale_after_s: float = Field(default=2.0, gt=0)
    """A box not answering for this long takes no new calls (nor lease returns)."""
    poll_hold_s: float = Field(default=0.5, ge=0)
    """How long a box holds a poll while its snapshot says the same as the one the picker holds
    (answered at once when it changes): an idle box is asked about twice a second, a busy one
    as often as it changes. 0: every `poll_interval_s`. Cut to what keeps an unchanged box heard
    from every half `stale_after_s` (with `poll_interval_s`). On a snapshot stream: how often an
    unchanged box sends its age."""
    poll_stream: bool = True
    """Follow each box's snapshot stream (the held polls' answers pushed as frames of one
    response, at most one a `poll_interval_s`) rather than polling it; a box that does not stream
    (an older daemon) is polled. Off, or `poll_hold_s` 0: every box is polled."""
    failure_mode: FailureMode = FAILURE_MODE
    """What Envoy does when no picker answers; the gateway's config enforces it (its ext_proc
    filter, and its EPP cluster's health check). The picker warns, once, when the Envoy config
    streaming to it names the other one (`FAILURE_MODE_KEY`)."""
    max_branches: int = Field(default=4, ge=1, le=64)
    """Branches of one (session, model) whose text the picker keeps (a box's gateway keeps as
    many: sub-agents and title calls beside the conversation); past it the least recently used
    one's text goes, not its lease (the boxes hold its KV)."""
    conversation_bytes: int = Field(default=CONVERSATION_BYTES, ge=1 << 20)
    """What the picker keeps of sessions' conversations, in each of two stores: the canonical
    text their branches are matched on, and the last large body of each session, which its next
    call's read continues (each store at most this many bytes). The default keeps about 4,000
    sessions of 70 KB conversations; past its bound a return is read whole (its lease is kept:
    the boxes hold its KV, and its lease returns are still placed at their headers): size it to
    the live sessions and their conversations. The objects read from them come besides: 3,000
    sessions of 70 KB conversations took 1 GB of memory, their stores 385 MB (docs/pool.md)."""
    policy: str = "talaria"
    """The box-level policy (`router.box_policies`): talaria (the router: leases, KV locality,
    model residency), round-robin, least-load, llm-d (GIE's default scorer mix), llm-d-session."""
    max_body_bytes: int = Field(default=MAX_BODY_BYTES, ge=1024)
    """Largest request body (default: the box's `limits.max_body_bytes` default); a larger one
    gets 413 in the API's error shape, from its Content-Length before any of it is read."""
    body_timeout_s: float = Field(default=BODY_TIMEOUT_S, gt=0)
    """A request body must be whole this long after its headers (default: the box's
    `limits.body_timeout_s` default), or the call gets 408 in the API's error shape."""
    max_streams: int = Field(default=MAX_STREAMS, ge=1)
    """ext_proc streams (calls through the gateway, for their whole answer) this picker holds at
    once; past it a stream is answered 429 with `retry-after` at its headers, its body unread.
    The rendered Envoy config sizes the picker cluster and the gateway's connections from it
    (`python -m talaria_pool.envoy render --epp-max-streams`)."""
    body_buffer_bytes: int = Field(default=BODY_BUFFER_BYTES, ge=1024)
    """Request-body bytes this picker holds at once, over every stream reading one: a chunk that
    would take it past refuses its call 429 with `retry-after` (the client sends it again), so
    concurrent large bodies cannot grow the picker without bound. At least `max_body_bytes`."""
    box_max_connections: int = Field(default=BOX_MAX_CONNECTIONS, ge=1)
    """A box's `limits.max_connections` when its snapshot does not say (an older box): the
    picker sends a box at most that many calls at once, less `BOX_RESERVED_CONNECTIONS`."""
    drain_s: float = Field(default=10.0, ge=0)
    """On SIGTERM, after announcing NOT_SERVING for `GATEWAY_HEALTH_CHECK.notice_s` (while the
    gateway moves new calls to another picker): how long the streams still open may finish."""
    lease_slack_s: float = Field(default=LEASE_SLACK_S, ge=0)
    """How much longer than τ (`router.tau_s`) a lease lives here. τ is the agent's tool gap,
    from the answer's end at the client to its next call; the picker sees the answer end before
    the client does (the rest of its delivery, the client reading it) and the next call after
    it was sent, so its own gap is longer by both. Measured through Envoy on a loaded 2-core box
    (bench/pool_load.py): up to 0.3 s."""
    router: dict[str, Any] = Field(default_factory=dict)
    """`RouterKnobs` fields (tau_s, gamma, ttft_target_s, overload, ...); staleness_s and
    heartbeat_s default to `stale_after_s`."""

    @field_validator("listen", "metrics")
    @classmethod
    def _address(cls, v: str) -> str:
        split_host_port(v)
        return v

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        BOX_POLICIES.get(v)  # ValueError naming the valid ones
        return v

    @field_validator("router")
    @classmethod
    def _knobs(cls, v: dict[str, Any]) -> dict[str, Any]:
        _router_knobs(v, 2.0)
        return v

    @model_validator(mode="after")
    def _buffer_holds_a_body(self) -> EPPConfig:
        if self.body_buffer_bytes < self.max_body_bytes:
            raise ValueError(
                f"body_buffer_bytes ({self.body_buffer_bytes}) must be at least max_body_bytes "
                f"({self.max_body_bytes}): a largest body must fit"
            )
        return self

    def knobs(self) -> RouterKnobs:
        return picker_knobs(_router_knobs(self.router, self.stale_after_s), self.lease_slack_s)


PICKER_KNOBS = {"session_home": True, "cost_candidates": 64, "replica_gain_decode": True}
"""What the picker's router does unlike a box's (unless `router` says otherwise): a session's
calls stay on the box holding their prefix, a new branch's on the box holding its head, while
that box can take them (`RouterKnobs.session_home`); a cost placement weighs the boxes the call
singles out and the 64 least loaded, not every box (`RouterKnobs.cost_candidates`); a model
opens on another box when the decode contention of its running calls is worth it, not only its
queued prefill (`RouterKnobs.replica_gain_decode`)."""


def picker_knobs(knobs: RouterKnobs, lease_slack_s: float) -> RouterKnobs:
    """`knobs` with leases `lease_slack_s` longer (`EPPConfig.lease_slack_s`)."""
    return dataclasses.replace(knobs, tau_s=knobs.tau_s + lease_slack_s)


def _router_knobs(given: dict[str, Any], stale_after_s: float) -> RouterKnobs:
    """The knobs, a box's staleness bound the picker's (unless `router` sets its own)."""
    try:
        return RouterKnobs(
            **{
                "staleness_s": stale_after_s,
                "heartbeat_s": stale_after_s,
                **PICKER_KNOBS,
                **given,
            }
        )
    except TypeError as err:  # a key RouterKnobs does not have
        raise ValueError(f"unknown knob {str(err).rsplit('argument ', 1)[-1]}") from None


def load_epp_config(path: str | pathlib.Path) -> EPPConfig:
    """The config at `path`; ConfigError with one `FILE: field: problem` line per problem,
    the files it names (token, TLS) read too."""
    data = read_config_data(path)
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: (top level): expected a mapping"])
    try:
        cfg = EPPConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError([f"{path}: {p}: {m}" for p, m in _pydantic_lines(err)]) from None
    problems = _file_lines(cfg, pathlib.Path(path).parent)
    if problems:
        raise ConfigError([f"{path}: {p}: {m}" for p, m in problems])
    return cfg


def _file_lines(cfg: EPPConfig, base: pathlib.Path) -> list[tuple[str, str]]:
    out = []
    if cfg.tls is not None:
        files = [("tls.cert_file", cfg.tls.cert_file), ("tls.key_file", cfg.tls.key_file)]
        if cfg.tls.client_ca_file is not None:
            files.append(("tls.client_ca_file", cfg.tls.client_ca_file))
        for where, name in files:
            try:
                (base / name).read_bytes()
            except OSError as err:
                out.append((where, f"cannot read {base / name}: {err.strerror or err}"))
    try:
        load_token(base / cfg.token_file, "token_file")
    except ValueError as err:
        out.append(("token_file", str(err).removeprefix("token_file: ")))
    return out
