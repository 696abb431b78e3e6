"""A loopback fake of the Kubernetes API for discovery tests: pods and InferencePools in memory,
`GET` of one object, list and `watch=true` streams (JSON lines) with equality label selectors and
`metadata.name` field selectors, resource versions, and watch drops a test triggers."""

from __future__ import annotations

import asyncio
import copy
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

POOL_API = "inference.networking.k8s.io/v1"
KINDS = {"pods": ("v1", "Pod"), "inferencepools": (POOL_API, "InferencePool")}


def _selector(text: str | None) -> dict[str, str]:
    """`k=v,k2=v2` as a dict (the only selector form discovery sends)."""
    pairs = [p.split("=", 1) for p in (text or "").split(",") if p]
    return {k.rstrip("="): v for k, v in pairs}


@dataclass
class _Watch:
    plural: str
    namespace: str
    labels: dict[str, str]
    fields: dict[str, str]
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)

    def matches(self, obj: dict | None) -> bool:
        if obj is None:
            return False
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        return (
            meta["namespace"] == self.namespace
            and all(labels.get(k) == v for k, v in self.labels.items())
            and all(meta.get(k.removeprefix("metadata.")) == v for k, v in self.fields.items())
        )

    def event(self, old: dict | None, new: dict | None) -> dict | None:
        """The event this watch sees for a change old → new, as a selector-filtered watch does."""
        was, now = self.matches(old), self.matches(new)
        if now:
            return {"type": "MODIFIED" if was else "ADDED", "object": new}
        if was:
            return {"type": "DELETED", "object": old}
        return None


class FakeKube:
    """The fake server; `url` once started. Counts `lists` and `watches` by plural."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict] = {}  # (plural, namespace, name)
        self.rv = 1
        self.compacted = 0  # a watch from a resourceVersion below this gets 410 Gone
        self.history: list[tuple[int, dict | None, dict | None]] = []
        self.watches: list[_Watch] = []
        self.lists = {"pods": 0, "inferencepools": 0}
        self.url = ""
        self._runner: web.AppRunner | None = None

    # -- what a test does -----------------------------------------------------------------
    def put_pool(self, namespace: str, name: str, labels: dict, ports: list[int]) -> None:
        spec = {
            "selector": {"matchLabels": labels},
            "targetPorts": [{"number": p} for p in ports],
            "endpointPickerRef": {"name": "talaria-epp", "port": {"number": 9002}},
        }
        self.put("inferencepools", namespace, {"metadata": {"name": name}, "spec": spec})

    def put_pod(
        self,
        namespace: str,
        name: str,
        labels: dict,
        ip: str | None = "10.0.0.1",
        ready: bool = True,
        deleting: bool = False,
        annotations: dict | None = None,
    ) -> None:
        meta: dict[str, Any] = {"name": name, "labels": labels, "annotations": annotations or {}}
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        status: dict[str, Any] = {"phase": "Running" if ready else "Pending"}
        status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
        if ip:
            status["podIP"] = ip
        self.put("pods", namespace, {"metadata": meta, "status": status})

    def put(self, plural: str, namespace: str, obj: dict) -> None:
        """Create or replace an object (any shape under `metadata.name`)."""
        api, kind = KINDS[plural]
        obj = {"apiVersion": api, "kind": kind, **copy.deepcopy(obj)}
        self.rv += 1
        obj["metadata"].update(namespace=namespace, resourceVersion=str(self.rv))
        key = (plural, namespace, obj["metadata"]["name"])
        self._change(self.objects.get(key), obj)
        self.objects[key] = obj

    def delete(self, plural: str, namespace: str, name: str) -> None:
        old = self.objects.pop((plural, namespace, name))
        self.rv += 1
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = str(self.rv)
        self._change(gone, None)

    def drop_watches(self, expire: bool = True) -> None:
        """End every open watch stream; with `expire`, every version seen so far is compacted,
        so a client that resumes its watch gets 410 Gone and must list again."""
        if expire:
            self.rv += 1
            self.compacted = self.rv
        for watch in self.watches:
            watch.queue.put_nowait(None)

    def kubeconfig(self, namespace: str = "default") -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake", "namespace": namespace},
                }
            ],
            "current-context": "fake",
        }

    # -- the server -----------------------------------------------------------------------
    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/{plural}", self._collection)
        app.router.add_get(
            "/apis/inference.networking.k8s.io/v1/namespaces/{ns}/{plural}", self._collection
        )
        app.router.add_get("/api/v1/namespaces/{ns}/{plural}/{name}", self._one)
        app.router.add_get(
            "/apis/inference.networking.k8s.io/v1/namespaces/{ns}/{plural}/{name}", self._one
        )
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        self.drop_watches(expire=False)
        if self._runner is not None:
            await self._runner.cleanup()

    def _change(self, old: dict | None, new: dict | None) -> None:
        self.history.append((self.rv, old, new))
        for watch in self.watches:
            event = watch.event(old, new)
            if event is not None:
                watch.queue.put_nowait(event)

    @staticmethod
    def _status(code: int, reason: str, message: str) -> dict:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": code,
            "reason": reason,
            "message": message,
        }

    async def _one(self, request: web.Request) -> web.Response:
        ns, plural, name = (
            request.match_info["ns"],
            request.match_info["plural"],
            request.match_info["name"],
        )
        obj = self.objects.get((plural, ns, name))
        if obj is None:
            return web.json_response(
                self._status(404, "NotFound", f'{plural} "{name}" not found'), status=404
            )
        return web.json_response(obj)

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        ns, plural = request.match_info["ns"], request.match_info["plural"]
        if plural not in KINDS:
            return web.json_response(self._status(404, "NotFound", plural), status=404)
        q = request.query
        watch = _Watch(
            plural, ns, _selector(q.get("labelSelector")), _selector(q.get("fieldSelector"))
        )
        if q.get("watch") == "true":
            return await self._watch(request, watch, q.get("resourceVersion"))
        self.lists[plural] += 1
        items = [
            o for (p, _, _), o in sorted(self.objects.items()) if p == plural and watch.matches(o)
        ]
        api, kind = KINDS[plural]
        return web.json_response(
            {
                "apiVersion": api,
                "kind": f"{kind}List",
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }
        )

    async def _watch(
        self, request: web.Request, watch: _Watch, since: str | None
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        if since is not None and int(since) < self.compacted:
            gone = self._status(
                410, "Expired", f"too old resource version: {since} ({self.compacted})"
            )
            await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
            return response
        past = list(self.history)  # taken with the watch registered, so no change is sent twice
        self.watches.append(watch)
        try:
            for rv, old, new in past:
                event = watch.event(old, new) if since is not None and rv > int(since) else None
                if event is not None:
                    await response.write(json.dumps(event).encode() + b"\n")
            while (event := await watch.queue.get()) is not None:
                await response.write(json.dumps(event).encode() + b"\n")
        finally:
            self.watches.remove(watch)
        return response
