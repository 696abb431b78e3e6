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
    __slots__ = ("name", "pool", "executor", "devices", "models", "active_model", "loaded_models", "state", "healthy", "pid", "restarts", "running", "queued", "switches", "telemetry_age_s", "admission", "rotation", "configured_pool", "retired")
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
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    ROTATION_FIELD_NUMBER: _ClassVar[int]
    CONFIGURED_POOL_FIELD_NUMBER: _ClassVar[int]
    RETIRED_FIELD_NUMBER: _ClassVar[int]
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
    admission: str
    rotation: _containers.RepeatedScalarFieldContainer[str]
    configured_pool: str
    retired: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., pool: _Optional[str] = ..., executor: _Optional[str] = ..., devices: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ..., active_model: _Optional[str] = ..., loaded_models: _Optional[_Iterable[str]] = ..., state: _Optional[str] = ..., healthy: _Optional[bool] = ..., pid: _Optional[int] = ..., restarts: _Optional[int] = ..., running: _Optional[int] = ..., queued: _Optional[int] = ..., switches: _Optional[int] = ..., telemetry_age_s: _Optional[float] = ..., admission: _Optional[str] = ..., rotation: _Optional[_Iterable[str]] = ..., configured_pool: _Optional[str] = ..., retired: _Optional[_Iterable[str]] = ...) -> None: ...

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
    __slots__ = ("instance", "queue_s", "prefill_s", "decode_s", "kv_recovery_s", "activation_s", "total_s", "feasible", "reason", "kv_state", "needs_replica", "replica_s", "contention_s")
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
    REPLICA_S_FIELD_NUMBER: _ClassVar[int]
    CONTENTION_S_FIELD_NUMBER: _ClassVar[int]
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
    replica_s: float
    contention_s: float
    def __init__(self, instance: _Optional[str] = ..., queue_s: _Optional[float] = ..., prefill_s: _Optional[float] = ..., decode_s: _Optional[float] = ..., kv_recovery_s: _Optional[float] = ..., activation_s: _Optional[float] = ..., total_s: _Optional[float] = ..., feasible: _Optional[bool] = ..., reason: _Optional[str] = ..., kv_state: _Optional[str] = ..., needs_replica: _Optional[bool] = ..., replica_s: _Optional[float] = ..., contention_s: _Optional[float] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("call_id", "kind", "instance", "policy", "reason", "age_s", "retry_after_s", "candidates", "session_id")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    kind: str
    instance: str
    policy: str
    reason: str
    age_s: float
    retry_after_s: float
    candidates: _containers.RepeatedCompositeFieldContainer[Candidate]
    session_id: str
    def __init__(self, call_id: _Optional[str] = ..., kind: _Optional[str] = ..., instance: _Optional[str] = ..., policy: _Optional[str] = ..., reason: _Optional[str] = ..., age_s: _Optional[float] = ..., retry_after_s: _Optional[float] = ..., candidates: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ..., session_id: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("instance", "managed", "active_model", "capacity_bytes", "hbm_free_bytes", "staging_slack_bytes", "layout", "switches", "host_kv_bytes", "host_kv_capacity_bytes", "host_kv_by_model", "process")
    class HostKvByModelEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    MANAGED_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_MODEL_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    HBM_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STAGING_SLACK_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    SWITCHES_FIELD_NUMBER: _ClassVar[int]
    HOST_KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOST_KV_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOST_KV_BY_MODEL_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    instance: str
    managed: bool
    active_model: str
    capacity_bytes: int
    hbm_free_bytes: int
    staging_slack_bytes: int
    layout: _containers.RepeatedCompositeFieldContainer[Region]
    switches: _containers.RepeatedCompositeFieldContainer[SwitchTiming]
    host_kv_bytes: int
    host_kv_capacity_bytes: int
    host_kv_by_model: _containers.ScalarMap[str, int]
    process: ProcessStats
    def __init__(self, instance: _Optional[str] = ..., managed: _Optional[bool] = ..., active_model: _Optional[str] = ..., capacity_bytes: _Optional[int] = ..., hbm_free_bytes: _Optional[int] = ..., staging_slack_bytes: _Optional[int] = ..., layout: _Optional[_Iterable[_Union[Region, _Mapping]]] = ..., switches: _Optional[_Iterable[_Union[SwitchTiming, _Mapping]]] = ..., host_kv_bytes: _Optional[int] = ..., host_kv_capacity_bytes: _Optional[int] = ..., host_kv_by_model: _Optional[_Mapping[str, int]] = ..., process: _Optional[_Union[ProcessStats, _Mapping]] = ...) -> None: ...

class ProcessStats(_message.Message):
    __slots__ = ("pid", "rss_bytes", "open_files", "asyncio_tasks", "gc_objects")
    PID_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    OPEN_FILES_FIELD_NUMBER: _ClassVar[int]
    ASYNCIO_TASKS_FIELD_NUMBER: _ClassVar[int]
    GC_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    rss_bytes: int
    open_files: int
    asyncio_tasks: int
    gc_objects: int
    def __init__(self, pid: _Optional[int] = ..., rss_bytes: _Optional[int] = ..., open_files: _Optional[int] = ..., asyncio_tasks: _Optional[int] = ..., gc_objects: _Optional[int] = ...) -> None: ...

class InstanceRequest(_message.Message):
    __slots__ = ("instance", "force")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    instance: str
    force: bool
    def __init__(self, instance: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class MoveRequest(_message.Message):
    __slots__ = ("instance", "to", "model", "force")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    instance: str
    to: str
    model: str
    force: bool
    def __init__(self, instance: _Optional[str] = ..., to: _Optional[str] = ..., model: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class ModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelStatus(_message.Message):
    __slots__ = ("name", "instances", "pinned_on", "status", "max_context", "profile")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    PINNED_ON_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    name: str
    instances: _containers.RepeatedScalarFieldContainer[str]
    pinned_on: _containers.RepeatedScalarFieldContainer[str]
    status: str
    max_context: int
    profile: str
    def __init__(self, name: _Optional[str] = ..., instances: _Optional[_Iterable[str]] = ..., pinned_on: _Optional[_Iterable[str]] = ..., status: _Optional[str] = ..., max_context: _Optional[int] = ..., profile: _Optional[str] = ...) -> None: ...

class ModelsReply(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelStatus]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelStatus, _Mapping]]] = ...) -> None: ...

