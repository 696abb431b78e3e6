"""The shipped gateway config (deploy/envoy/gateway.yaml): every rendered variant keeps the fixes
the prototype proved, and the real Envoy accepts each (`envoy --mode validate`)."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest
import yaml

from talaria_pool import envoy
from talariad.calls.session import HEADERS as SESSION_HEADERS
from talariad.epp.config import (
    FAILURE_MODE,
    FAILURE_MODE_KEY,
    GATEWAY_HEALTH_CHECK,
    EPPConfig,
    box_call_capacity,
)
from talariad.epp.replies import AT_HEADERS, DESTINATION, LEASE
from talariad.epp.stream import MAX_BODY_BYTES
from tests.support import certs
from tests.support.pool import needs_envoy

BOXES = ("127.0.0.1:8001", "127.0.0.1:8002", "10.0.0.3:8000")
VARIANTS = list(
    itertools.product(("fail_open", "fail_closed"), sorted(envoy.BODY_MODES), (True, False))
)


def spec(
    failure_mode: str = "fail_closed", response_body: str = "full-duplex", at_headers: bool = True
) -> envoy.GatewaySpec:
    return envoy.GatewaySpec(
        "0.0.0.0:8080",
        "127.0.0.1:9002",
        BOXES,
        9901,
        failure_mode,
        response_body,
        "/dev/null",
        lease_at_headers=at_headers,
    )


def parts(text: str) -> tuple[dict, dict, dict]:
    """(http_connection_manager config, ext_proc filter config, clusters by name)."""
    cfg = yaml.safe_load(text)["static_resources"]
    hcm = cfg["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    filters = {f["name"]: f["typed_config"] for f in hcm["http_filters"]}
    return hcm, filters, {c["name"]: c for c in cfg["clusters"]}


@pytest.mark.parametrize("failure_mode,response_body,at_headers", VARIANTS)
def test_every_variant_keeps_the_fixes(failure_mode, response_body, at_headers):
    hcm, filters, clusters = parts(envoy.render(spec(failure_mode, response_body, at_headers)))
    ext = filters["envoy.filters.http.ext_proc"]
    assert ext["failure_mode_allow"] is (failure_mode == "fail_open")
    metadata = [{"key": FAILURE_MODE_KEY, "value": failure_mode}]
    assert ext["grpc_service"]["initial_metadata"] == metadata  # what the picker checks
    mode = ext["processing_mode"]
    assert mode["request_body_mode"] == "FULL_DUPLEX_STREAMED"
    assert mode["response_body_mode"] == envoy.BODY_MODES[response_body][0]
    # routing keys on the EPP's metadata only; the client's header is stripped before anything
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    if at_headers:  # the lease returns' route first (`test_lease_returns_at_headers`)
        assert routes.pop(0)["match"]["dynamic_metadata"][0]["path"] == [{"key": LEASE}]
    assert routes[0]["match"]["dynamic_metadata"][0]["filter"] == "envoy.lb"
    assert routes[0]["route"]["cluster"] == "pool_picked" and "headers" not in routes[0]["match"]
    assert routes[1]["route"]["cluster"] == "pool_fallback"
    # only the API is public: the rest is Envoy's own 404, the EPP not asked
    assert [r["match"]["prefix"] for r in routes] == ["/v1/", "/v1/", "/"]
    assert routes[2]["direct_response"]["status"] == 404 and "route" not in routes[2]
    assert routes[2]["typed_per_filter_config"]["envoy.filters.http.ext_proc"]["disabled"]
    assert hcm["normalize_path"] and hcm["merge_slashes"]
    assert list(filters)[0] == "envoy.filters.http.header_mutation"
    # the EPP's ordered list from its metadata only, and a call that never reached its box
    # retried on the next one, its body kept for the retry up to the EPP's limit
    lb = clusters["pool_picked"]["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    sources = lb["typed_config"]["override_host_sources"]
    assert sources[0] == {"metadata": {"key": "envoy.lb", "path": [{"key": DESTINATION}]}}
    at = [{"metadata": {"key": AT_HEADERS, "path": [{"key": DESTINATION}]}}] if at_headers else []
    assert sources[1:] == at
    picked_boxes = clusters["pool_picked"]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert len(picked_boxes) == len(BOXES)
    assert "connect-failure" in routes[0]["route"]["retry_policy"]["retry_on"]
    assert routes[0]["request_body_buffer_limit"] == MAX_BODY_BYTES
    # a call no box took: Envoy's 503 in the API's error shape
    mapper = hcm["local_reply_config"]["mappers"][0]
    assert "UF" in mapper["filter"]["response_flag_filter"]["flags"]
    body = json.loads(mapper["body_format_override"]["text_format_source"]["inline_string"])
    assert body == envoy.UNREACHABLE.body()
    # served-endpoint stamping, moved into envoy.lb before ext_proc sees the response
    rule = filters["envoy.filters.http.header_to_metadata"]["response_rules"][0]
    assert rule["on_header_present"]["metadata_namespace"] == "envoy.lb" and rule["remove"]
    # fail-open for POSTs needs the EPP's health check with panic routing off
    epp = clusters["epp"]
    assert epp["common_lb_config"]["healthy_panic_threshold"]["value"] == 0
    assert epp["health_checks"][0]["grpc_health_check"]["service_name"].endswith(
        "ExternalProcessor"
    )
    fallback = clusters["pool_fallback"]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert len(fallback) == len(BOXES)
    # failing open never panic-routes to a box its health check found dead
    assert clusters["pool_fallback"]["common_lb_config"]["healthy_panic_threshold"]["value"] == 0


def test_lease_returns_at_headers():
    """The check at request headers before the full-duplex filter, always failing open and sent
    only the headers the picker reads; its route turns the full-duplex filter off and keeps the
    pick's fallback and retries; every picker hears of the ends of those calls (and only those)
    on a cluster of its own, over the pickers' TLS."""
    tls = envoy.EPPTLS("/etc/envoy/epp-ca.crt")
    two = envoy.GatewaySpec(
        **{**spec().__dict__, "epp": ("127.0.0.1:9002", "10.0.0.9:9003"), "epp_tls": tls}
    )
    hcm, filters, clusters = parts(envoy.render(two))
    names = list(filters)
    assert names.index(envoy.LEASE_FILTER) + 1 == names.index("envoy.filters.http.ext_proc")
    lease = filters[envoy.LEASE_FILTER]
    assert lease["@type"].endswith("ext_authz.v3.ExtAuthz")
    assert lease["failure_mode_allow"] is True  # no body is handed over: a failure costs nothing
    assert lease["clear_route_cache"] is True and "with_request_body" not in lease
    assert lease["grpc_service"]["envoy_grpc"]["cluster_name"] == "epp"
    allowed = {p["exact"] for p in lease["allowed_headers"]["patterns"]}
    assert allowed == {*SESSION_HEADERS, "content-length", "x-request-id"}
    route, picked, _, not_found = hcm["route_config"]["virtual_hosts"][0]["routes"]
    assert route["match"]["prefix"] == "/v1/"
    assert route["match"]["dynamic_metadata"][0]["filter"] == AT_HEADERS
    assert route["typed_per_filter_config"]["envoy.filters.http.ext_proc"]["disabled"]
    assert route["route"] == picked["route"]  # the pick's list, its retries on the fallback
    assert route["request_body_buffer_limit"] == picked["request_body_buffer_limit"]
    off = not_found["typed_per_filter_config"]
    assert off["envoy.filters.http.ext_proc"]["disabled"] and off[envoy.LEASE_FILTER]["disabled"]
    grpc_logs = [a for a in hcm["access_log"] if a["name"] == "envoy.access_loggers.http_grpc"]
    assert len(grpc_logs) == 2
    epp_hosts = clusters["epp"]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    for i, log in enumerate(grpc_logs):
        only = log["filter"]["metadata_filter"]
        assert only["matcher"]["filter"] == AT_HEADERS
        assert only["matcher"]["path"] == [{"key": LEASE}]
        assert only["match_if_key_not_found"] is False  # else it logs every call
        common = log["typed_config"]["common_config"]
        assert common["buffer_size_bytes"] == 0  # one message a call, at its end
        cluster = clusters[common["grpc_service"]["envoy_grpc"]["cluster_name"]]
        assert cluster["load_assignment"]["endpoints"][0]["lb_endpoints"] == epp_hosts[i : i + 1]
        assert cluster["transport_socket"] == clusters["epp"]["transport_socket"]
    _, filters, clusters = parts(envoy.render(spec(at_headers=False)))
    assert envoy.LEASE_FILTER not in filters and not any(n.startswith("epp_log") for n in clusters)


