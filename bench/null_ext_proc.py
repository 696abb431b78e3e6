"""The floor of a Python endpoint picker: an ext_proc server that picks nothing (every call goes
to one box) and keeps nothing, over the same `grpc.aio` server, messages and replies as
`talariad epp`. `bench/epp_bench.py` puts Envoy in front of it as a latency arm, so the cost of
the protocol itself (a gRPC stream per call, its messages through Python) is measured beside the
cost of the real picker. As the check at request headers (lease returns placed there) it places
every call, and it takes the access log's entries without reading them.

    python bench/null_ext_proc.py HOST:PORT BOX_HOST:BOX_PORT
"""

from __future__ import annotations

import asyncio
import sys

from talariad.epp import (
    als_pb2,
    als_pb2_grpc,
    ext_authz_pb2_grpc,
    ext_proc_pb2_grpc,
    replies,
    server,
)
from talariad.epp import ext_proc_pb2 as pb


class NullProcessor(ext_proc_pb2_grpc.ExternalProcessorServicer):
    """The fewest Python steps Envoy's message order allows: the body gathered to its end, then
    the routing reply and the body back; the response passed on."""

    max_streams = None  # the server's gRPC bounds as `talariad epp`'s default (`server.start`)

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    async def Process(self, request_iterator, context):  # noqa: N802 (gRPC method name)
        body = bytearray()
        async for request in request_iterator:
            kind = request.WhichOneof("request")
            if kind == "request_body":
                body += request.request_body.body
                if request.request_body.end_of_stream:
                    yield replies.route_to(self.endpoint)
                    yield replies.streamed(bytes(body), True, response=False)
            elif kind == "response_headers":
                yield replies.continue_headers(response=True)
            elif kind == "response_body":
                msg: pb.HttpBody = request.response_body
                yield replies.streamed(msg.body, msg.end_of_stream, response=True)
            elif kind in ("request_trailers", "response_trailers"):
                yield replies.continue_trailers(response=kind == "response_trailers")


class NullLease(ext_authz_pb2_grpc.AuthorizationServicer):
    def __init__(self, endpoint: str) -> None:
        self.reply = replies.placed_at_headers(endpoint, endpoint)

    async def Check(self, request, context):  # noqa: N802 (gRPC method name)
        return self.reply


class NullAccessLog(als_pb2_grpc.AccessLogServiceServicer):
    async def StreamAccessLogs(self, request_iterator, context):  # noqa: N802 (gRPC method name)
        async for _ in request_iterator:
            pass
        return als_pb2.StreamAccessLogsResponse()


async def main(address: str, endpoint: str) -> None:
    processor = NullProcessor(endpoint)
    started = await server.start(
        processor,  # type: ignore[arg-type]
        address,
        lease=NullLease(endpoint),
        access_log=NullAccessLog(),
    )
    print(f"null ext_proc listening on {address}", file=sys.stderr, flush=True)
    await server.serve(started, grace_s=0.0)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    asyncio.run(main(sys.argv[1], sys.argv[2]))
