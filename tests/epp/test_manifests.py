"""deploy/kubernetes/ against the v1 field names and against itself: every object's apiVersion and
kind, the InferencePool's v1 fields, the route to the pool, RBAC for what discovery reads, and the
names, labels and ports that must agree across objects."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from talaria_pool.envoy import DOWNSTREAM_STREAMS
from talariad.config import TalariaConfig, parse_config
from talariad.epp.config import EPPConfig, box_call_capacity
from talariad.epp.discovery.kube import POOL_GROUP

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
KNOWN = {
    ("v1", "Namespace"),
    ("v1", "ServiceAccount"),
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "DaemonSet"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    (f"{POOL_GROUP}/v1", "InferencePool"),
    ("gateway.networking.k8s.io/v1", "Gateway"),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("gateway.envoyproxy.io/v1alpha1", "BackendTrafficPolicy"),
    ("gateway.envoyproxy.io/v1alpha1", "ClientTrafficPolicy"),
}


def _docs() -> list[dict]:
    docs = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


DOCS = _docs()


def one(kind: str, name: str | None = None) -> dict:
    [found] = [d for d in DOCS if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return found


def _container(workload: dict) -> dict:
    [container] = workload["spec"]["template"]["spec"]["containers"]
    return container


def _talariad_config() -> dict:
    data = yaml.safe_load(one("ConfigMap", "talariad-config")["data"]["talaria.yaml"])
    if "pool" not in TalariaConfig.model_fields:  # the daemon's `pool:` lands with the box picker
        assert set(data.pop("pool")) == {"token_file"}
    return data


def _epp_config() -> dict:
    return yaml.safe_load(one("ConfigMap", "talaria-epp-config")["data"]["pool.yaml"])


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_object_is_a_known_api_kind_in_the_namespace(doc):
    assert (doc["apiVersion"], doc["kind"]) in KNOWN
    assert doc["kind"] == "Namespace" or doc["metadata"]["namespace"] == "talaria"


def test_kustomization_lists_every_file():
    listed = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(
        p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml"
    )


def test_the_pool_uses_the_v1_field_names():
    spec = one("InferencePool")["spec"]
    assert set(spec) <= {"selector", "targetPorts", "appProtocol", "endpointPickerRef"}
    assert 1 <= len(spec["selector"]["matchLabels"]) <= 64
    numbers = [p["number"] for p in spec["targetPorts"]]
    assert 1 <= len(numbers) <= 8 and len(set(numbers)) == len(numbers)
    ref = spec["endpointPickerRef"]
    assert set(ref) <= {"group", "kind", "name", "port", "failureMode"}
    assert ref.get("kind", "Service") == "Service" and isinstance(ref["port"]["number"], int)
    assert ref["failureMode"] in ("FailOpen", "FailClose")


def test_the_route_sends_calls_to_the_pool_through_the_gateway():
    route, pool = one("HTTPRoute"), one("InferencePool")
    [parent] = route["spec"]["parentRefs"]
    assert parent["name"] == one("Gateway")["metadata"]["name"]
    matches = [m for rule in route["spec"]["rules"] for m in rule["matches"]]
    assert matches == [{"path": {"type": "PathPrefix", "value": "/v1"}}]  # the API only
    refs = [ref for rule in route["spec"]["rules"] for ref in rule["backendRefs"]]
    assert refs == [
        {"group": POOL_GROUP, "kind": "InferencePool", "name": pool["metadata"]["name"]}
    ]


def test_the_picker_ref_names_the_epp_service_and_its_grpc_port():
    ref = one("InferencePool")["spec"]["endpointPickerRef"]
    service = one("Service", ref["name"])
    [grpc] = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    assert grpc["appProtocol"] == "kubernetes.io/h2c"
    ports = {
        p["name"]: p["containerPort"] for p in _container(one("Deployment", "talaria-epp"))["ports"]
    }
    assert ports[grpc["targetPort"]] == grpc["port"]
    epp_pods = one("Deployment", "talaria-epp")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= epp_pods.items()


def test_the_epp_is_configured_for_the_pool_the_inferencepool_defines():
    pool = one("InferencePool")
    config = _epp_config()
    try:
        from talariad.epp.config import EPPConfig
    except ImportError:  # the EPP's config model lands on its own branch: check the keys read here
        assert {"listen", "metrics", "discovery", "token_file"} <= set(config)
    else:
        EPPConfig.model_validate(config)
    kube = config["discovery"]["kubernetes"]
    assert kube == {"pool": pool["metadata"]["name"], "namespace": pool["metadata"]["namespace"]}
    failure = pool["spec"]["endpointPickerRef"]["failureMode"]
    assert config["failure_mode"] == {"FailOpen": "fail_open", "FailClose": "fail_closed"}[failure]
    deployment = one("Deployment", "talaria-epp")
    epp = _container(deployment)
    mounts = {m["name"]: m["mountPath"] for m in epp["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "talaria-epp-config"
    assert epp["command"] == ["talariad"]
    assert epp["args"] == ["epp", "--config", f"{mounts['config']}/pool.yaml"]
    ports = {p["name"]: p["containerPort"] for p in epp["ports"]}
    assert config["listen"] == f"0.0.0.0:{ports['grpc']}"
    assert config["metrics"] == f"0.0.0.0:{ports['metrics']}"
    assert epp["readinessProbe"]["grpc"]["port"] == ports["grpc"]


def test_the_role_grants_what_kubernetes_discovery_reads():
    role, binding = one("Role"), one("RoleBinding")
    grants = {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert grants[("", "pods")] >= {"get", "list", "watch"}
    assert grants[(POOL_GROUP, "inferencepools")] >= {"get", "list", "watch"}
    assert all(not verbs - {"get", "list", "watch"} for verbs in grants.values())  # read only
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "talaria-epp",
    }
    account = one("Deployment", "talaria-epp")["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": "talaria"}
    ]
    assert one("ServiceAccount")["metadata"]["name"] == account


def test_the_pool_selects_the_talariad_pods_on_their_http_port():
    selector = one("InferencePool")["spec"]["selector"]["matchLabels"]
    daemonset = one("DaemonSet")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"].items()
    assert selector.items() <= pod_labels
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= pod_labels
    assert (
        not selector.items() <= one("Deployment")["spec"]["template"]["metadata"]["labels"].items()
    )
    talariad = _container(daemonset)
    ports = {p["name"]: p["containerPort"] for p in talariad["ports"]}
    assert [p["number"] for p in one("InferencePool")["spec"]["targetPorts"]] == [ports["http"]]
    box = parse_config(_talariad_config(), "talariad-config")
    assert box.listen.http_port == ports["http"] and box.listen.http_host == "0.0.0.0"
    assert talariad["readinessProbe"]["httpGet"]["path"] == "/ready"


def test_a_box_per_gpu_node_and_one_box_token_for_both_sides():
    spec = one("DaemonSet")["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert _container(one("DaemonSet"))["resources"]["limits"]["nvidia.com/gpu"] >= 1

    def token_file(workload: dict) -> str:
        spec = workload["spec"]["template"]["spec"]
        [volume] = [v for v in spec["volumes"] if "secret" in v]
        assert volume["secret"] == {"secretName": "talaria-box-token"}
        [mount] = [m for m in _container(workload)["volumeMounts"] if m["name"] == volume["name"]]
        return f"{mount['mountPath']}/token"

    box = yaml.safe_load(one("ConfigMap", "talariad-config")["data"]["talaria.yaml"])
    assert token_file(one("DaemonSet")) == box["pool"]["token_file"]
    assert token_file(one("Deployment")) == _epp_config()["token_file"]


def _policy_for(workload: dict) -> dict:
    """The one NetworkPolicy whose pod selector picks `workload`'s pods."""
    labels = workload["spec"]["template"]["metadata"]["labels"].items()
    [policy] = [
        d
        for d in DOCS
        if d["kind"] == "NetworkPolicy"
        and d["spec"]["podSelector"]["matchLabels"].items() <= labels
    ]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    return policy