def test_the_picker_and_the_rendered_config_have_one_default_failure_mode(capsys):
    assert FAILURE_MODE == "fail_open"
    assert EPPConfig.model_fields["failure_mode"].default == FAILURE_MODE
    assert envoy.main(["render", "--epp", "127.0.0.1:9002", "--box", "127.0.0.1:1"]) == 0
    _, filters, _ = parts(capsys.readouterr().out)
    ext = filters["envoy.filters.http.ext_proc"]
    assert ext["failure_mode_allow"] is True
    assert ext["grpc_service"]["initial_metadata"][0]["value"] == FAILURE_MODE


def test_the_pickers_health_check_is_the_one_their_drain_waits_for():
    """A draining picker announces for `notice_s`: the rendered check must notice within it."""
    _, _, clusters = parts(envoy.render(spec()))
    [check] = clusters["epp"]["health_checks"]
    seconds = lambda text: float(text.removesuffix("s"))  # noqa: E731
    interval, threshold = seconds(check["interval"]), check["unhealthy_threshold"]
    assert interval == seconds(check["no_traffic_interval"]) == GATEWAY_HEALTH_CHECK.interval_s
    assert threshold == GATEWAY_HEALTH_CHECK.unhealthy_threshold
    assert seconds(check["timeout"]) == GATEWAY_HEALTH_CHECK.timeout_s < interval
    assert GATEWAY_HEALTH_CHECK.notice_s == interval * threshold + interval


