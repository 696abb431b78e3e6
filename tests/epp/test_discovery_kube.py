"""Kubernetes discovery through lightkube against a loopback fake API server: one InferencePool,
its Ready non-terminating pods with an IP, one box per (pod, targetPort), list then watch, and a
list again when a watch is lost."""

from __future__ import annotations

import asyncio
import logging

import pytest

pytest.importorskip("lightkube", reason="Kubernetes discovery needs the k8s extra (lightkube)")

from lightkube import AsyncClient, KubeConfig  # noqa: E402

from talariad.epp.discovery import BoxEndpoint  # noqa: E402
from talariad.epp.discovery.file import DiscoveryError  # noqa: E402
from talariad.epp.discovery.kube import KubeSource, parse_pool, pod_boxes  # noqa: E402
from tests.support.fake_kube import FakeKube  # noqa: E402

NS, POOL = "serving", "talaria"
APP = {"app": "talariad"}
WAIT = 10.0  # s: a set must arrive well within this on a loaded machine


@pytest.fixture
async def kube():
    fake = FakeKube()
    await fake.start()
    client = AsyncClient(KubeConfig.from_dict(fake.kubeconfig(NS)), trust_env=False)
    yield fake, client
    await client.close()
    await fake.stop()


async def _eventually(condition) -> None:
    for _ in range(int(WAIT / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


class Sets:
    """The sets a source yields, read one at a time with a timeout."""

    def __init__(self, client: AsyncClient) -> None:
        self.changes = KubeSource(POOL, NS, client, backoff=(0.02, 0.1)).changes()

    async def next(self) -> dict[str, str]:
        boxes = await asyncio.wait_for(anext(self.changes), WAIT)
        return {name: box.endpoint for name, box in boxes.items()}

    async def until(self, want: dict[str, str]) -> None:
        """Read sets until one equals `want` (a change may come as several steps)."""
        while (got := await self.next()) != want:
            pass
        assert got == want


def test_a_pod_serves_a_box_per_target_port_only_when_ready_alive_and_addressed():
    spec = parse_pool(
        {
            "spec": {
                "selector": {"matchLabels": APP},
                "targetPorts": [{"number": 8000}, {"number": 8001}],
            }
        }
    )
    meta = {"name": "p", "labels": APP}
    ready = {"podIP": "10.1.0.4", "conditions": [{"type": "Ready", "status": "True"}]}
    assert pod_boxes({"metadata": meta, "status": ready}, spec) == [
        BoxEndpoint("p-rank-0", "10.1.0.4", 8000),
        BoxEndpoint("p-rank-1", "10.1.0.4", 8001),
    ]
    unready = {**ready, "conditions": [{"type": "Ready", "status": "False"}]}
    dying = {**meta, "deletionTimestamp": "2026-01-01T00:00:00Z"}
    assert pod_boxes({"metadata": meta, "status": unready}, spec) == []
    assert pod_boxes({"metadata": dying, "status": ready}, spec) == []
    assert pod_boxes({"metadata": meta, "status": {**ready, "podIP": None}}, spec) == []
    assert pod_boxes({"metadata": {**meta, "labels": {"app": "x"}}, "status": ready}, spec) == []
    narrowed = {**meta, "annotations": {"llm-d.ai/active-ports": "8001"}}
    assert pod_boxes({"metadata": narrowed, "status": ready}, spec) == [
        BoxEndpoint("p-rank-1", "10.1.0.4", 8001)
    ]
    with pytest.raises(DiscoveryError, match="malformed pod"):
        pod_boxes({"metadata": meta, "status": {**ready, "conditions": "Ready"}}, spec)
    with pytest.raises(DiscoveryError, match="active-ports"):
        pod_boxes(
            {
                "metadata": {**meta, "annotations": {"llm-d.ai/active-ports": "http"}},
                "status": ready,
            },
            spec,
        )


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"selector": {"matchLabels": APP}, "targetPorts": []}, "targetPorts"),
        (
            {"selector": {"matchLabels": APP}, "targetPorts": [{"number": 80}, {"number": 80}]},
            "repeat",
        ),
        (
            {"selector": {"matchLabels": APP}, "targetPorts": [{"number": 0}]},
            "targetPorts.0.number",
        ),
        ({"selector": {"matchLabels": {}}, "targetPorts": [{"number": 80}]}, "matchLabels"),
        ({"targetPortNumber": 80, "selector": APP}, "spec."),  # the v1alpha2 names
        (None, "spec"),
    ],
)
def test_a_malformed_pool_is_one_line_saying_why(spec, says):
    with pytest.raises(DiscoveryError, match=says) as err:
        parse_pool({"spec": spec})
    assert "\n" not in str(err.value)


async def test_pods_join_when_ready_and_leave_when_deleted_terminating_or_unready(kube):
    fake, client = kube
    fake.put_pool(NS, POOL, APP, [8000])
    fake.put_pod(NS, "a", APP, ip="10.1.0.1")
    fake.put_pod(NS, "b", APP, ip="10.1.0.2", ready=False)
    fake.put_pod(NS, "c", APP, ip=None, ready=False)  # scheduled, no IP yet
    sets = Sets(client)
    assert await sets.next() == {"a-rank-0": "10.1.0.1:8000"}

    fake.put_pod(NS, "b", APP, ip="10.1.0.2")
    assert await sets.next() == {"a-rank-0": "10.1.0.1:8000", "b-rank-0": "10.1.0.2:8000"}
    fake.put_pod(NS, "c", APP, ip="10.1.0.3")
    assert len(await sets.next()) == 3

    fake.delete("pods", NS, "a")
    assert set(await sets.next()) == {"b-rank-0", "c-rank-0"}
    fake.put_pod(NS, "b", APP, ip="10.1.0.2", deleting=True)
    assert set(await sets.next()) == {"c-rank-0"}
    fake.put_pod(NS, "c", APP, ip="10.1.0.3", ready=False)
    assert await sets.next() == {}
    await sets.changes.aclose()


