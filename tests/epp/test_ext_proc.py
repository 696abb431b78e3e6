"""The ext_proc protocol as Envoy 1.40 speaks it, replayed by a fake Envoy over a real gRPC
channel to the real server; the picker is a recording double."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os

import grpc

from talariad.epp import als_pb2, als_pb2_grpc, ext_authz_pb2, ext_authz_pb2_grpc
from talariad.epp import ext_proc_pb2 as pb
from talariad.epp import server as server_module
from talariad.epp.contract import ImmediateAnswer
from talariad.epp.replies import LEASE
from tests.epp import fake_envoy as envoy
from tests.epp.fake_envoy import ENDPOINT, MIB, RecordingPicker

LB = "envoy.lb"
DEST = "x-gateway-destination-endpoint"


def assert_routes_to(reply: pb.ProcessingResponse, endpoint: str) -> None:
    """One endpoint, in both the header (raw_value, OVERWRITE) and the envoy.lb metadata, with
    the route cache cleared."""
    assert reply.WhichOneof("response") == "request_headers"
    common = reply.request_headers.response
    assert common.clear_route_cache
    (option,) = common.header_mutation.set_headers
    assert option.header.key == DEST and option.header.raw_value == endpoint.encode()
    assert option.append_action == pb.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
    assert dict(reply.dynamic_metadata[LB]) == {DEST: endpoint}


def streamed(reply: pb.ProcessingResponse, kind: str) -> pb.StreamedBodyResponse:
    assert reply.WhichOneof("response") == kind
    return getattr(reply, kind).response.body_mutation.streamed_response


async def test_post_is_routed_at_the_body_end_and_settled_at_the_response_end(epp):
    run = await epp()
    call = run.stream()
    chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    await call.post(chat)
    routing, pieces = await call.request_body_back()  # headers reply first, then the body
    assert_routes_to(routing, ENDPOINT)
    assert pieces == [chat]
    (request,) = run.picker.requests
    assert (request.call_id, request.method, request.path) == (
        "req-1",
        "POST",
        "/v1/chat/completions",
    )
    assert request.body == chat and request.headers["x-request-id"] == "req-1"

    await call.send(envoy.response_headers(status=200))
    (reply,) = await call.read()
    assert reply.WhichOneof("response") == "response_headers"
    assert run.picker.served_calls == [("req-1", ENDPOINT, 200)]
    await call.send(envoy.body(b'{"id": "x"}', response=True))
    await call.send(envoy.body(b"", end_of_stream=True, response=True))
    echo = [streamed(r, "response_body") for r in await call.read(2)]
    assert [(e.body, e.end_of_stream) for e in echo] == [(b'{"id": "x"}', False), (b"", True)]
    assert run.picker.finished_calls == [("req-1", True)]
    assert await call.end() == grpc.StatusCode.OK
    assert run.picker.finished_calls == [("req-1", True)]  # settled once


async def test_an_8_mib_body_in_1_mib_chunks_comes_back_intact_in_small_pieces(epp):
    run = await epp()
    call = run.stream()
    data = os.urandom(8 * MIB)
    await call.post(data, chunk=MIB)
    routing, pieces = await call.request_body_back()
    assert_routes_to(routing, ENDPOINT)
    assert all(len(p) <= 62_000 for p in pieces) and len(pieces) == -(-len(data) // 62_000)
    assert hashlib.sha256(b"".join(pieces)).digest() == hashlib.sha256(data).digest()
    assert hashlib.sha256(run.picker.requests[0].body).digest() == hashlib.sha256(data).digest()


async def test_a_get_is_routed_on_its_headers_and_gets_a_call_id(epp):
    run = await epp()
    call = run.stream()
    await call.send(envoy.request_headers("GET", "/v1/models", end_of_stream=True, request_id=None))
    (routing,) = await call.read()
    assert_routes_to(routing, ENDPOINT)
    (request,) = run.picker.requests
    assert request.call_id and request.method == "GET" and request.body == b""
    await call.send(envoy.response_headers(), envoy.body(b"", end_of_stream=True, response=True))
    await call.read(2)
    assert run.picker.finished_calls == [(request.call_id, True)]


async def test_sse_chunks_are_echoed_at_once_in_order(epp):
    run = await epp()
    call = run.stream()
    await call.routed()
    await call.send(envoy.response_headers(content_type="text/event-stream"))
    await call.read()
    events = [f"data: {i}\n\n".encode() * (i + 1) for i in range(7)]
    for event in events:  # each answered before the next is sent
        await call.send(envoy.body(event, response=True))
        (echo,) = await call.read()
        piece = streamed(echo, "response_body")
        assert (piece.body, piece.end_of_stream) == (event, False)
    assert run.picker.finished_calls == []
    await call.send(envoy.body(b"", end_of_stream=True, response=True))
    (last,) = await call.read()
    assert streamed(last, "response_body").end_of_stream
    assert run.picker.finished_calls == [("req-1", True)]


async def test_a_refusal_is_an_immediate_response_in_place_of_routing(epp):
    refusal = ImmediateAnswer(429, b'{"error": {"message": "busy"}}', {"retry-after": "3"})
    run = await epp(RecordingPicker(refusal=refusal))
    call = run.stream()
    await call.post(b"{}")
    (reply,) = await call.read()
    assert reply.WhichOneof("response") == "immediate_response"
    now = reply.immediate_response
    assert now.status.code == 429 and now.body == refusal.body
    headers = {o.header.key: o.header.raw_value for o in now.headers.set_headers}
    assert headers == {"retry-after": b"3", "content-type": b"application/json"}
    assert await call.end() == grpc.StatusCode.OK
    assert run.picker.served_calls == [] and run.picker.finished_calls == []


async def test_a_failing_picker_is_a_503_not_a_dead_stream(epp):
    run = await epp(RecordingPicker(fail=True))
    call = run.stream()
    await call.post(b"{}")
    (reply,) = await call.read()
    assert reply.immediate_response.status.code == 503
    error = json.loads(reply.immediate_response.body)["error"]
    assert error["type"] == "server_error" and error["code"] == "epp_error"
    assert await call.end() == grpc.StatusCode.OK


async def test_a_fallback_list_from_the_picker_is_a_503_not_sent_to_envoy(epp):
    run = await epp(RecordingPicker(endpoint="10.0.0.7:8000,10.0.0.8:8000"))
    call = run.stream()
    await call.post(b"{}")
    (reply,) = await call.read()
    assert reply.immediate_response.status.code == 503


async def test_a_body_over_the_bound_is_a_413_in_the_openai_shape(epp):
    run = await epp(max_body_bytes=1000)
    call = run.stream()
    await call.post(b"x" * 3000, chunk=700)
    (reply,) = await call.read()
    assert reply.immediate_response.status.code == 413
    error = json.loads(reply.immediate_response.body)["error"]
    # refused as it passed the bound: the rest of a chunked body is never read
    assert error["code"] == "request_too_large" and "passed 1000 bytes" in error["message"]
    assert run.picker.requests == []
    assert run.processor.metrics.decisions.labels("too_large")._value.get() == 1
    assert run.processor.metrics.refusals.labels("413", "request_too_large")._value.get() == 1
    assert run.processor.budget.held == 0


async def test_a_body_over_the_bound_on_messages_is_in_the_anthropic_shape(epp):
    run = await epp(max_body_bytes=10)
    call = run.stream()
    await call.post(b"x" * 11, path="/v1/messages")
    (reply,) = await call.read()
    body = json.loads(reply.immediate_response.body)
    assert body["type"] == "error" and body["error"]["type"] == "request_too_large"


async def test_a_body_at_the_bound_passes(epp):
    run = await epp(max_body_bytes=1000)
    call = run.stream()
    await call.post(b"x" * 1000, chunk=300)
    _, pieces = await call.request_body_back()
    assert pieces == [b"x" * 1000]


async def test_a_cancel_before_the_response_end_fails_the_call(epp):
    run = await epp()
    call = run.stream()
    await call.routed()
    await call.send(envoy.response_headers(), envoy.body(b"data: 1\n\n", response=True))
    await call.read(2)
    call.call.cancel()
    assert await run.picker.settled() == [("req-1", False)]


async def test_a_cancel_after_the_response_end_is_normal(epp):
    run = await epp()
    call = run.stream()
    await call.routed()
    await call.send(envoy.response_headers(), envoy.body(b"", end_of_stream=True, response=True))
    await call.read(2)
    call.call.cancel()
    assert await run.picker.settled() == [("req-1", True)]


async def test_response_body_mode_none_settles_at_the_response_headers(epp):
    run = await epp()
    call = run.stream()
    await call.routed(response_mode=pb.ProcessingMode.NONE)
    await call.send(envoy.response_headers())
    await call.read()
    assert run.picker.finished_calls == [("req-1", True)]
    assert await call.end() == grpc.StatusCode.OK


async def test_a_stream_ended_after_the_response_headers_settles_ok(epp):
    """No protocol_config saying so, but Envoy ends the stream after the response headers: it
    sends no response body, so there is no end to wait for."""
    run = await epp()
    call = run.stream()
    await call.routed()
    await call.send(envoy.response_headers())
    await call.read()
    assert await call.end() == grpc.StatusCode.OK
    assert run.picker.finished_calls == [("req-1", True)]


async def test_a_stream_ended_before_the_response_fails_the_call(epp):
    run = await epp()
    call = run.stream()
    await call.routed()
    assert await call.end() == grpc.StatusCode.OK
    assert run.picker.finished_calls == [("req-1", False)]


async def test_the_served_endpoint_falls_back_to_the_upstream_attribute(epp):
    run = await epp()
    call = run.stream()
    await call.routed()
    await call.send(envoy.response_headers(status=502, served=None, upstream="10.0.0.9:8000"))
    await call.read()
    assert run.picker.served_calls == [("req-1", "10.0.0.9:8000", 502)]
    assert run.processor.metrics.served_mismatch._value.get() == 1


async def test_an_unreported_served_endpoint_is_none(epp):
    run = await epp()
    call = run.stream()
    await call.routed()
    await call.send(envoy.response_headers(served=None, upstream=None))
    await call.read()
    assert run.picker.served_calls == [("req-1", None, 200)]
    assert run.processor.metrics.served_mismatch._value.get() == 0


async def test_trailers_are_answered_and_end_the_request(epp):
    run = await epp()
    call = run.stream()
    await call.send(envoy.request_headers(), envoy.body(b"abc"), envoy.trailers(response=False))
    routing, piece, answer = await call.read(3)
    assert_routes_to(routing, ENDPOINT)
    body = streamed(piece, "request_body")
    assert (body.body, body.end_of_stream) == (b"abc", False)  # the trailers end the request
    assert answer.WhichOneof("response") == "request_trailers"
    await call.send(envoy.response_headers(), envoy.trailers(response=True))
    _, answer = await call.read(2)
    assert answer.WhichOneof("response") == "response_trailers"
    assert run.picker.finished_calls == [("req-1", True)]


async def test_decisions_are_counted_and_timed(epp):
    run = await epp()
    for _ in range(2):
        call = run.stream()
        await call.routed()
        await call.end()
    m = run.processor.metrics
    assert m.decisions.labels("picked")._value.get() == 2
    assert m.streams._value.get() == 2
    assert m.registry.get_sample_value("talaria_epp_decision_seconds_count") == 2


async def test_a_declared_length_over_the_bound_is_a_413_before_any_body(epp):
    run = await epp(max_body_bytes=1000)
    call = run.stream()
    await call.send(envoy.request_headers(extra={"content-length": "1001"}))
    (reply,) = await call.read()  # at the headers: no body was sent
    assert reply.immediate_response.status.code == 413
    error = json.loads(reply.immediate_response.body)["error"]
    assert error["code"] == "request_too_large" and "1001 bytes" in error["message"]
    await call.send(envoy.body(b"x" * 600), envoy.body(b"", end_of_stream=True))
    assert await call.end() == grpc.StatusCode.OK  # what Envoy still sends is dropped, unanswered
    assert run.picker.requests == []
    assert run.processor.metrics.decisions.labels("too_large")._value.get() == 1


async def test_a_declared_length_at_the_bound_passes(epp):
    run = await epp(max_body_bytes=1000)
    call = run.stream()
    await call.post(b"x" * 1000, extra={"content-length": "1000"})
    routing, pieces = await call.request_body_back()
    assert_routes_to(routing, ENDPOINT)
    assert pieces == [b"x" * 1000]


async def test_a_trickling_body_times_out_with_the_api_408(epp):
    run = await epp(body_timeout_s=0.3)
    call = run.stream()
    await call.send(envoy.request_headers(path="/v1/messages"), envoy.body(b'{"mo'))
    started = asyncio.get_running_loop().time()
    for _ in range(3):  # still trickling: each byte is not the whole body
        await call.send(envoy.body(b" "))
    (reply,) = await call.read(timeout=5)
    waited = asyncio.get_running_loop().time() - started
    assert reply.immediate_response.status.code == 408 and 0.2 <= waited < 3, waited
    body = json.loads(reply.immediate_response.body)  # /v1/messages: the Anthropic shape
    assert body["type"] == "error" and "within 0.3 s" in body["error"]["message"]
    await call.send(envoy.body(b"", end_of_stream=True))
    assert await call.end() == grpc.StatusCode.OK
    assert run.picker.requests == [] and run.picker.finished_calls == []
    assert run.processor.metrics.decisions.labels("body_timeout")._value.get() == 1


async def test_a_body_whole_in_time_is_not_timed_out(epp):
    run = await epp(body_timeout_s=0.5)
    call = run.stream()
    await call.send(envoy.request_headers(), envoy.body(b"{"))
    await asyncio.sleep(0.2)
    await call.send(envoy.body(b"}", end_of_stream=True))
    routing, pieces = await call.request_body_back()
    assert_routes_to(routing, ENDPOINT)
    assert pieces == [b"{}"]
    await asyncio.sleep(0.5)  # past the deadline: the call is routed, nothing more comes
    await call.send(envoy.response_headers(), envoy.body(b"", end_of_stream=True, response=True))
    await call.read(2)
    assert run.picker.finished_calls == [("req-1", True)]


# --- the check at request headers and the access log -------------------------------------------


def _check(headers: dict[str, str], rid: str = "req-1") -> ext_authz_pb2.CheckRequest:
    """What Envoy's ext_authz filter sends: method, path, id and the allowed headers."""
    req = ext_authz_pb2.CheckRequest()
    http = req.attributes.request.http
    http.id, http.method, http.path = rid, "POST", "/v1/chat/completions"
    http.headers.update({"x-request-id": rid, **headers})
    return req