def test_several_pickers_share_the_epp_cluster(capsys):
    two = envoy.GatewaySpec(**{**spec().__dict__, "epp": ("127.0.0.1:9002", "10.0.0.9:9003")})
    _, _, clusters = parts(envoy.render(two))
    hosts = clusters["epp"]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert [h["endpoint"]["address"]["socket_address"] for h in hosts] == [
        {"address": "127.0.0.1", "port_value": 9002},
        {"address": "10.0.0.9", "port_value": 9003},
    ]
    # a replica that died: ejected at its first refused connection, one of two at most, and a
    # stream it never answered opened again on another replica (not the same one)
    outlier = clusters["epp"]["outlier_detection"]
    assert outlier["split_external_local_origin_errors"] is True
    assert outlier["consecutive_local_origin_failure"] == 1
    assert outlier["enforcing_consecutive_local_origin_failure"] == 100
    assert outlier["max_ejection_percent"] == 50
    _, filters, _ = parts(envoy.render(two))
    retry = filters["envoy.filters.http.ext_proc"]["grpc_service"]["retry_policy"]
    assert set(retry["retry_on"].split(",")) == {"connect-failure", "refused-stream", "reset"}
    assert retry["num_retries"] == 1
    assert retry["retry_host_predicate"][0]["name"] == "envoy.retry_host_predicates.previous_hosts"
    # Envoy's default (3 retries at once on the cluster) overflowed at a kill
    [limits] = clusters["epp"]["circuit_breakers"]["thresholds"]
    assert limits["max_retries"] >= 1024
    argv = ["render", "--epp", "127.0.0.1:9002", "--epp", "10.0.0.9:9003", "--box", "127.0.0.1:1"]
    assert envoy.main(argv) == 0
    _, _, clusters = parts(capsys.readouterr().out)
    assert len(clusters["epp"]["load_assignment"]["endpoints"][0]["lb_endpoints"]) == 2


