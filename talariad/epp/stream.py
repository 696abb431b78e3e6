"""One ext_proc stream, that is one HTTP request through Envoy, as a state machine (no I/O):
each message Envoy sends goes in, the replies to send come out, in order.

The order Envoy 1.40 sends (full duplex, both bodies streamed): request headers (the body modes
on this first message only); request body chunks, the last an empty one with the end of
stream; response headers (with the served endpoint); response body chunks, again ending with an
empty end-of-stream chunk. A GET has its end of stream on the request headers.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from itertools import chain

from talariad.calls.errors import APIError
from talariad.calls.spec import CALL_ID_HEADER
from talariad.config import LimitsConfig, split_host_port
from talariad.epp import ext_proc_pb2 as pb
from talariad.epp import replies
from talariad.epp.contract import EPPRequest, ImmediateAnswer, Pick, Picker
from talariad.epp.metrics import EPPMetrics

log = logging.getLogger("talariad.epp")

MAX_BODY_BYTES = LimitsConfig.model_fields["max_body_bytes"].default
"""The box's own default limit: a body the picker takes, a box with default limits takes too."""
BODY_TIMEOUT_S = LimitsConfig.model_fields["body_timeout_s"].default
"""The box's own default: a request body must be whole this long after its headers."""

Replies = Iterable[pb.ProcessingResponse]


