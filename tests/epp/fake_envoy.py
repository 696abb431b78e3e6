"""Envoy 1.40's side of the ext_proc conversation, as observed behind a real Envoy (full duplex,
both bodies streamed): the messages it sends, a stream driver that checks every reply against
what Envoy accepts, and a picker double that records what the server tells it."""

from __future__ import annotations

import asyncio

import grpc

from talariad.epp import ext_proc_pb2 as pb
from talariad.epp import ext_proc_pb2_grpc
from talariad.epp.contract import EPPRequest, ImmediateAnswer, Pick

ENDPOINT = "10.0.0.7:8000"
FULL_DUPLEX = pb.ProcessingMode.FULL_DUPLEX_STREAMED
MIB = 2**20


def _header_map(headers: dict[str, str]) -> pb.HeaderMap:
    # Envoy 1.40 fills raw_value only; `value` stays empty.
    return pb.HeaderMap(
        headers=[pb.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    )


def request_headers(
    method: str = "POST",
    path: str = "/v1/chat/completions",
    extra: dict[str, str] | None = None,
    end_of_stream: bool = False,
    request_id: str | None = "req-1",
    response_mode: int = FULL_DUPLEX,
) -> pb.ProcessingRequest:
    """The stream's first message: the only one that carries protocol_config."""
    headers = {":method": method, ":path": path, ":authority": "gw", ":scheme": "http"}
    if request_id is not None:
        headers["x-request-id"] = request_id  # Envoy adds it before ext_proc
    headers |= extra or {}
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=_header_map(headers), end_of_stream=end_of_stream),
        protocol_config=pb.ProtocolConfiguration(
            request_body_mode=FULL_DUPLEX, response_body_mode=response_mode
        ),
    )


def body(data: bytes, end_of_stream: bool = False, response: bool = False) -> pb.ProcessingRequest:
    msg = pb.HttpBody(body=data, end_of_stream=end_of_stream)
    if response:
        return with_lb(pb.ProcessingRequest(response_body=msg), ENDPOINT, None)
    return pb.ProcessingRequest(request_body=msg)


def with_lb(req: pb.ProcessingRequest, picked: str, served: str | None) -> pb.ProcessingRequest:
    """Response messages carry back the EPP's envoy.lb metadata (and -served when stamped)."""
    lb = {"x-gateway-destination-endpoint": picked}
    if served is not None:
        lb["x-gateway-destination-endpoint-served"] = served
    req.metadata_context.filter_metadata["envoy.lb"].update(lb)
    return req


def response_headers(
    status: int = 200,
    served: str | None = ENDPOINT,
    upstream: str | None = ENDPOINT,
    end_of_stream: bool = False,
    content_type: str = "application/json",
) -> pb.ProcessingRequest:
    headers = _header_map({":status": str(status), "content-type": content_type})
    req = pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(headers=headers, end_of_stream=end_of_stream)
    )
    if upstream is not None:  # only on response headers
        req.attributes["envoy.filters.http.ext_proc"].update({"upstream.address": upstream})
    return with_lb(req, ENDPOINT, served)


def trailers(response: bool) -> pb.ProcessingRequest:
    if response:
        return pb.ProcessingRequest(response_trailers=pb.HttpTrailers())
    return pb.ProcessingRequest(request_trailers=pb.HttpTrailers())


def check_accepted(reply: pb.ProcessingResponse) -> None:
    """What Envoy 1.40 needs of every reply: streamed body mutations only (else 500), header
    values in raw_value (else empty), OVERWRITE, pieces of at most 62,000 bytes."""
    kind = reply.WhichOneof("response")
    assert kind is not None
    if kind in ("request_body", "response_body"):
        mutation = getattr(reply, kind).response.body_mutation
        assert mutation.WhichOneof("mutation") == "streamed_response"
        assert len(mutation.streamed_response.body) <= 62_000 or kind == "response_body"
    sets = []
    if kind in ("request_headers", "response_headers"):
        sets = getattr(reply, kind).response.header_mutation.set_headers
    elif kind == "immediate_response":
        sets = reply.immediate_response.headers.set_headers
    for option in sets:
        assert option.header.value == "" and option.header.raw_value
        assert option.append_action == pb.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


