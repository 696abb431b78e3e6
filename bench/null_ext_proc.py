"""The floor of a Python endpoint picker: an ext_proc server that picks nothing (every call goes
to one box) and keeps nothing, over the same `grpc.aio` server, messages and replies as
`talariad epp`. `bench/epp_bench.py` puts Envoy in front of it as a latency arm, so the cost of
the protocol itself (a gRPC stream per call, its messages through Python) is measured beside the
cost of the real picker.

    python bench/null_ext_proc.py HOST:PORT BOX_HOST:BOX_PORT
"""

from __future__ import annotations

import asyncio
import sys

from talariad.epp import ext_proc_pb2 as pb
from talariad.epp import ext_proc_pb2_grpc, replies, server


class NullProcessor(ext_proc_pb2_grpc.ExternalProcessorServicer):
    """The fewest Python steps Envoy's message order allows: the body gathered to its end, then
    the routing reply and the body back; the response passed on."""

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


async def main(address: str, endpoint: str) -> None:
    started = await server.start(NullProcessor(endpoint), address)  # type: ignore[arg-type]
    print(f"null ext_proc listening on {address}", file=sys.stderr, flush=True)
    await server.serve(started, grace_s=0.0)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    asyncio.run(main(sys.argv[1], sys.argv[2]))
