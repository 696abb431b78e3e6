"""The ext_proc messages the EPP reads and sends, in the only shapes Envoy 1.40 accepts in
FULL_DUPLEX_STREAMED (pure). Each rule below is a failure seen with the real Envoy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime

from talariad.calls.errors import APIError, error_body
from talariad.epp import ext_authz_pb2 as authz
from talariad.epp import ext_proc_pb2 as pb
from talariad.epp.contract import ImmediateAnswer

DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
LB = "envoy.lb"
"""The metadata namespace of the GIE endpoint contract (both ways)."""
LEASE = "x-talaria-lease"
"""The metadata key the check at request headers sets on a call it placed (the leased endpoint),
beside `DESTINATION`, in `AT_HEADERS`: the gateway's route for it turns the full-duplex filter
off, and its access log reports the call's end."""
AT_HEADERS = "envoy.filters.http.ext_authz"
"""The metadata namespace of the check at request headers (Envoy's ext_authz filter puts its
answer's dynamic metadata there)."""
EXT_PROC_ATTRIBUTES = "envoy.filters.http.ext_proc"
PIECE_BYTES = 62_000
"""Largest body piece sent back: GIE's chunk size, under Envoy's per-message buffers."""

OVERWRITE = pb.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def headers_of(headers: pb.HeaderMap) -> dict[str, str]:
    """Header names lower-cased, values from `raw_value` (where Envoy 1.40 puts them; `value`
    for older senders) as latin-1, which maps every byte; repeats joined with ", "."""
    out: dict[str, str] = {}
    for h in headers.headers:
        value = h.raw_value.decode("latin-1") if h.raw_value else h.value
        key = h.key.lower()
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


def header(key: str, value: str) -> pb.HeaderValueOption:
    # NOTE: a value in `HeaderValue.value` reaches the upstream empty (→ 503): raw_value only.
    return pb.HeaderValueOption(
        header=pb.HeaderValue(key=key, raw_value=value.encode("latin-1", "replace")),
        append_action=OVERWRITE,
    )


def route_to(destination: str) -> pb.ProcessingResponse:
    """The reply to the request headers that sends the request to `destination` ("ip:port", or
    several comma-separated, tried in order: `Pick.destination`): the header (for gateways that
    route on it) and the `envoy.lb` metadata (which clients cannot forge), with the route cache
    cleared so that Envoy routes again on them."""
    reply = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(
            response=pb.CommonResponse(
                header_mutation=pb.HeaderMutation(set_headers=[header(DESTINATION, destination)]),
                clear_route_cache=True,
            )
        )
    )
    reply.dynamic_metadata.update({LB: {DESTINATION: destination}})
    return reply


def placed_at_headers(destination: str, leased: str) -> authz.CheckResponse:
    """The check's answer for a call placed at its headers: OK, `destination` ("ip:port,ip:port":
    `Pick.destination`) and the `leased` endpoint in the metadata, and the destination header
    set, which makes Envoy clear its route cache (ext_authz clears it only when a header
    changes) and names the pick in its access log as the full-duplex filter's does."""
    option = authz.HeaderValueOption(
        header=authz.HeaderValue(key=DESTINATION, value=destination),
        append_action=authz.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )
    reply = authz.CheckResponse(ok_response=authz.OkHttpResponse(headers=[option]))
    reply.status.code = 0
    reply.dynamic_metadata.update({DESTINATION: destination, LEASE: leased})
    return reply


_UNPLACED = authz.CheckResponse(ok_response=authz.OkHttpResponse())


def unplaced() -> authz.CheckResponse:
    """The check's answer for a call left to the body: OK, nothing changed."""
    return _UNPLACED


def streamed(body: bytes, end_of_stream: bool, *, response: bool) -> pb.ProcessingResponse:
    """A body chunk sent back to Envoy. Always `streamed_response`: a whole-body reply in full
    duplex is a "spurious message" to Envoy, which answers the client 500."""
    answer = pb.BodyResponse(
        response=pb.CommonResponse(
            body_mutation=pb.BodyMutation(
                streamed_response=pb.StreamedBodyResponse(body=body, end_of_stream=end_of_stream)
            )
        )
    )
    if response:
        return pb.ProcessingResponse(response_body=answer)
    return pb.ProcessingResponse(request_body=answer)


def request_body_pieces(body: bytes, end_of_stream: bool = True) -> Iterator[pb.ProcessingResponse]:
    """The request body handed back in pieces of at most PIECE_BYTES, the end of stream on the
    last (an empty body is one empty piece, so the end still reaches Envoy). Without an end of
    stream (trailers follow) there is nothing to send for an empty body."""
    view = memoryview(body)
    starts = range(0, len(body), PIECE_BYTES) if body else ([0] if end_of_stream else [])
    for i, start in enumerate(starts):
        last = i == len(starts) - 1
        piece = bytes(view[start : start + PIECE_BYTES])
        yield streamed(piece, end_of_stream and last, response=False)


def answer(path: str, err: APIError) -> ImmediateAnswer:
    """`err` as an immediate answer, in the error shape of the API `path` belongs to."""
    headers = {k.lower(): str(v) for k, v in err.headers.items()}
    body = json.dumps(error_body(path, err)).encode()
    return ImmediateAnswer(err.status, body, headers, err.code or err.type)


def refuse(refusal: ImmediateAnswer, details: str) -> pb.ProcessingResponse:
    """`refusal` as the answer to the client, in place of routing. `details` reaches Envoy's
    access log (%RESPONSE_CODE_DETAILS%): a token, no spaces."""
    headers = {"content-type": "application/json", **refusal.headers}
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=pb.HttpStatus(code=refusal.status),
            headers=pb.HeaderMutation(set_headers=[header(k, v) for k, v in headers.items()]),
            body=refusal.body,
            details=details,
        )
    )


def continue_headers(*, response: bool) -> pb.ProcessingResponse:
    """Headers passed on unchanged."""
    if response:
        return pb.ProcessingResponse(response_headers=pb.HeadersResponse())
    return pb.ProcessingResponse(request_headers=pb.HeadersResponse())


def continue_trailers(*, response: bool) -> pb.ProcessingResponse:
    if response:
        return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
    return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())


def served_endpoint(request: pb.ProcessingRequest) -> str | None:
    """The endpoint that served the response, from a response message: the GIE contract's
    `envoy.lb` metadata first, then the ext_proc attribute `upstream.address` (stock Envoy sends
    the metadata only when configured to); None when neither says."""
    return _text(request.metadata_context.filter_metadata, LB, SERVED) or _text(
        request.attributes, EXT_PROC_ATTRIBUTES, "upstream.address"
    )


def received_at(request: pb.ProcessingRequest) -> float | None:
    """When Envoy received the request (its `request.time` attribute, RFC 3339), as a Unix time;
    None when the gateway does not send it."""
    text = _text(request.attributes, EXT_PROC_ATTRIBUTES, "request.time")
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _text(structs, namespace: str, key: str) -> str | None:
    # NOTE: reading a missing key of a protobuf message map adds it: test membership first.
    if namespace not in structs:
        return None
    value = structs[namespace].fields.get(key)
    if value is None or value.WhichOneof("kind") != "string_value":
        return None
    return value.string_value or None