async def test_target_ports_multiply_endpoints_and_follow_pool_edits(kube):
    fake, client = kube
    fake.put_pool(NS, POOL, APP, [8000, 8001])
    fake.put_pod(NS, "a", APP, ip="10.1.0.1")
    fake.put_pod(NS, "b", APP, ip="fd00::2", annotations={"llm-d.ai/active-ports": "8001"})
    sets = Sets(client)
    assert await sets.next() == {
        "a-rank-0": "10.1.0.1:8000",
        "a-rank-1": "10.1.0.1:8001",
        "b-rank-1": "[fd00::2]:8001",
    }
    fake.put_pool(NS, POOL, APP, [8000, 8001, 8002])
    assert set(await sets.next()) == {"a-rank-0", "a-rank-1", "a-rank-2", "b-rank-1"}
    await sets.changes.aclose()


async def test_the_selector_filters_and_a_new_selector_lists_again(kube, caplog):
    fake, client = kube
    fake.put_pool(NS, POOL, APP, [8000])
    fake.put_pod(NS, "a", APP, ip="10.1.0.1")
    fake.put_pod(NS, "other", {"app": "vllm"}, ip="10.1.0.9")
    fake.put_pod("elsewhere", "a2", APP, ip="10.1.0.8")  # same labels, other namespace
    bad = {
        "metadata": {"name": "bad", "labels": APP},
        "status": {"podIP": "10.1.0.7", "conditions": "Ready"},
    }
    fake.put("pods", NS, bad)
    sets = Sets(client)
    assert await sets.next() == {"a-rank-0": "10.1.0.1:8000"}
    assert any("pod bad: malformed pod object" in r.getMessage() for r in caplog.records)

    fake.put_pool(NS, POOL, {"app": "vllm"}, [8000])
    await sets.until({"other-rank-0": "10.1.0.9:8000"})
    assert fake.lists["pods"] == 2
    await sets.changes.aclose()


async def test_a_malformed_pool_edit_keeps_the_last_good_spec_and_a_deleted_pool_empties(
    kube, caplog
):
    fake, client = kube
    fake.put_pool(NS, POOL, APP, [8000])
    fake.put_pod(NS, "a", APP, ip="10.1.0.1")
    sets = Sets(client)
    assert await sets.next() == {"a-rank-0": "10.1.0.1:8000"}

    fake.put(
        "inferencepools",
        NS,
        {"metadata": {"name": POOL}, "spec": {"selector": APP, "targetPortNumber": 8000}},
    )
    fake.put_pod(NS, "b", APP, ip="10.1.0.2")  # the watch goes on under the last good spec
    assert set(await sets.next()) == {"a-rank-0", "b-rank-0"}
    assert any("keeping the last good spec" in r.getMessage() for r in caplog.records)

    fake.delete("inferencepools", NS, POOL)
    assert await sets.next() == {}
    fake.put_pool(NS, POOL, APP, [8000])
    assert set(await sets.next()) == {"a-rank-0", "b-rank-0"}
    await sets.changes.aclose()


async def test_a_missing_pool_is_an_empty_set_said_once(kube, caplog):
    fake, client = kube
    fake.put_pod(NS, "a", APP, ip="10.1.0.1")
    sets = Sets(client)
    assert await sets.next() == {}
    fake.put_pool(NS, POOL, APP, [8000])
    assert await sets.next() == {"a-rank-0": "10.1.0.1:8000"}
    assert sum("not found" in r.getMessage() for r in caplog.records) == 1
    await sets.changes.aclose()


async def test_a_lost_watch_lists_again_and_sees_what_it_missed(kube, caplog):
    fake, client = kube
    fake.put_pool(NS, POOL, APP, [8000])
    fake.put_pod(NS, "a", APP, ip="10.1.0.1")
    fake.put_pod(NS, "b", APP, ip="10.1.0.2")
    sets = Sets(client)
    assert len(await sets.next()) == 2

    # Every stream ends and its history is compacted: resuming gets 410 Gone, so both watches
    # must list again; a change made meanwhile is then seen.
    fake.history.clear()
    fake.drop_watches(expire=True)
    fake.delete("pods", NS, "a")
    assert await sets.next() == {"b-rank-0": "10.1.0.2:8000"}
    assert fake.lists["pods"] == 2
    await _eventually(lambda: fake.lists["inferencepools"] == 2)  # its own watch, its own pace
    lost = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        m.startswith("pods of InferencePool serving/talaria: list/watch failed (API error 410")
        for m in lost
    )
    assert any(
        m.startswith("InferencePool serving/talaria: list/watch failed (API error 410")
        for m in lost
    )

    fake.put_pod(NS, "c", APP, ip="10.1.0.3")  # and the new watch carries on
    assert set(await sets.next()) == {"b-rank-0", "c-rank-0"}
    await sets.changes.aclose()


async def test_a_watch_that_ends_cleanly_resumes_without_listing(kube):
    fake, client = kube
    fake.put_pool(NS, POOL, APP, [8000])
    fake.put_pod(NS, "a", APP, ip="10.1.0.1")
    sets = Sets(client)
    assert len(await sets.next()) == 1
    fake.drop_watches(expire=False)
    fake.put_pod(NS, "b", APP, ip="10.1.0.2")
    assert len(await sets.next()) == 2
    assert fake.lists["pods"] == 1
    await sets.changes.aclose()