def _who_reaches(workload: dict) -> dict[str, list[dict]]:
    """Port name → the peers its policy lets in, each port one the container names."""
    names = {p["name"] for p in _container(workload)["ports"]}
    out: dict[str, list[dict]] = {}
    for rule in _policy_for(workload)["spec"]["ingress"]:
        assert rule["from"], "a rule without peers lets everyone in"
        for port in rule["ports"]:
            assert port["port"] in names and port["protocol"] == "TCP"
            out.setdefault(port["port"], []).extend(rule["from"])
    return out


def _is_gateway(peer: dict) -> bool:
    labels = peer.get("podSelector", {}).get("matchLabels", {})
    gateway = one("Gateway")["metadata"]
    return "namespaceSelector" in peer and labels == {
        "gateway.envoyproxy.io/owning-gateway-name": gateway["name"],
        "gateway.envoyproxy.io/owning-gateway-namespace": gateway["namespace"],
    }


def _is_epp(peer: dict) -> bool:
    labels = one("Deployment", "talaria-epp")["spec"]["template"]["metadata"]["labels"]
    selector = peer.get("podSelector", {}).get("matchLabels")
    return (
        "namespaceSelector" not in peer
        and selector is not None
        and selector.items() <= labels.items()
    )


def test_only_the_gateway_reaches_the_pickers_grpc_and_scrapers_its_metrics():
    epp = one("Deployment", "talaria-epp")
    reaches = _who_reaches(epp)
    assert set(reaches) == {"grpc", "metrics"}
    assert len(reaches["grpc"]) == 1 and _is_gateway(reaches["grpc"][0])
    [scrapers] = reaches["metrics"]
    assert set(scrapers) == {"namespaceSelector"} and scrapers["namespaceSelector"]["matchLabels"]
    ports = {p["name"]: p["containerPort"] for p in _container(epp)["ports"]}
    assert ports["grpc"] != ports["metrics"]  # metrics on a port of their own


