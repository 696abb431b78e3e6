"""The admin API client shared by talaria-ctl and talaria-tui (imports neither torch nor the engine)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import grpc
from google.protobuf.json_format import MessageToDict

from talariad.admin import admin_pb2, admin_pb2_grpc

DEFAULT_SOCKET = "run/talaria-admin.sock"


class Unreachable(Exception):
    """The daemon's admin socket does not answer."""


class Refused(Exception):
    """The daemon answered but refused the request (unknown id, bad argument)."""


def _target(path: str) -> str:
    return f"unix://{os.path.abspath(path)}"


class AdminClient:
    def __init__(self, socket_path: str, timeout_s: float = 3.0):
        self.socket_path, self.timeout_s = socket_path, timeout_s
        self.channel = grpc.insecure_channel(_target(socket_path))
        self.stub = admin_pb2_grpc.AdminStub(self.channel)

    def _call(self, method: str, request):
        try:
            return getattr(self.stub, method)(request, timeout=self.timeout_s)
        except grpc.RpcError as err:
            if err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                raise Refused(err.details()) from None
            raise Unreachable(f"talariad admin socket {self.socket_path}: {err.code().name.lower()}: "
                              f"{err.details()}") from None

    def status(self) -> admin_pb2.StatusReply:
        return self._call("Status", admin_pb2.StatusRequest())

    def sessions(self, limit: int = 0) -> admin_pb2.SessionsReply:
        return self._call("Sessions", admin_pb2.SessionsRequest(limit=limit))

    def leases(self) -> admin_pb2.LeasesReply:
        return self._call("Leases", admin_pb2.LeasesRequest())

    def explain(self, call_id: str) -> admin_pb2.Decision:
        return self._call("Explain", admin_pb2.ExplainRequest(call_id=call_id))

    def memory(self, instance: str) -> admin_pb2.MemoryReply:
        return self._call("Memory", admin_pb2.MemoryRequest(instance=instance))

    def decisions(self, limit: int) -> admin_pb2.DecisionsReply:
        return self._call("Decisions", admin_pb2.DecisionsRequest(limit=limit))

    def watch(self, interval_s: float) -> Iterator[admin_pb2.StatusReply]:
        try:
            yield from self.stub.WatchStatus(admin_pb2.WatchRequest(interval_s=interval_s))
        except grpc.RpcError as err:
            raise Unreachable(f"talariad admin socket {self.socket_path}: {err.code().name.lower()}") from None

    def close(self) -> None:
        self.channel.close()


def as_dict(reply) -> dict:
    return MessageToDict(reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
