"""The shipped gateway config (deploy/envoy/gateway.yaml): every rendered variant keeps the fixes
the prototype proved, and the real Envoy accepts each (`envoy --mode validate`)."""

from __future__ import annotations

import itertools

import pytest
import yaml

from talaria_pool import envoy
from tests.support.pool import needs_envoy

BOXES = ("127.0.0.1:8001", "127.0.0.1:8002", "10.0.0.3:8000")
VARIANTS = list(itertools.product(("fail_open", "fail_closed"), sorted(envoy.BODY_MODES)))


def spec(
    failure_mode: str = "fail_closed", response_body: str = "full-duplex"
) -> envoy.GatewaySpec:
    return envoy.GatewaySpec(
        "0.0.0.0:8080", "127.0.0.1:9002", BOXES, 9901, failure_mode, response_body, "/dev/null"
    )


def parts(text: str) -> tuple[dict, dict, dict]:
    """(http_connection_manager config, ext_proc filter config, clusters by name)."""
    cfg = yaml.safe_load(text)["static_resources"]
    hcm = cfg["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    filters = {f["name"]: f["typed_config"] for f in hcm["http_filters"]}
    return hcm, filters, {c["name"]: c for c in cfg["clusters"]}


@pytest.mark.parametrize("failure_mode,response_body", VARIANTS)
def test_every_variant_keeps_the_fixes(failure_mode, response_body):
    hcm, filters, clusters = parts(envoy.render(spec(failure_mode, response_body)))
    ext = filters["envoy.filters.http.ext_proc"]
    assert ext["failure_mode_allow"] is (failure_mode == "fail_open")
    mode = ext["processing_mode"]
    assert mode["request_body_mode"] == "FULL_DUPLEX_STREAMED"
    assert mode["response_body_mode"] == envoy.BODY_MODES[response_body][0]
    # routing keys on the EPP's metadata only; the client's header is stripped before anything
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    assert routes[0]["match"]["dynamic_metadata"][0]["filter"] == "envoy.lb"
    assert routes[0]["route"]["cluster"] == "pool_picked" and "headers" not in routes[0]["match"]
    assert routes[1]["route"]["cluster"] == "pool_fallback"
    assert list(filters)[0] == "envoy.filters.http.header_mutation"
    picked = clusters["pool_picked"]["original_dst_lb_config"]
    assert "metadata_key" in picked and "use_http_header" not in picked
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


@needs_envoy
@pytest.mark.proc
@pytest.mark.parametrize("failure_mode,response_body", VARIANTS)
def test_envoy_accepts_every_variant(tmp_path, failure_mode, response_body):
    path = tmp_path / "gateway.yaml"
    path.write_text(envoy.render(spec(failure_mode, response_body)))
    ok, text = envoy.validate(path)
    assert ok, text
    assert f"configuration '{path}' OK" in text


@pytest.mark.parametrize(
    "change,message",
    [
        ({"failure_mode": "sometimes"}, "fail_open or fail_closed"),
        ({"response_body": "buffered"}, "one of"),
        ({"epp": "localhost"}, "not host:port"),
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