async def test_a_call_placed_at_headers_is_routed_and_marked_in_one_answer(epp):
    running = await epp()
    running.picker.at_headers = True
    stub = ext_authz_pb2_grpc.AuthorizationStub(running.channel)
    reply = await stub.Check(_check({"x-session-id": "s", "content-length": "12"}))
    assert reply.status.code == 0 and reply.WhichOneof("http_response") == "ok_response"
    assert dict(reply.dynamic_metadata) == {DEST: ENDPOINT, LEASE: ENDPOINT}
    (option,) = reply.ok_response.headers  # a header set: Envoy clears its route cache
    assert option.header.key == DEST and option.header.value == ENDPOINT
    [asked] = running.picker.header_requests
    assert asked.call_id == "req-1" and asked.body == b"" and asked.headers["x-session-id"] == "s"
    assert asked.method == "POST" and asked.path == "/v1/chat/completions"
    assert running.picker.requests == []  # the full-duplex decision was not asked for
    placed = running.processor.metrics.at_headers.labels("placed")._value.get()
    assert placed == 1


async def test_a_call_not_placed_at_headers_passes_unchanged_to_the_body_filter(epp):
    running = await epp()
    stub = ext_authz_pb2_grpc.AuthorizationStub(running.channel)
    reply = await stub.Check(_check({}))
    assert reply.status.code == 0  # never a denial
    assert not reply.ok_response.headers and not reply.HasField("dynamic_metadata")


