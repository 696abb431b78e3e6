"""The admin API client shared by talaria-ctl and talaria-tui (imports neither torch nor the engine)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict

from talariad.admin import admin_pb2, admin_pb2_grpc
from talariad.admin.sockets import client_socket

ACTION_TIMEOUT_S = 300.0
"""Actions that drain or restart an instance wait for it; reads use the client's timeout."""

_REFUSED = (
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNIMPLEMENTED,
)


def default_socket() -> str:
    return client_socket()


CANDIDATE_COLUMNS = (
    "instance",
    "queue",
    "prefill",
    "decode",
    "kv",
    "activation",
    "total",
    "replica",
    "contention",
    "kv_state",
    "feasible",
)
"""The per-candidate Eq. (1) breakdown, as ctl and the dashboard print it."""


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
        self._streams: list = []

    def _call(self, method: str, request, action: bool = False):
        timeout = max(self.timeout_s, ACTION_TIMEOUT_S) if action else self.timeout_s
        try:
            return getattr(self.stub, method)(request, timeout=timeout)
        except grpc.RpcError as err:
            if err.code() in _REFUSED:
                raise Refused(err.details()) from None
            raise Unreachable(
                f"talariad admin socket {self.socket_path}: {err.code().name.lower()}: "
                f"{err.details()}"
            ) from None

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

    def models(self) -> admin_pb2.ModelsReply:
        return self._call("Models", admin_pb2.ModelsRequest())

    def pools(self) -> admin_pb2.PoolsReply:
        return self._call("Pools", admin_pb2.PoolsRequest())

    def rounds(self, instance: str = "", limit: int = 0) -> admin_pb2.RoundsReply:
        return self._call("Rounds", admin_pb2.RoundsRequest(instance=instance, limit=limit))

    def config(self) -> admin_pb2.ConfigReply:
        return self._call("ShowConfig", admin_pb2.ConfigRequest())

    def instance_action(
        self, verb: str, instance: str, force: bool = False
    ) -> admin_pb2.InstanceStatus:
        """verb: Drain | Undrain | Cordon | Restart. `force`: drain or cordon even the last
        instance that takes a model's calls."""
        return self._call(
            f"{verb}Instance",
            admin_pb2.InstanceRequest(instance=instance, force=force),
            action=True,
        )

    def plan(self, apply: bool = False) -> admin_pb2.PlanReply:
        return self._call("PoolPlan", admin_pb2.PlanRequest(apply=apply), action=apply)

    def move(
        self, instance: str, to: str, model: str = "", force: bool = False
    ) -> admin_pb2.InstanceStatus:
        return self._call(
            "MoveInstance",
            admin_pb2.MoveRequest(instance=instance, to=to, model=model, force=force),
            action=True,
        )

    def model_action(
        self, verb: str, model: str, instance: str, force: bool = False
    ) -> admin_pb2.ModelStatus:
        """verb: Pin | Unpin | Load | Unload."""
        request = admin_pb2.ModelRequest(model=model, instance=instance, force=force)
        return self._call(f"{verb}Model", request, action=True)

    def revoke(self, session_id: str, model: str = "") -> admin_pb2.LeasesReply:
        return self._call(
            "RevokeLease", admin_pb2.LeaseRequest(session_id=session_id, model=model), action=True
        )

    def forget(self, session_id: str) -> admin_pb2.ForgetReply:
        return self._call(
            "ForgetSession", admin_pb2.SessionRequest(session_id=session_id), action=True
        )

    def reload(self) -> admin_pb2.ReloadReply:
        return self._call("ReloadConfig", admin_pb2.ReloadRequest(), action=True)

    def _follow(self, call) -> Iterator:
        """Yield a server stream's messages; a cancelled stream just ends (close() cancels them)."""
        self._streams.append(call)
        try:
            yield from call
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.CANCELLED:
                return
            raise Unreachable(
                f"talariad admin socket {self.socket_path}: {err.code().name.lower()}"
            ) from None
        finally:
            if call in self._streams:
                self._streams.remove(call)

    def watch_rounds(
        self, instance: str = "", interval_s: float = 0.5
    ) -> Iterator[admin_pb2.RoundsReply]:
        call = self.stub.WatchRounds(
            admin_pb2.RoundsRequest(instance=instance, interval_s=interval_s)
        )
        yield from self._follow(call)

    def watch_router(
        self, interval_s: float, sessions: int = 200, decisions: int = 50
    ) -> Iterator[admin_pb2.RouterState]:
        call = self.stub.WatchRouter(
            admin_pb2.WatchRouterRequest(
                interval_s=interval_s, sessions=sessions, decisions=decisions
            )
        )
        yield from self._follow(call)

    def watch(self, interval_s: float) -> Iterator[admin_pb2.StatusReply]:
        call = self.stub.WatchStatus(admin_pb2.WatchRequest(interval_s=interval_s))
        yield from self._follow(call)

    def cancel_streams(self) -> None:
        """End every open watch (their iterators return)."""
        while self._streams:
            self._streams.pop().cancel()

    def close(self) -> None:
        self.cancel_streams()
        self.channel.close()


_INT64 = (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)


def as_dict(reply) -> dict:
    """The message as JSON-ready data: every field present, proto names, int64 as ints (not the
    strings proto3 JSON prints)."""
    data = MessageToDict(
        reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _int64_as_int(reply.DESCRIPTOR, data)
    return data


def _int64_as_int(desc, data: dict) -> None:
    for field in desc.fields:
        if field.name not in data:
            continue
        value = data[field.name]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            vfield = field.message_type.fields_by_name["value"]
            if vfield.cpp_type in _INT64:
                data[field.name] = {k: int(v) for k, v in value.items()}
            elif vfield.message_type is not None:
                for v in value.values():
                    _int64_as_int(vfield.message_type, v)
        elif field.message_type is not None:
            for item in value if isinstance(value, list) else [value]:
                _int64_as_int(field.message_type, item)
        elif field.cpp_type in _INT64:
            data[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)
