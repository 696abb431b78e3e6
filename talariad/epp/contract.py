"""What the ext_proc server asks of a picker, and what a picker answers: the seam between the
protocol (`epp.server`) and placement (`epp.boxpicker`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class EPPRequest:
    """One HTTP request as Envoy hands it over: its id (`x-request-id`), method, path, headers
    (names lower-cased, values decoded from `raw_value`) and whole body (b"" for a GET)."""

    call_id: str
    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes = b""
    arrived: float | None = None
    """When its headers reached the picker (the picker's clock): a lease is judged then."""

    def at_headers(self, arrived: float | None = None) -> EPPRequest:
        """What the check at request headers is handed of this request: its headers, with the
        body's length as declared (`content-length`), and no body."""
        heads = {**self.headers, "content-length": str(len(self.body))}
        return EPPRequest(self.call_id, self.method, self.path, heads, arrived=arrived)


@dataclass(frozen=True, slots=True)
class Pick:
    """Route the call to `endpoint` ("ip:port" of one box's gateway), or to `fallback` if it
    never reached `endpoint` (refused, reset before any answer)."""

    call_id: str
    endpoint: str
    kind: str = field(default="", compare=False)
    """How it was placed: the router's decision kind (`lease_hit`, `cost`, ...), or
    `round_robin` for a request that names no model a box serves."""
    fallback: str | None = field(default=None, compare=False)
    """Another healthy box for the call (the next-best placement); None: no other box."""

    @property
    def destination(self) -> str:
        """GIE's destination value: the endpoints in order, comma-separated."""
        return self.endpoint if self.fallback is None else f"{self.endpoint},{self.fallback}"


@dataclass(frozen=True, slots=True)
class ImmediateAnswer:
    """Answer the client at once (an ext_proc ImmediateResponse): `body` is the API's error
    shape (JSON bytes), `headers` extra response headers such as `retry-after`."""

    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    code: str = field(default="", compare=False)
    """The error's `code` (else its `type`): what the refusal metrics count it by."""


class Picker(Protocol):
    def pick(self, request: EPPRequest, now: float) -> Pick | ImmediateAnswer:
        """Place one call (sync and bounded: it runs on the server's event loop)."""
        ...

    def served(
        self,
        call_id: str,
        endpoint: str | None,
        status: int,
        now: float,
        box_call_id: str | None = None,
    ) -> None:
        """Envoy's response headers for a picked call: the endpoint that really served it
        (None: not reported), the HTTP status and the box's own id for the call (None: none)."""
        ...

    def finished(self, call_id: str, ok: bool, now: float) -> None:
        """The call's response ended (`ok`: its end of stream was seen, or it had none to see
        because the response body is not sent to the EPP) or was cut before it did."""
        ...

    def lease_return(self, request: EPPRequest, now: float) -> Pick | None:
        """Place a call from its request headers alone (`request.body` is empty), where that is
        unambiguous (a return to its session's lease); None: the call is decided on its body."""
        ...

    def logged(self, call_id: str, endpoint: str | None, status: int, ok: bool, now: float) -> None:
        """Envoy's access-log entry for a call `lease_return` placed: the endpoint that served it,
        its status, and whether its response ended well (`served` and `finished` in one)."""
        ...