class Conversation:
    """One ext_proc stream from the Envoy side."""

    def __init__(self, channel: grpc.aio.Channel, metadata: tuple = ()) -> None:
        """`metadata`: the stream's gRPC metadata, as the rendered config's `initial_metadata`."""
        self.call = ext_proc_pb2_grpc.ExternalProcessorStub(channel).Process(metadata=metadata)

    async def send(self, *requests: pb.ProcessingRequest) -> None:
        for request in requests:
            await self.call.write(request)

    async def read(self, n: int = 1, timeout: float = 10.0) -> list[pb.ProcessingResponse]:
        out = []
        for _ in range(n):
            reply = await asyncio.wait_for(self.call.read(), timeout)
            assert reply is not grpc.aio.EOF, f"the stream ended after {len(out)} of {n} replies"
            check_accepted(reply)
            out.append(reply)
        return out

    async def post(self, data: bytes, chunk: int = MIB, **headers) -> None:
        """Headers, the body in `chunk`s, then the separate empty end-of-stream chunk."""
        await self.send(request_headers(**headers))
        for i in range(0, len(data), chunk):
            await self.send(body(data[i : i + chunk]))
        await self.send(body(b"", end_of_stream=True))

    async def request_body_back(self) -> tuple[pb.ProcessingResponse, list[bytes]]:
        """The routing reply, then the body pieces up to the one with the end of stream."""
        (routing,) = await self.read()
        pieces = []
        while True:
            (piece,) = await self.read()
            assert piece.WhichOneof("response") == "request_body"
            streamed = piece.request_body.response.body_mutation.streamed_response
            pieces.append(streamed.body)
            if streamed.end_of_stream:
                return routing, pieces

    async def routed(self, data: bytes = b"{}", **headers):
        """A POST sent and its routing and body read back."""
        await self.post(data, **headers)
        return await self.request_body_back()

    async def end(self) -> grpc.StatusCode:
        """Half-close, as Envoy does at the end; the server must then end the stream cleanly."""
        await self.call.done_writing()
        assert await asyncio.wait_for(self.call.read(), 10) is grpc.aio.EOF
        return await self.call.code()


class RecordingPicker:
    """Picks `endpoint` (or answers `refusal`, or raises) and records every call."""

    def __init__(
        self, endpoint: str = ENDPOINT, refusal: ImmediateAnswer | None = None, fail: bool = False
    ):
        self.endpoint, self.refusal, self.fail = endpoint, refusal, fail
        self.requests: list[EPPRequest] = []
        self.served_calls: list[tuple[str, str | None, int]] = []
        self.finished_calls: list[tuple[str, bool]] = []
        self.at_headers = False  # lease_return places every call it is asked about
        self.header_requests: list[EPPRequest] = []
        self.logged_calls: list[tuple[str, str | None, int, bool]] = []

    def pick(self, request: EPPRequest, now: float) -> Pick | ImmediateAnswer:
        self.requests.append(request)
        if self.fail:
            raise RuntimeError("picker bug")
        return self.refusal or Pick(request.call_id, self.endpoint)

    def served(self, call_id, endpoint, status, now, box_call_id=None) -> None:
        self.served_calls.append((call_id, endpoint, status))

    def finished(self, call_id: str, ok: bool, now: float) -> None:
        self.finished_calls.append((call_id, ok))

    def lease_return(self, request: EPPRequest, now: float) -> Pick | None:
        self.header_requests.append(request)
        return Pick(request.call_id, self.endpoint) if self.at_headers else None

    def logged(self, call_id: str, endpoint: str | None, status: int, ok: bool, now: float) -> None:
        self.logged_calls.append((call_id, endpoint, status, ok))

    async def settled(self, timeout: float = 5.0) -> list[tuple[str, bool]]:
        """The finished calls, once there is one (the server settles a cancel asynchronously)."""
        for _ in range(int(timeout / 0.01)):
            if self.finished_calls:
                return self.finished_calls
            await asyncio.sleep(0.01)
        return self.finished_calls
