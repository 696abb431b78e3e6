"""Kubernetes discovery: one InferencePool (`inference.networking.k8s.io/v1`) and its pods.

As llm-d's EPP: the pods in the pool's namespace with its `spec.selector.matchLabels` that
are Ready, not being deleted and have a pod IP; each (pod, `spec.targetPorts[i].number`) is
one box named `<pod>-rank-<i>`, `i` the port's index in targetPorts (a name stays put when
`llm-d.ai/active-ports` narrows a pod's ports). Both are listed, then watched; a watch that fails
(410 Gone included) is listed again after a backoff. A deleted pool empties the set. Needs
lightkube (the `k8s` extra) and get/list/watch on pods and pools.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from lightkube import AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from talariad.epp.discovery import BoxEndpoint, Boxes
from talariad.epp.discovery.file import DiscoveryError

log = logging.getLogger("talariad.epp")

POOL_GROUP = "inference.networking.k8s.io"
ACTIVE_PORTS = ("llm-d.ai/active-ports", "inference.networking.k8s.io/active-ports")

InferencePool = create_namespaced_resource(POOL_GROUP, "v1", "InferencePool", "inferencepools")
# Pods as generic dicts, not lightkube's typed Pod: a malformed pod is then one we can log and
# skip, where a typed decode error would end the watch.
Pod = create_namespaced_resource("", "v1", "Pod", "pods")


class _Port(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    number: Annotated[int, Field(ge=1, le=65535, strict=True)]


class _Selector(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    matchLabels: Annotated[dict[str, str], Field(min_length=1, max_length=64)]


class PoolSpec(BaseModel):
    """The fields of an InferencePool's spec that discovery reads."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    selector: _Selector
    targetPorts: Annotated[tuple[_Port, ...], Field(min_length=1, max_length=8)]

    @field_validator("targetPorts")
    @classmethod
    def _unique(cls, ports: tuple[_Port, ...]) -> tuple[_Port, ...]:
        if len({p.number for p in ports}) != len(ports):
            raise ValueError("targetPorts repeat a port")
        return ports

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.selector.matchLabels)

    @property
    def ports(self) -> tuple[int, ...]:
        return tuple(p.number for p in self.targetPorts)


def parse_pool(obj: Mapping[str, Any]) -> PoolSpec:
    """The spec of an InferencePool object (DiscoveryError: one line saying what is wrong)."""
    try:
        return PoolSpec.model_validate(obj.get("spec"))
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(map(str, first["loc"])) or "spec"
        raise DiscoveryError(f"spec.{where}: {first['msg']}") from None


def _ready(status: Mapping[str, Any]) -> bool:
    conditions = status.get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _active_ports(annotations: Mapping[str, str], ports: tuple[int, ...]) -> set[int]:
    for key in ACTIVE_PORTS:
        if key in annotations:
            try:
                return {int(p) for p in str(annotations[key]).split(",") if p.strip()}
            except ValueError:
                raise DiscoveryError(
                    f"annotation {key}={annotations[key]!r} is not a port list"
                ) from None
    return set(ports)


def pod_boxes(pod: Mapping[str, Any], spec: PoolSpec) -> list[BoxEndpoint]:
    """The boxes one pod serves under `spec`: none unless it is Ready, not being deleted, has
    an IP and carries the selector's labels (DiscoveryError: the pod object is malformed)."""
    try:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        name, labels = meta["name"], meta.get("labels") or {}
        if meta.get("deletionTimestamp") or not status.get("podIP") or not _ready(status):
            return []
        if any(labels.get(k) != v for k, v in spec.labels.items()):
            return []
        active = _active_ports(meta.get("annotations") or {}, spec.ports)
        ip = status["podIP"]
    except (KeyError, TypeError, AttributeError) as err:
        raise DiscoveryError(f"malformed pod object ({type(err).__name__}: {err})") from None
    return [
        BoxEndpoint(f"{name}-rank-{i}", ip, port)
        for i, port in enumerate(spec.ports)
        if port in active
    ]


@dataclass
class _View:
    """What the source knows of the pool and its pods; `boxes()` is None until it knows both."""

    spec: PoolSpec | None = None
    absent: bool = False  # the pool was found missing or deleted
    pods: dict[str, Mapping[str, Any]] | None = None  # None until the first pod list
    served: dict[str, list[BoxEndpoint]] = field(default_factory=dict)  # by pod

    def set_spec(self, spec: PoolSpec | None) -> None:
        self.spec, self.absent = spec, spec is None
        self.served = {name: self._serve(name, pod) for name, pod in (self.pods or {}).items()}

    def set_pods(self, pods: dict[str, Mapping[str, Any]] | None) -> None:
        self.pods = pods
        self.served = {name: self._serve(name, pod) for name, pod in (pods or {}).items()}

    def apply(self, kind: str, pod: Mapping[str, Any]) -> None:
        name = (pod.get("metadata") or {}).get("name")
        if self.pods is None or not isinstance(name, str):
            log.warning("pod watch: %s event for an object with no metadata.name; ignored", kind)
            return
        if kind == "DELETED":
            self.pods.pop(name, None)
            self.served.pop(name, None)
        else:
            self.pods[name] = pod
            self.served[name] = self._serve(name, pod)

    def _serve(self, name: str, pod: Mapping[str, Any]) -> list[BoxEndpoint]:
        if self.spec is None:
            return []
        try:
            return pod_boxes(pod, self.spec)
        except DiscoveryError as err:
            log.warning("pod %s: %s; it serves no box", name, err)
            return []

    def boxes(self) -> Boxes | None:
        if self.absent:
            return {}
        if self.spec is None or self.pods is None:
            return None
        return {box.name: box for served in self.served.values() for box in served}


