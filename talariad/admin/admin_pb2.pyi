from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("interval_s",)
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    interval_s: float
    def __init__(self, interval_s: _Optional[float] = ...) -> None: ...

class InstanceStatus(_message.Message):
    __slots__ = ("name", "pool", "executor", "devices", "models", "active_model", "loaded_models", "state", "healthy", "pid", "restarts", "running", "queued", "switches", "telemetry_age_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_MODEL_FIELD_NUMBER: _ClassVar[int]
    LOADED_MODELS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    SWITCHES_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_AGE_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    pool: str
    executor: str
    devices: str
    models: _containers.RepeatedScalarFieldContainer[str]
    active_model: str
    loaded_models: _containers.RepeatedScalarFieldContainer[str]
    state: str
    healthy: bool
    pid: int
    restarts: int
    running: int
    queued: int
    switches: int
    telemetry_age_s: float
    def __init__(self, name: _Optional[str] = ..., pool: _Optional[str] = ..., executor: _Optional[str] = ..., devices: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ..., active_model: _Optional[str] = ..., loaded_models: _Optional[_Iterable[str]] = ..., state: _Optional[str] = ..., healthy: _Optional[bool] = ..., pid: _Optional[int] = ..., restarts: _Optional[int] = ..., running: _Optional[int] = ..., queued: _Optional[int] = ..., switches: _Optional[int] = ..., telemetry_age_s: _Optional[float] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("version", "uptime_s", "http_endpoint", "instances")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    HTTP_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    version: str
    uptime_s: float
    http_endpoint: str
    instances: _containers.RepeatedCompositeFieldContainer[InstanceStatus]
    def __init__(self, version: _Optional[str] = ..., uptime_s: _Optional[float] = ..., http_endpoint: _Optional[str] = ..., instances: _Optional[_Iterable[_Union[InstanceStatus, _Mapping]]] = ...) -> None: ...