def test_tls_to_the_pickers_checks_their_names_and_presents_the_gateways_certificate():
    tls = envoy.EPPTLS("/etc/envoy/epp-ca.crt", "/etc/envoy/gw.crt", "/etc/envoy/gw.key")
    two = envoy.GatewaySpec(
        **{**spec().__dict__, "epp": ("127.0.0.1:9002", "epp.internal:9002"), "epp_tls": tls}
    )
    _, _, clusters = parts(envoy.render(two))
    socket = clusters["epp"]["transport_socket"]["typed_config"]["common_tls_context"]
    assert socket["alpn_protocols"] == ["h2"]
    assert socket["validation_context"]["trusted_ca"] == {"filename": tls.ca_file}
    assert socket["validation_context"]["match_typed_subject_alt_names"] == [
        {"san_type": "IP_ADDRESS", "matcher": {"exact": "127.0.0.1"}},
        {"san_type": "DNS", "matcher": {"exact": "epp.internal"}},
    ]
    [pair] = socket["tls_certificates"]
    assert pair == {
        "certificate_chain": {"filename": tls.cert_file},
        "private_key": {"filename": tls.key_file},
    }
    _, _, plain = parts(envoy.render(spec()))
    assert "transport_socket" not in plain["epp"]


@needs_envoy
@pytest.mark.proc
def test_envoy_accepts_tls_to_the_pickers(tmp_path):
    authority = certs.ca(tmp_path)
    client = certs.leaf(tmp_path, "gateway", authority, usage="clientAuth")
    tls = envoy.EPPTLS(str(authority.cert), str(client.cert), str(client.key))
    path = tmp_path / "gateway.yaml"
    path.write_text(envoy.render(envoy.GatewaySpec(**{**spec().__dict__, "epp_tls": tls})))
    ok, text = envoy.validate(path)
    assert ok, text


@needs_envoy
@pytest.mark.proc
@pytest.mark.parametrize("failure_mode,response_body,at_headers", VARIANTS)
def test_envoy_accepts_every_variant(tmp_path, failure_mode, response_body, at_headers):
    path = tmp_path / "gateway.yaml"
    path.write_text(envoy.render(spec(failure_mode, response_body, at_headers)))
    ok, text = envoy.validate(path)
    assert ok, text
    assert f"configuration '{path}' OK" in text


@pytest.mark.parametrize(
    "change,message",
    [
        ({"failure_mode": "sometimes"}, "fail_open or fail_closed"),
        ({"response_body": "buffered"}, "one of"),
        ({"epp": "localhost"}, "not host:port"),
        ({"epp": ("127.0.0.1:9002", "nowhere")}, "not host:port"),
        ({"epp": ()}, "no EPP"),
        ({"epp_tls": envoy.EPPTLS("ca.crt", cert_file="gw.crt")}, "both a cert and a key"),
        ({"boxes": ()}, "no boxes"),
    ],
)
def test_mistakes_are_one_line(change, message):
    bad = envoy.GatewaySpec(**{**spec().__dict__, **change})
    with pytest.raises(envoy.EnvoyError, match=message):
        envoy.render(bad)


def test_render_command_says_what_is_wrong(capsys):
    rc = envoy.main(["render", "--epp", "nowhere", "--box", "127.0.0.1:1"])
    assert rc == 2
    assert capsys.readouterr().err.strip() == "talaria_pool.envoy: 'nowhere' is not host:port"