async def test_a_failing_lease_lookup_passes_the_call_on(epp):
    running = await epp(picker=RecordingPicker(endpoint="not an endpoint"))
    running.picker.at_headers = True
    stub = ext_authz_pb2_grpc.AuthorizationStub(running.channel)
    reply = await stub.Check(_check({}))
    assert reply.status.code == 0 and not reply.HasField("dynamic_metadata")


def _entry(rid: str, status: int, **flags: bool) -> als_pb2.HTTPAccessLogEntry:
    e = als_pb2.HTTPAccessLogEntry()
    e.request.request_id = rid
    if status:
        e.response.response_code.value = status
    e.common_properties.upstream_remote_address.socket_address.address = "10.0.0.7"
    e.common_properties.upstream_remote_address.socket_address.port_value = 8000
    for name, value in flags.items():
        setattr(e.common_properties.response_flags, name, value)
    return e


async def test_access_log_entries_settle_the_calls_placed_at_headers(epp):
    running = await epp()
    stub = als_pb2_grpc.AccessLogServiceStub(running.channel)
    entries = [
        _entry("ok", 200),
        _entry("refused", 503),
        _entry("cut", 200, downstream_connection_termination=True),
        _entry("reset", 200, upstream_remote_reset=True),
        _entry("none", 0),
    ]
    message = als_pb2.StreamAccessLogsMessage()
    message.http_logs.log_entry.extend(entries)
    going = als_pb2.StreamAccessLogsMessage()
    going.http_logs.log_entry.append(_entry("going", 200))
    going.http_logs.log_entry[0].common_properties.intermediate_log_entry = True

    async def feed():
        yield message
        yield going

    await stub.StreamAccessLogs(feed())
    assert running.picker.logged_calls == [
        ("ok", ENDPOINT, 200, True),
        ("refused", ENDPOINT, 503, False),
        ("cut", ENDPOINT, 200, False),
        ("reset", ENDPOINT, 200, False),
        ("none", ENDPOINT, 0, False),
    ]


