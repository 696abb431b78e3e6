"""The vendored proto's wire numbers, and the pure reply builders' edges."""

from __future__ import annotations

import time

import pytest

from talariad.epp import ext_proc_pb2 as pb
from talariad.epp import replies
from talariad.epp.contract import ImmediateAnswer
from talariad.epp.stream import arrival

# (message, the first tag byte on the wire): field number << 3 | wire type (2 = length-delimited,
# 0 = varint), as in Envoy's data-plane-api external_processor.proto.
WIRE = [
    (pb.ProcessingRequest(request_headers=pb.HttpHeaders()), 0x12),  # 2
    (pb.ProcessingRequest(response_headers=pb.HttpHeaders()), 0x1A),  # 3
    (pb.ProcessingRequest(request_body=pb.HttpBody()), 0x22),  # 4
    (pb.ProcessingRequest(response_body=pb.HttpBody()), 0x2A),  # 5
    (pb.ProcessingRequest(request_trailers=pb.HttpTrailers()), 0x32),  # 6
    (pb.ProcessingRequest(response_trailers=pb.HttpTrailers()), 0x3A),  # 7
    (pb.ProcessingRequest(metadata_context=pb.Metadata(filter_metadata={"a": {}})), 0x42),  # 8
    (pb.ProcessingRequest(attributes={"a": {}}), 0x4A),  # 9
    (pb.ProcessingRequest(protocol_config=pb.ProtocolConfiguration(response_body_mode=4)), 0x5A),
    (pb.ProcessingResponse(request_headers=pb.HeadersResponse()), 0x0A),  # 1
    (pb.ProcessingResponse(request_body=pb.BodyResponse()), 0x1A),  # 3
    (pb.ProcessingResponse(response_body=pb.BodyResponse()), 0x22),  # 4
    (pb.ProcessingResponse(immediate_response=pb.ImmediateResponse()), 0x3A),  # 7
    (pb.ProcessingResponse(dynamic_metadata={"a": 1}), 0x42),  # 8
    (pb.CommonResponse(clear_route_cache=True), 0x28),  # 5, varint
    (pb.BodyMutation(streamed_response=pb.StreamedBodyResponse()), 0x1A),  # 3
    (pb.HttpHeaders(end_of_stream=True), 0x18),  # 3, varint
    (pb.HeaderValue(raw_value=b"x"), 0x1A),  # 3
    (pb.HeaderValueOption(append_action=2), 0x18),  # 3, varint
    (pb.ImmediateResponse(details="x"), 0x2A),  # 5
]


@pytest.mark.parametrize("message,tag", WIRE)
def test_wire_numbers(message, tag):
    assert message.SerializeToString()[0] == tag


def test_the_method_path():
    service = pb.DESCRIPTOR.services_by_name["ExternalProcessor"]
    assert service.full_name + "/" + service.methods[0].name == (
        "envoy.service.ext_proc.v3.ExternalProcessor/Process"
    )


@pytest.mark.parametrize(
    "size,pieces", [(0, [0]), (1, [1]), (62_000, [62_000]), (62_001, [62_000, 1])]
)
def test_request_body_pieces(size, pieces):
    out = [
        r.request_body.response.body_mutation.streamed_response
        for r in replies.request_body_pieces(b"x" * size)
    ]
    assert [len(p.body) for p in out] == pieces
    assert [p.end_of_stream for p in out] == [False] * (len(pieces) - 1) + [True]


def test_an_empty_body_before_trailers_sends_nothing():
    assert list(replies.request_body_pieces(b"", end_of_stream=False)) == []


def test_headers_decode_raw_value_and_join_repeats():
    hm = pb.HeaderMap(
        headers=[
            pb.HeaderValue(key="X-A", raw_value=b"1"),
            pb.HeaderValue(key="x-a", raw_value=b"2"),
            pb.HeaderValue(key="x-b", value="old"),  # an older sender
            pb.HeaderValue(key="x-c", raw_value="é".encode()),
        ]
    )
    assert replies.headers_of(hm) == {"x-a": "1, 2", "x-b": "old", "x-c": "Ã©"}


def test_reading_the_served_endpoint_adds_no_metadata():
    request = pb.ProcessingRequest(response_headers=pb.HttpHeaders())
    assert replies.served_endpoint(request) is None
    assert not request.HasField("metadata_context") and len(request.attributes) == 0


def test_refusal_headers_may_override_the_content_type():
    reply = replies.refuse(
        ImmediateAnswer(503, b"busy", {"content-type": "text/plain"}), "epp_refused"
    )
    (option,) = reply.immediate_response.headers.set_headers
    assert (option.header.key, option.header.raw_value) == ("content-type", b"text/plain")


def test_envoys_receipt_time_is_read_from_the_request_attributes():
    req = pb.ProcessingRequest()
    assert replies.received_at(req) is None
    attrs = req.attributes["envoy.filters.http.ext_proc"]
    attrs.update({"request.time": "2026-12-04T21:39:20.269194+00:00"})
    assert replies.received_at(req) == 1796420360.269194
    attrs.update({"request.time": "not a time"})
    assert replies.received_at(req) is None


def test_a_calls_arrival_is_envoys_receipt_on_the_pickers_clock():
    now_wall = time.time()
    assert arrival(50.0, now_wall - 0.4) == pytest.approx(49.6, abs=0.05)
    assert arrival(50.0, None) == 50.0
    assert arrival(50.0, now_wall + 5.0) == 50.0  # a receipt in the future: not believed
    assert arrival(50.0, now_wall - 3600.0) == 50.0  # nor one from an hour ago