def test_render_command_wants_the_pickers_ca_for_a_client_certificate(capsys):
    argv = ["render", "--epp", "127.0.0.1:9002", "--box", "127.0.0.1:1", "--epp-cert", "gw.crt"]
    assert envoy.main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "talaria_pool.envoy: --epp-cert and --epp-key need --epp-ca (TLS to the pickers)"
    )


def test_capacity_comes_from_the_pool_and_no_envoy_default_applies():
    two_pickers = dataclasses.replace(
        spec(), epp=("127.0.0.1:9002", "127.0.0.1:9003"), box_max_connections=100
    )
    text = envoy.render(dataclasses.replace(two_pickers, epp_max_streams=300))
    hcm, _filters, clusters = parts(text)
    per_box = box_call_capacity(100)
    for name in ("pool_picked", "pool_fallback"):
        breakers = clusters[name]["circuit_breakers"]
        assert breakers["thresholds"] == [
            {
                "priority": "DEFAULT",
                "max_connections": per_box * len(BOXES),
                "max_pending_requests": per_box * len(BOXES),
                "max_requests": per_box * len(BOXES),
                "max_retries": per_box * len(BOXES),
            }
        ]
        assert breakers["per_host_thresholds"] == [
            {"priority": "DEFAULT", "max_connections": per_box}
        ]
    # the gateway admits as many connections as the two pickers take streams, and the pickers'
    # cluster takes a stream for every call those connections can carry: its breaker is never
    # the one that refuses a call (fail-open would route it unpicked)
    runtime = yaml.safe_load(text)["layered_runtime"]["layers"][0]["static_layer"]
    assert runtime["envoy.resource_limits.listener.gateway.connection_limit"] == 600
    [monitor] = yaml.safe_load(text)["overload_manager"]["resource_monitors"]
    everything = monitor["typed_config"]["max_active_downstream_connections"]
    assert everything == 600 + envoy.ADMIN_CONNECTIONS  # no listener of Envoy unbounded
    streams = hcm["http2_protocol_options"]["max_concurrent_streams"]
    [epp_limits] = clusters["epp"]["circuit_breakers"]["thresholds"]
    assert set(epp_limits) == {
        "priority",
        "max_connections",
        "max_pending_requests",
        "max_requests",
        "max_retries",
    }
    assert min(v for k, v in epp_limits.items() if k != "priority") == 600 * streams
    http2 = clusters["epp"]["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ]["explicit_http_config"]["http2_protocol_options"]
    assert http2["max_concurrent_streams"] == 300
    # every cluster has every limit set: none of Envoy's 1,024 defaults (3 retries) is left
    for cluster in clusters.values():
        [limits] = cluster["circuit_breakers"]["thresholds"]
        assert all(k in limits for k in ("max_connections", "max_pending_requests"))
        assert all(k in limits for k in ("max_requests", "max_retries"))
    # an overflow of the boxes' breakers is a 429 in the API's shape, with retry-after
    mappers = hcm["local_reply_config"]["mappers"]
    [full] = [m for m in mappers if m["filter"]["response_flag_filter"]["flags"] == ["UO"]]
    assert (
        full["status_code"] == 429 and full["headers_to_add"][0]["header"]["key"] == "retry-after"
    )
    body = json.loads(full["body_format_override"]["text_format_source"]["inline_string"])
    assert body["error"]["code"] == "pool_full"


def test_the_render_command_takes_the_pools_limits(capsys):
    argv = ["render", "--epp", "127.0.0.1:9002", "--box", "127.0.0.1:8001"]
    assert envoy.main([*argv, "--box-max-connections", "40", "--epp-max-streams", "7"]) == 0
    _hcm, _f, clusters = parts(capsys.readouterr().out)
    assert clusters["pool_picked"]["circuit_breakers"]["per_host_thresholds"][0] == {
        "priority": "DEFAULT",
        "max_connections": 32,
    }
    assert envoy.main([*argv, "--epp-max-streams", "0"]) == 2
    assert "max_streams must be >= 1" in capsys.readouterr().err