class ModelRequest(_message.Message):
    __slots__ = ("model", "instance", "force")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    model: str
    instance: str
    force: bool
    def __init__(self, model: _Optional[str] = ..., instance: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class PoolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Pool(_message.Message):
    __slots__ = ("name", "instances", "models", "running", "queued")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    name: str
    instances: _containers.RepeatedScalarFieldContainer[str]
    models: _containers.RepeatedScalarFieldContainer[str]
    running: int
    queued: int
    def __init__(self, name: _Optional[str] = ..., instances: _Optional[_Iterable[str]] = ..., models: _Optional[_Iterable[str]] = ..., running: _Optional[int] = ..., queued: _Optional[int] = ...) -> None: ...

class PoolsReply(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[Pool]
    def __init__(self, pools: _Optional[_Iterable[_Union[Pool, _Mapping]]] = ...) -> None: ...

class PlanRequest(_message.Message):
    __slots__ = ("apply",)
    APPLY_FIELD_NUMBER: _ClassVar[int]
    apply: bool
    def __init__(self, apply: _Optional[bool] = ...) -> None: ...

class PlanMove(_message.Message):
    __slots__ = ("instance", "before", "after", "drain_s", "load_s", "kv_s", "during_s", "cost_s")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    DRAIN_S_FIELD_NUMBER: _ClassVar[int]
    LOAD_S_FIELD_NUMBER: _ClassVar[int]
    KV_S_FIELD_NUMBER: _ClassVar[int]
    DURING_S_FIELD_NUMBER: _ClassVar[int]
    COST_S_FIELD_NUMBER: _ClassVar[int]
    instance: str
    before: str
    after: str
    drain_s: float
    load_s: float
    kv_s: float
    during_s: float
    cost_s: float
    def __init__(self, instance: _Optional[str] = ..., before: _Optional[str] = ..., after: _Optional[str] = ..., drain_s: _Optional[float] = ..., load_s: _Optional[float] = ..., kv_s: _Optional[float] = ..., during_s: _Optional[float] = ..., cost_s: _Optional[float] = ...) -> None: ...

class PlanEvent(_message.Message):
    __slots__ = ("age_s", "move", "by", "outcome", "took_s", "why")
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    MOVE_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    TOOK_S_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    age_s: float
    move: PlanMove
    by: str
    outcome: str
    took_s: float
    why: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, age_s: _Optional[float] = ..., move: _Optional[_Union[PlanMove, _Mapping]] = ..., by: _Optional[str] = ..., outcome: _Optional[str] = ..., took_s: _Optional[float] = ..., why: _Optional[_Iterable[str]] = ...) -> None: ...

class PlanReply(_message.Message):
    __slots__ = ("mode", "assignment", "has_move", "move", "delay_now_s", "delay_after_s", "gain_s", "reasons", "applied", "moving", "history", "age_s")
    MODE_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    HAS_MOVE_FIELD_NUMBER: _ClassVar[int]
    MOVE_FIELD_NUMBER: _ClassVar[int]
    DELAY_NOW_S_FIELD_NUMBER: _ClassVar[int]
    DELAY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    GAIN_S_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    MOVING_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    mode: str
    assignment: _containers.RepeatedScalarFieldContainer[str]
    has_move: bool
    move: PlanMove
    delay_now_s: float
    delay_after_s: float
    gain_s: float
    reasons: _containers.RepeatedScalarFieldContainer[str]
    applied: bool
    moving: str
    history: _containers.RepeatedCompositeFieldContainer[PlanEvent]
    age_s: float
    def __init__(self, mode: _Optional[str] = ..., assignment: _Optional[_Iterable[str]] = ..., has_move: _Optional[bool] = ..., move: _Optional[_Union[PlanMove, _Mapping]] = ..., delay_now_s: _Optional[float] = ..., delay_after_s: _Optional[float] = ..., gain_s: _Optional[float] = ..., reasons: _Optional[_Iterable[str]] = ..., applied: _Optional[bool] = ..., moving: _Optional[str] = ..., history: _Optional[_Iterable[_Union[PlanEvent, _Mapping]]] = ..., age_s: _Optional[float] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("session_id", "model")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    model: str
    def __init__(self, session_id: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ForgetReply(_message.Message):
    __slots__ = ("session_id", "known", "leases_dropped", "instances_freed")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    LEASES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FREED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    known: bool
    leases_dropped: int
    instances_freed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., known: _Optional[bool] = ..., leases_dropped: _Optional[int] = ..., instances_freed: _Optional[_Iterable[str]] = ...) -> None: ...

class ReloadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReloadReply(_message.Message):
    __slots__ = ("applied", "needs_restart")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    NEEDS_RESTART_FIELD_NUMBER: _ClassVar[int]
    applied: _containers.RepeatedScalarFieldContainer[str]
    needs_restart: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, applied: _Optional[_Iterable[str]] = ..., needs_restart: _Optional[_Iterable[str]] = ...) -> None: ...

class ConfigRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ConfigReply(_message.Message):
    __slots__ = ("path", "yaml")
    PATH_FIELD_NUMBER: _ClassVar[int]
    YAML_FIELD_NUMBER: _ClassVar[int]
    path: str
    yaml: str
    def __init__(self, path: _Optional[str] = ..., yaml: _Optional[str] = ...) -> None: ...

class RoundsRequest(_message.Message):
    __slots__ = ("instance", "limit", "interval_s")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    instance: str
    limit: int
    interval_s: float
    def __init__(self, instance: _Optional[str] = ..., limit: _Optional[int] = ..., interval_s: _Optional[float] = ...) -> None: ...

class SlotPhase(_message.Message):
    __slots__ = ("phase", "seconds")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    phase: str
    seconds: float
    def __init__(self, phase: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...

class Slot(_message.Message):
    __slots__ = ("model", "phases", "sp_admitted", "sp_parked")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    SP_ADMITTED_FIELD_NUMBER: _ClassVar[int]
    SP_PARKED_FIELD_NUMBER: _ClassVar[int]
    model: str
    phases: _containers.RepeatedCompositeFieldContainer[SlotPhase]
    sp_admitted: int
    sp_parked: int
    def __init__(self, model: _Optional[str] = ..., phases: _Optional[_Iterable[_Union[SlotPhase, _Mapping]]] = ..., sp_admitted: _Optional[int] = ..., sp_parked: _Optional[int] = ...) -> None: ...

class SwitchPhase(_message.Message):
    __slots__ = ("name", "ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    ms: float
    def __init__(self, name: _Optional[str] = ..., ms: _Optional[float] = ...) -> None: ...

class SwitchRecord(_message.Message):
    __slots__ = ("instance", "round_index", "from_model", "to_model", "path", "total_ms", "phases", "staged_bytes", "dirty_bytes", "age_s")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    ROUND_INDEX_FIELD_NUMBER: _ClassVar[int]
    FROM_MODEL_FIELD_NUMBER: _ClassVar[int]
    TO_MODEL_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    STAGED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DIRTY_BYTES_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    instance: str
    round_index: int
    from_model: str
    to_model: str
    path: str
    total_ms: float
    phases: _containers.RepeatedCompositeFieldContainer[SwitchPhase]
    staged_bytes: int
    dirty_bytes: int
    age_s: float
    def __init__(self, instance: _Optional[str] = ..., round_index: _Optional[int] = ..., from_model: _Optional[str] = ..., to_model: _Optional[str] = ..., path: _Optional[str] = ..., total_ms: _Optional[float] = ..., phases: _Optional[_Iterable[_Union[SwitchPhase, _Mapping]]] = ..., staged_bytes: _Optional[int] = ..., dirty_bytes: _Optional[int] = ..., age_s: _Optional[float] = ...) -> None: ...

class RoundRecord(_message.Message):
    __slots__ = ("instance", "index", "wall_s", "active_s", "switch_s", "predicted_s", "slots", "sp_admitted", "sp_parked", "switches", "open", "age_s")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    WALL_S_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_S_FIELD_NUMBER: _ClassVar[int]
    SWITCH_S_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_S_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    SP_ADMITTED_FIELD_NUMBER: _ClassVar[int]
    SP_PARKED_FIELD_NUMBER: _ClassVar[int]
    SWITCHES_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    instance: str
    index: int
    wall_s: float
    active_s: float
    switch_s: float
    predicted_s: float
    slots: _containers.RepeatedCompositeFieldContainer[Slot]
    sp_admitted: int
    sp_parked: int
    switches: int
    open: bool
    age_s: float
    def __init__(self, instance: _Optional[str] = ..., index: _Optional[int] = ..., wall_s: _Optional[float] = ..., active_s: _Optional[float] = ..., switch_s: _Optional[float] = ..., predicted_s: _Optional[float] = ..., slots: _Optional[_Iterable[_Union[Slot, _Mapping]]] = ..., sp_admitted: _Optional[int] = ..., sp_parked: _Optional[int] = ..., switches: _Optional[int] = ..., open: _Optional[bool] = ..., age_s: _Optional[float] = ...) -> None: ...

class RoundsReply(_message.Message):
    __slots__ = ("rounds", "switches")
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    SWITCHES_FIELD_NUMBER: _ClassVar[int]
    rounds: _containers.RepeatedCompositeFieldContainer[RoundRecord]
    switches: _containers.RepeatedCompositeFieldContainer[SwitchRecord]
    def __init__(self, rounds: _Optional[_Iterable[_Union[RoundRecord, _Mapping]]] = ..., switches: _Optional[_Iterable[_Union[SwitchRecord, _Mapping]]] = ...) -> None: ...

class WatchRouterRequest(_message.Message):
    __slots__ = ("interval_s", "sessions", "decisions")
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    interval_s: float
    sessions: int
    decisions: int
    def __init__(self, interval_s: _Optional[float] = ..., sessions: _Optional[int] = ..., decisions: _Optional[int] = ...) -> None: ...

class RouterState(_message.Message):
    __slots__ = ("leases", "sessions", "decisions")
    LEASES_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    sessions: _containers.RepeatedCompositeFieldContainer[Session]
    decisions: _containers.RepeatedCompositeFieldContainer[Decision]
    def __init__(self, leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ..., sessions: _Optional[_Iterable[_Union[Session, _Mapping]]] = ..., decisions: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ...) -> None: ...
