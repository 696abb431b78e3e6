"""Static discovery: a YAML list of boxes in llm-d's file-discovery shape, reloaded on change.

    - {name: box-a, address: 10.0.0.5, port: 8000}
    - {name: box-b, namespace: pool, address: box-b.lan, port: 8000, labels: {rack: r2}}

(or the same list under a top-level `endpoints:` key). The file is read every `interval` seconds
and parsed again when its bytes change. An edit that does not parse or validate keeps the last
good set and logs one line; an explicit `[]` empties the pool, an empty file does not.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from talariad.epp.discovery import BoxEndpoint, Boxes

log = logging.getLogger("talariad.epp")

_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)"
    r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)


class DiscoveryError(ValueError):
    """A discovery file that cannot be used; the message is one line for the log."""


class FileEndpoint(BaseModel):
    """One entry of the file (llm-d's `{name, namespace, address, port, labels}`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1)]
    namespace: str | None = None
    address: str
    port: Annotated[int, Field(ge=1, le=65535, strict=True)]
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("address")
    @classmethod
    def _ip_or_hostname(cls, value: str) -> str:
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            pass
        if _HOSTNAME.match(value) and not value.replace(".", "").isdigit():
            return value
        raise ValueError(f"{value!r} is neither an IPv4/IPv6 address nor a hostname")


_ENTRIES = TypeAdapter(list[FileEndpoint])


def _one_line(err: ValidationError, entries: list) -> str:
    """The first validation error as `entry N (name): field: message`."""
    first = err.errors()[0]
    index, *field = first["loc"]
    entry = entries[index] if isinstance(index, int) and index < len(entries) else None
    name = entry.get("name") if isinstance(entry, dict) else None
    where = f"entry {index}" + (f" ({name})" if name else "")
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{where}: {'.'.join(map(str, field)) or 'entry'}: {first['msg']}{more}"


def parse_boxes(text: str | bytes) -> Boxes:
    """The boxes a discovery file names (DiscoveryError: a one-line reason it cannot be used)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise DiscoveryError(f"not YAML: {' '.join(str(err).split())}") from None
    if isinstance(doc, dict) and set(doc) == {"endpoints"}:
        doc = doc["endpoints"]
    if doc is None:
        raise DiscoveryError("the file is empty (write [] for a pool with no boxes)")
    if not isinstance(doc, list):
        raise DiscoveryError(f"expected a list of endpoints, got a {type(doc).__name__}")
    try:
        entries = _ENTRIES.validate_python(doc)
    except ValidationError as err:
        raise DiscoveryError(_one_line(err, doc)) from None
    boxes: Boxes = {}
    for e in entries:
        if e.name in boxes:
            raise DiscoveryError(f"the name {e.name!r} appears twice")
        boxes[e.name] = BoxEndpoint(e.name, e.address, e.port)
    return boxes


class FileSource:
    """Boxes from a discovery file, read again every `interval` seconds."""

    def __init__(self, path: str | Path, interval: float = 1.0) -> None:
        self.path = Path(path)
        self.interval = interval
        self._digest: bytes | None = None  # of the bytes last parsed, good or bad
        self._good: Boxes | None = None

    def poll(self) -> Boxes | None:
        """The new set if the file changed to a good one since the last poll, else None."""
        try:
            data = self.path.read_bytes()
        except OSError as err:
            return self._reject(b"", f"cannot read it ({err.strerror or err})")
        digest = hashlib.sha256(data).digest()
        if digest == self._digest:
            return None
        try:
            boxes = parse_boxes(data)
        except DiscoveryError as err:
            return self._reject(digest, str(err))
        self._digest = digest
        if boxes == self._good:
            return None
        self._good = boxes
        return boxes

    def _reject(self, digest: bytes, reason: str) -> None:
        # The digest of what was rejected is kept, so one bad edit logs one line, not one a poll.
        if digest != self._digest:
            kept = (
                "no boxes yet" if self._good is None else f"keeping the last good {len(self._good)}"
            )
            log.warning("discovery file %s: %s; %s", self.path, reason, kept)
        self._digest = digest

    async def changes(self) -> AsyncIterator[Boxes]:
        while True:
            boxes = self.poll()
            if boxes is not None:
                yield boxes
            await asyncio.sleep(self.interval)