def test_only_the_gateway_and_the_picker_reach_the_boxes_and_scrapers_their_metrics():
    daemonset = one("DaemonSet")
    reaches = _who_reaches(daemonset)
    assert set(reaches) == {"http", "metrics"}
    peers = reaches["http"]
    assert len(peers) == 2 and sum(map(_is_gateway, peers)) == 1 and sum(map(_is_epp, peers)) == 1
    [scrapers] = reaches["metrics"]
    assert set(scrapers) == {"namespaceSelector"} and scrapers["namespaceSelector"]["matchLabels"]
    # the box serves /metrics on the container's metrics port, apart from the API's
    box = parse_config(_talariad_config(), "talariad-config")
    ports = {p["name"]: p["containerPort"] for p in _container(daemonset)["ports"]}
    assert box.listen.metrics == f"0.0.0.0:{ports['metrics']}"
    assert ports["metrics"] != ports["http"] == box.listen.http_port


def test_the_gateways_limits_come_from_the_pool():
    """The boxes' circuit breakers: boxes x a box's calls (its connection limit less those kept
    for polls and checks); the gateway's connections: the pickers' replicas x their streams."""
    boxes_policy = one("BackendTrafficPolicy", "talaria-boxes")
    boxes = int(boxes_policy["metadata"]["annotations"]["talaria.io/boxes"])
    limits = TalariaConfig.model_validate(_talariad_config()).limits
    expected = boxes * box_call_capacity(limits.max_connections)
    breaker = boxes_policy["spec"]["circuitBreaker"]
    assert breaker == {
        "maxConnections": expected,
        "maxPendingRequests": expected,
        "maxParallelRequests": expected,
        "maxParallelRetries": expected,
    }
    assert boxes_policy["spec"]["targetRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "talaria"}
    ]
    client = one("ClientTrafficPolicy")["spec"]
    assert client["targetRefs"][0]["name"] == one("Gateway")["metadata"]["name"]
    epp = EPPConfig.model_validate(_epp_config())
    replicas = one("Deployment", "talaria-epp")["spec"]["replicas"]
    assert client["connection"]["connectionLimit"]["value"] == replicas * epp.max_streams
    assert client["http2"]["maxConcurrentStreams"] == DOWNSTREAM_STREAMS