class BodyBudget:
    """Request-body bytes held at once over every stream of a picker (`EPPConfig.
    body_buffer_bytes`): concurrent large bodies cannot grow the picker without bound."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit, self.held = limit, 0

    def take(self, n: int) -> bool:
        """Hold `n` more bytes; False (nothing held) when that would pass the limit."""
        if self.limit is not None and self.held + n > self.limit:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n


class Stream:
    def __init__(
        self,
        picker: Picker,
        clock: Callable[[], float],
        metrics: EPPMetrics,
        max_body_bytes: int = MAX_BODY_BYTES,
        budget: BodyBudget | None = None,
        over_streams: int | None = None,
    ) -> None:
        """`budget`: the body bytes shared with the picker's other streams; `over_streams`: the
        picker's stream limit when this stream is past it (it is refused at its headers)."""
        self.picker, self.clock, self.metrics, self.max_body = (
            picker,
            clock,
            metrics,
            max_body_bytes,
        )
        self.budget = budget or BodyBudget()
        self.held = 0  # of `budget`, by this stream's body
        self.over_streams = over_streams
        self.over_budget = False
        self.size_known = False  # the body's size is known (Content-Length, or its end)
        self.call_id, self.method, self.path = "", "", ""
        self.arrived: float | None = None  # the request headers' arrival, on `clock`
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.body_bytes = 0  # all received, also past the bound (then `body` stops growing)
        self.routed = False
        self.pick: Pick | None = None
        self.response_body_sent = True  # False when the filter's response body mode is NONE
        self.response_started = False
        self.response_body_seen = False
        self.settled = False

    def handle(self, request: pb.ProcessingRequest) -> Replies:
        """The replies to one message from Envoy (often none yet: the request headers are
        answered at the body's end)."""
        if request.HasField("protocol_config"):
            mode = request.protocol_config.response_body_mode
            self.response_body_sent = mode != pb.ProcessingMode.NONE
        kind = request.WhichOneof("request")
        if kind is None:
            return []
        return _HANDLERS[kind](self, getattr(request, kind), request)

    @property
    def body_due(self) -> bool:
        """The request headers are in and the call is not yet decided: its body is on its way
        (the server times it, `body_timed_out`)."""
        return self.arrived is not None and not self.routed

    def body_timed_out(self, timeout_s: float) -> Replies:
        """The body was not whole `timeout_s` after the headers: 408 in the API's error shape,
        as the box answers a body it waited for as long."""
        self.routed, self.body = True, bytearray()
        self._release()
        message = f"the request body did not arrive within {timeout_s:g} s"
        self.metrics.decided("body_timeout", 0.0)
        refusal = error(self.path, 408, message, "request_timeout")
        self.metrics.refused(refusal)
        return [replies.refuse(refusal, "epp_body_timeout")]

    def ended(self, clean: bool) -> None:
        """The gRPC stream is over (`clean`: Envoy half-closed it, else it was cancelled). A
        response not seen to its end fails the call, unless Envoy ended the stream cleanly at
        the response headers because it sends the EPP no response body."""
        self._release()
        self._settle(clean and self.response_started and not self.response_body_seen)

    def _release(self) -> None:
        self.budget.give(self.held)
        self.held = 0

    # ---- request ---------------------------------------------------------------------------

    def _request_headers(self, msg: pb.HttpHeaders, req) -> Replies:
        self.arrived = arrival(self.clock(), replies.received_at(req))
        self.headers = replies.headers_of(msg.headers)
        self.call_id = self.headers.get("x-request-id") or uuid.uuid4().hex
        self.method, self.path = self.headers.get(":method", ""), self.headers.get(":path", "")
        declared = self.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body:
            self.body_bytes = int(declared)  # refused before any of it is read
            self.size_known = True
            return self._route(body_follows=False)
        if self.over_streams is not None:  # refused before any of it is read
            return self._route(body_follows=False)
        return self._route(body_follows=False) if msg.end_of_stream else []

    def _request_body(self, msg: pb.HttpBody, _req) -> Replies:
        if self.routed:  # refused already (its size, its time): nothing of it is kept
            return []
        self.body_bytes += len(msg.body)
        if self.body_bytes > self.max_body:  # 413 now: the rest need not be read
            self._drop_body()
            return self._route(body_follows=False)
        if not self.budget.take(len(msg.body)):  # the picker holds enough bodies now: 429
            self.over_budget = True
            self._drop_body()
            return self._route(body_follows=False)
        self.held += len(msg.body)
        self.body += msg.body
        return self._route(body_follows=True) if msg.end_of_stream else []

    def _drop_body(self) -> None:
        self.body = bytearray()
        self._release()

    def _request_trailers(self, _msg, _req) -> Replies:
        # With trailers the body carries no end of stream: the trailers end the request.
        routing = () if self.routed else self._route(body_follows=True, body_ends=False)
        return chain(routing, [replies.continue_trailers(response=False)])

    def _route(self, body_follows: bool, body_ends: bool = True) -> Replies:
        """Decide, then answer: the headers reply first, the body after it (Envoy holds the
        request until both are back); or the refusal, in place of both. The body pieces are
        built as they are sent, after the routing reply has gone."""
        self.routed = True
        started = time.perf_counter()
        body, self.body = bytes(self.body), bytearray()
        outcome, decision = self._decide(body)
        if isinstance(decision, ImmediateAnswer):
            self.metrics.refused(decision)
            first = replies.refuse(decision, details=f"epp_{outcome}")
        else:
            self.pick = decision
            first = replies.route_to(decision.destination)
            if decision.kind:
                self.metrics.kinds.labels(decision.kind).inc()
        lag = None if self.arrived is None else self.clock() - self.arrived
        self.metrics.decided(outcome, time.perf_counter() - started, lag)
        if not body_follows or self.pick is None:
            self._release()
            return [first]
        return chain([first], self._handed_back(body, body_ends))

    def _handed_back(self, body: bytes, body_ends: bool) -> Replies:
        """The body's pieces; it is the picker's (`budget`) until the last has gone to Envoy."""
        try:
            yield from replies.request_body_pieces(body, body_ends)
        finally:
            self._release()

    def _decide(self, body: bytes) -> tuple[str, Pick | ImmediateAnswer]:
        if self.body_bytes > self.max_body:
            size = f"is {self.body_bytes}" if self.size_known else f"passed {self.max_body}"
            message = f"request body {size} bytes; the limit is {self.max_body} bytes"
            return "too_large", error(self.path, 413, message, "request_too_large")
        if self.over_streams is not None:
            message = f"the pool's picker holds {self.over_streams} calls now, its limit"
            return "overloaded", busy(self.path, message, "epp_stream_limit")
        if self.over_budget:
            message = (
                f"the pool's picker holds {self.budget.held} bytes of request bodies now "
                f"(its limit: {self.budget.limit})"
            )
            return "overloaded", busy(self.path, message, "epp_body_buffer_full")
        request = EPPRequest(
            self.call_id, self.method, self.path, self.headers, body, arrived=self.arrived
        )
        try:
            decision = self.picker.pick(request, self.clock())
            if isinstance(decision, Pick):
                for endpoint in (decision.endpoint, decision.fallback):
                    check_endpoint(endpoint)
        except Exception:
            log.exception("call %s: the picker failed; answering 503", self.call_id)
            return "error", error(self.path, 503, "no endpoint could be picked", "epp_error")
        return ("picked" if isinstance(decision, Pick) else "refused"), decision

    # ---- response --------------------------------------------------------------------------

    def _response_headers(self, msg: pb.HttpHeaders, req) -> Replies:
        self.response_started = True
        if self.pick is not None:
            served = replies.served_endpoint(req)
            if served is not None and served not in (self.pick.endpoint, self.pick.fallback):
                self.metrics.served_mismatch.inc()
            headers = replies.headers_of(msg.headers)
            status = _status(headers.get(":status", ""))
            box_call = headers.get(CALL_ID_HEADER)
            self._tell("served", self.call_id, served, status, self.clock(), box_call)
        if msg.end_of_stream or not self.response_body_sent:
            self._settle(True)  # no response body will come to see the end of
        return [replies.continue_headers(response=True)]

    def _response_body(self, msg: pb.HttpBody, _req) -> Replies:
        # Echo at once, so that a streamed (SSE) answer streams on to the client.
        self.response_body_seen = True
        if msg.end_of_stream:
            self._settle(True)  # Envoy may cancel the stream after this: that is normal
        return [replies.streamed(msg.body, msg.end_of_stream, response=True)]

    def _response_trailers(self, _msg, _req) -> Replies:
        self._settle(True)
        return [replies.continue_trailers(response=True)]

    def _settle(self, ok: bool) -> None:
        if self.pick is not None and not self.settled:
            self.settled = True
            self._tell("finished", self.call_id, ok, self.clock())

    def _tell(self, what: str, *args) -> None:
        # The picker's bookkeeping failing must not cut the client's response.
        try:
            getattr(self.picker, what)(*args)
        except Exception:
            log.exception("call %s: picker.%s failed", self.call_id, what)