async def test_a_stream_past_the_pickers_limit_is_a_429_at_its_headers(epp):
    run = await epp(max_streams=1)
    first = run.stream()
    await first.send(envoy.request_headers())  # held open: its body has not come
    await until_open(run, 1)
    second = run.stream()
    await second.send(envoy.request_headers())
    (reply,) = await second.read()  # at the headers: no body was sent
    answer = reply.immediate_response
    assert answer.status.code == 429
    assert {h.header.key: h.header.raw_value for h in answer.headers.set_headers}[
        "retry-after"
    ] == b"1"
    assert json.loads(answer.body)["error"]["code"] == "epp_stream_limit"
    await second.send(envoy.body(b"{}", end_of_stream=True))
    assert await second.end() == grpc.StatusCode.OK
    await first.send(envoy.body(b"{}", end_of_stream=True))  # the first is still picked
    (routing, *_) = await first.read(2)
    assert_routes_to(routing, ENDPOINT)
    m = run.processor.metrics
    assert m.refusals.labels("429", "epp_stream_limit")._value.get() == 1
    assert m.decisions.labels("overloaded")._value.get() == 1
    assert len(run.picker.requests) == 1


async def test_bodies_past_the_shared_buffer_are_a_429_and_release_what_they_held(epp):
    run = await epp(max_body_bytes=1000, body_buffer_bytes=1500)
    first, second = run.stream(), run.stream()
    await first.send(envoy.request_headers(), envoy.body(b"x" * 1000))
    await until(lambda: run.processor.budget.held == 1000)
    await second.send(envoy.request_headers(), envoy.body(b"y" * 400))
    await until(lambda: run.processor.budget.held == 1400)
    await second.send(envoy.body(b"y" * 400))  # 1,800 held: past the budget
    (reply,) = await second.read()
    assert reply.immediate_response.status.code == 429
    assert json.loads(reply.immediate_response.body)["error"]["code"] == "epp_body_buffer_full"
    assert run.processor.budget.held == 1000  # the refused body's bytes are given back
    await first.send(envoy.body(b"", end_of_stream=True))
    _routing, pieces = await first.request_body_back()
    assert pieces == [b"x" * 1000]
    assert run.processor.budget.held == 0  # handed back to Envoy: no longer held
    assert run.processor.metrics.refusals.labels("429", "epp_body_buffer_full")._value.get() == 1


async def until(condition, wait_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + wait_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.01)


async def until_open(run, n: int) -> None:
    await until(lambda: run.processor.open == n)


async def test_grpcs_own_pending_bound_is_above_what_the_gateway_can_open(monkeypatch):
    # gRPC refuses streams the server has not taken yet past 1,000 (3,000 hard): through Envoy,
    # a burst of 2,000 trickling bodies had streams refused (500s, or unpicked under fail-open)
    built = {}
    real = server_module.grpc.aio.server

    def capture(options):
        built.update(options)
        return real(options=options)

    monkeypatch.setattr(server_module.grpc.aio, "server", capture)
    processor = server_module.ExtProcServicer(RecordingPicker(), max_streams=50)
    started = await server_module.start(processor, "127.0.0.1:0")
    await started.server.stop(0)
    assert built["grpc.server.max_pending_requests"] == 50 * server_module.PENDING_PER_STREAM
    assert built["grpc.server.max_pending_requests_hard_limit"] == 5000
