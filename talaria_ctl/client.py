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


def _target(path: str) -> str:
    return f"unix://{os.path.abspath(path)}"


class AdminClient:
    def __init__(self, socket_path: str, timeout_s: float = 3.0):
        self.socket_path, self.timeout_s = socket_path, timeout_s
        self.channel = grpc.insecure_channel(_target(socket_path))
        self.stub = admin_pb2_grpc.AdminStub(self.channel)

    def status(self) -> admin_pb2.StatusReply:
        try:
            return self.stub.Status(admin_pb2.StatusRequest(), timeout=self.timeout_s)
        except grpc.RpcError as err:
            raise Unreachable(f"talariad admin socket {self.socket_path}: {err.code().name.lower()}: "
                              f"{err.details()}") from None

    def watch(self, interval_s: float) -> Iterator[admin_pb2.StatusReply]:
        try:
            yield from self.stub.WatchStatus(admin_pb2.WatchRequest(interval_s=interval_s))
        except grpc.RpcError as err:
            raise Unreachable(f"talariad admin socket {self.socket_path}: {err.code().name.lower()}") from None

    def close(self) -> None:
        self.channel.close()


def status_dict(reply: admin_pb2.StatusReply) -> dict:
    return MessageToDict(reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
