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

class SessionsRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ("session_id", "instance", "model", "kv_len", "idle_s", "leased")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    KV_LEN_FIELD_NUMBER: _ClassVar[int]
    IDLE_S_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    instance: str
    model: str
    kv_len: int
    idle_s: float
    leased: bool
    def __init__(self, session_id: _Optional[str] = ..., instance: _Optional[str] = ..., model: _Optional[str] = ..., kv_len: _Optional[int] = ..., idle_s: _Optional[float] = ..., leased: _Optional[bool] = ...) -> None: ...

class SessionsReply(_message.Message):
    __slots__ = ("sessions",)
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[Session]
    def __init__(self, sessions: _Optional[_Iterable[_Union[Session, _Mapping]]] = ...) -> None: ...

class LeasesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Lease(_message.Message):
    __slots__ = ("session_id", "model", "instance", "kv_len", "expires_in_s")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    KV_LEN_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    model: str
    instance: str
    kv_len: int
    expires_in_s: float
    def __init__(self, session_id: _Optional[str] = ..., model: _Optional[str] = ..., instance: _Optional[str] = ..., kv_len: _Optional[int] = ..., expires_in_s: _Optional[float] = ...) -> None: ...

class LeasesReply(_message.Message):
    __slots__ = ("leases",)
    LEASES_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    def __init__(self, leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ...) -> None: ...

class ExplainRequest(_message.Message):
    __slots__ = ("call_id",)
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    def __init__(self, call_id: _Optional[str] = ...) -> None: ...

class Candidate(_message.Message):
    __slots__ = ("instance", "queue_s", "prefill_s", "decode_s", "kv_recovery_s", "activation_s", "total_s", "feasible", "reason", "kv_state", "needs_replica")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    PREFILL_S_FIELD_NUMBER: _ClassVar[int]
    DECODE_S_FIELD_NUMBER: _ClassVar[int]
    KV_RECOVERY_S_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    FEASIBLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    KV_STATE_FIELD_NUMBER: _ClassVar[int]
    NEEDS_REPLICA_FIELD_NUMBER: _ClassVar[int]
    instance: str
    queue_s: float
    prefill_s: float
    decode_s: float
    kv_recovery_s: float
    activation_s: float
    total_s: float
    feasible: bool
    reason: str
    kv_state: str
    needs_replica: bool
    def __init__(self, instance: _Optional[str] = ..., queue_s: _Optional[float] = ..., prefill_s: _Optional[float] = ..., decode_s: _Optional[float] = ..., kv_recovery_s: _Optional[float] = ..., activation_s: _Optional[float] = ..., total_s: _Optional[float] = ..., feasible: _Optional[bool] = ..., reason: _Optional[str] = ..., kv_state: _Optional[str] = ..., needs_replica: _Optional[bool] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("call_id", "kind", "instance", "policy", "reason", "age_s", "retry_after_s", "candidates")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    kind: str
    instance: str
    policy: str
    reason: str
    age_s: float
    retry_after_s: float
    candidates: _containers.RepeatedCompositeFieldContainer[Candidate]
    def __init__(self, call_id: _Optional[str] = ..., kind: _Optional[str] = ..., instance: _Optional[str] = ..., policy: _Optional[str] = ..., reason: _Optional[str] = ..., age_s: _Optional[float] = ..., retry_after_s: _Optional[float] = ..., candidates: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ...) -> None: ...

class DecisionsRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class DecisionsReply(_message.Message):
    __slots__ = ("decisions",)
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[Decision]
    def __init__(self, decisions: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ...) -> None: ...

class MemoryRequest(_message.Message):
    __slots__ = ("instance",)
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    instance: str
    def __init__(self, instance: _Optional[str] = ...) -> None: ...

class Region(_message.Message):
    __slots__ = ("region", "offset", "size", "owner")
    REGION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    region: str
    offset: int
    size: int
    owner: str
    def __init__(self, region: _Optional[str] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ..., owner: _Optional[str] = ...) -> None: ...

class SwitchTiming(_message.Message):
    __slots__ = ("from_model", "to_model", "path", "phase_ms", "total_ms", "staged_bytes", "dirty_bytes", "h2d_bytes", "d2d_gather_ms", "h2d_gather_ms")
    FROM_MODEL_FIELD_NUMBER: _ClassVar[int]
    TO_MODEL_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PHASE_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    STAGED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DIRTY_BYTES_FIELD_NUMBER: _ClassVar[int]
    H2D_BYTES_FIELD_NUMBER: _ClassVar[int]
    D2D_GATHER_MS_FIELD_NUMBER: _ClassVar[int]
    H2D_GATHER_MS_FIELD_NUMBER: _ClassVar[int]
    from_model: str
    to_model: str
    path: str
    phase_ms: _containers.RepeatedScalarFieldContainer[float]
    total_ms: float
    staged_bytes: int
    dirty_bytes: int
    h2d_bytes: int
    d2d_gather_ms: float
    h2d_gather_ms: float
    def __init__(self, from_model: _Optional[str] = ..., to_model: _Optional[str] = ..., path: _Optional[str] = ..., phase_ms: _Optional[_Iterable[float]] = ..., total_ms: _Optional[float] = ..., staged_bytes: _Optional[int] = ..., dirty_bytes: _Optional[int] = ..., h2d_bytes: _Optional[int] = ..., d2d_gather_ms: _Optional[float] = ..., h2d_gather_ms: _Optional[float] = ...) -> None: ...

class MemoryReply(_message.Message):
    __slots__ = ("instance", "managed", "active_model", "capacity_bytes", "hbm_free_bytes", "staging_slack_bytes", "layout", "switches")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    MANAGED_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_MODEL_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    HBM_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STAGING_SLACK_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    SWITCHES_FIELD_NUMBER: _ClassVar[int]
    instance: str
    managed: bool
    active_model: str
    capacity_bytes: int
    hbm_free_bytes: int
    staging_slack_bytes: int
    layout: _containers.RepeatedCompositeFieldContainer[Region]
    switches: _containers.RepeatedCompositeFieldContainer[SwitchTiming]
    def __init__(self, instance: _Optional[str] = ..., managed: _Optional[bool] = ..., active_model: _Optional[str] = ..., capacity_bytes: _Optional[int] = ..., hbm_free_bytes: _Optional[int] = ..., staging_slack_bytes: _Optional[int] = ..., layout: _Optional[_Iterable[_Union[Region, _Mapping]]] = ..., switches: _Optional[_Iterable[_Union[SwitchTiming, _Mapping]]] = ...) -> None: ...