def _describe(err: BaseException) -> str:
    """One line for a failed list or watch."""
    status = getattr(err, "status", None)
    code = getattr(status, "code", None)
    if code is not None:
        return f"API error {code} {getattr(status, 'reason', '') or ''}: {getattr(status, 'message', '')}"
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


class KubeSource:
    """Boxes from one InferencePool `pool` in `namespace` and its Ready pods.

    `client`: a lightkube AsyncClient (default: one configured from the environment, in-cluster
    first, closed when iteration stops). `backoff`: first and longest wait before listing again."""

    def __init__(
        self,
        pool: str,
        namespace: str,
        client: AsyncClient | None = None,
        backoff: tuple[float, float] = (0.5, 30.0),
    ) -> None:
        self.pool, self.namespace = pool, namespace
        self._client = client
        self.backoff = backoff

    async def changes(self) -> AsyncIterator[Boxes]:
        client = self._client or AsyncClient(namespace=self.namespace)
        events: asyncio.Queue[tuple] = asyncio.Queue()
        tasks = {"pool": asyncio.create_task(self._watch_pool(client, events))}
        view, last, generation = _View(), None, 0
        try:
            while True:
                match await events.get():
                    case ("pool", spec):
                        if spec is None or view.spec is None or spec.labels != view.spec.labels:
                            # Another selector selects other pods: list them afresh.
                            generation += 1
                            self._stop(tasks.pop("pods", None))
                            view.set_pods(None)
                            if spec is not None:
                                watch = self._watch_pods(client, spec.labels, generation, events)
                                tasks["pods"] = asyncio.create_task(watch)
                        view.set_spec(spec)
                    case ("pods", gen, pods) if gen == generation:
                        view.set_pods(pods)
                    case ("pod", gen, kind, pod) if gen == generation:
                        view.apply(kind, pod)
                    case _:
                        continue  # from the pod watch of a selector since replaced
                boxes = view.boxes()
                if boxes is not None and boxes != last:
                    last = boxes
                    yield boxes
        finally:
            for task in tasks.values():
                self._stop(task)
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            if self._client is None:
                await client.close()

    @staticmethod
    def _stop(task: asyncio.Task | None) -> None:
        if task is not None:
            task.cancel()

    async def _list_watch(
        self, client: AsyncClient, res: type, where: str, on_list, on_event, **select
    ) -> None:
        """List `res` (`on_list(items)`), then watch it from the list's version
        (`on_event(kind, obj)`); after a failure, wait (doubling, up to the longest) and list again."""
        delay = self.backoff[0]
        while True:
            try:
                listing = client.list(res, namespace=self.namespace, **select)
                on_list([obj async for obj in listing])
                delay = self.backoff[0]
                version = listing.resourceVersion
                async for kind, obj in client.watch(
                    res, namespace=self.namespace, resource_version=version, **select
                ):
                    on_event(kind, obj)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # whatever broke, the pool must outlive it
                log.warning(
                    "%s: list/watch failed (%s); listing again in %gs", where, _describe(err), delay
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.backoff[1])

    async def _watch_pool(self, client: AsyncClient, events: asyncio.Queue) -> None:
        where = f"InferencePool {self.namespace}/{self.pool}"
        missing = False  # logged as missing, so a pool that stays missing is said once

        def listed(items: list) -> None:
            nonlocal missing
            if not items and not missing:
                log.warning("%s not found; the pool has no boxes until it exists", where)
            missing = not items
            self._pool_event(where, items[0] if items else None, events)

        def changed(kind: str, obj: Mapping[str, Any]) -> None:
            if kind == "DELETED":
                log.warning("%s was deleted; the pool has no boxes", where)
            self._pool_event(where, None if kind == "DELETED" else obj, events)

        fields = {"metadata.name": self.pool}
        await self._list_watch(client, InferencePool, where, listed, changed, fields=fields)

    @staticmethod
    def _pool_event(where: str, obj: Mapping[str, Any] | None, events: asyncio.Queue) -> None:
        if obj is None:
            events.put_nowait(("pool", None))
            return
        try:
            events.put_nowait(("pool", parse_pool(obj)))
        except DiscoveryError as err:
            log.warning("%s: %s; keeping the last good spec", where, err)

    async def _watch_pods(
        self, client: AsyncClient, labels: dict[str, str], generation: int, events: asyncio.Queue
    ) -> None:
        def listed(items: list) -> None:
            named = (((pod.get("metadata") or {}).get("name"), pod) for pod in items)
            pods = {name: pod for name, pod in named if isinstance(name, str)}
            events.put_nowait(("pods", generation, pods))

        def changed(kind: str, pod: Mapping[str, Any]) -> None:
            events.put_nowait(("pod", generation, kind, pod))

        where = f"pods of InferencePool {self.namespace}/{self.pool}"
        await self._list_watch(client, Pod, where, listed, changed, labels=labels)