_HANDLERS = {
    "request_headers": Stream._request_headers,
    "request_body": Stream._request_body,
    "request_trailers": Stream._request_trailers,
    "response_headers": Stream._response_headers,
    "response_body": Stream._response_body,
    "response_trailers": Stream._response_trailers,
}


def error(path: str, status: int, message: str, code: str) -> ImmediateAnswer:
    """A refusal in the error shape of the API `path` belongs to."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return replies.answer(path, APIError(status, message, type=kind, code=code))


def busy(path: str, message: str, code: str) -> ImmediateAnswer:
    """429 with `retry-after` in the API's error shape: the picker cannot take the call now."""
    err = APIError(
        429,
        f"{message}; try again shortly",
        type="rate_limit_exceeded",
        code=code,
        headers={"Retry-After": "1"},
    )
    return replies.answer(path, err)


MAX_SKEW_S = 10.0
"""Envoy's receipt time is taken as far back as this (a clock further off is not believed)."""


def arrival(now: float, received_at: float | None) -> float:
    """The call's arrival on the picker's clock (`now` when its headers reach the picker): Envoy's
    receipt, if it says when, moved onto that clock by how long ago it was in wall time; the
    stream's messages wait in the picker's queue under load, and a lease runs from the arrival."""
    if received_at is None:
        return now
    ago = time.time() - received_at
    return now - ago if 0.0 <= ago <= MAX_SKEW_S else now


def check_endpoint(endpoint: str | None) -> None:
    # Each entry of the destination list: Envoy's override_host matches "ip:port" exactly.
    if endpoint is None:
        return
    try:
        if "," in endpoint or " " in endpoint:
            raise ValueError
        split_host_port(endpoint)
    except ValueError:
        raise ValueError(f"the picker returned {endpoint!r}, not one ip:port") from None


def _status(text: str) -> int:
    return int(text) if text.isdigit() else 0
