"""Where the pool's boxes are: a source yields the full set of boxes each time it changes.

A source has one method, `changes()`, an async iterator of `dict[name, BoxEndpoint]`: the first good
set, then one per change (never two equal sets in a row). One consumer iterates it
(`async for boxes in source.changes(): ...`) until it stops (`aclose()`). Bad input is logged,
one line, and the last good set stays. Sources: `file.FileSource` (llm-d's file-discovery
YAML, reloaded on change) and `kube.KubeSource` (one InferencePool and its Ready pods; needs
the `k8s` extra).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class BoxEndpoint:
    """One box's gateway: `address` an IP or hostname, `port` its HTTP port."""

    name: str
    address: str
    port: int

    @property
    def endpoint(self) -> str:
        """ "ip:port" as Envoy takes it (an IPv6 address in brackets)."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"


Boxes = dict[str, BoxEndpoint]
"""A full set of boxes by name."""


class BoxSource(Protocol):
    def changes(self) -> AsyncIterator[Boxes]:
        """The set at start, then the whole set again each time it changes."""
        ...


def endpoints(boxes: Boxes) -> dict[str, str]:
    """The set as `{name: "ip:port"}`."""
    return {name: box.endpoint for name, box in boxes.items()}
