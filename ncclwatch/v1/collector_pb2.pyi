from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RankState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RANK_STATE_UNSPECIFIED: _ClassVar[RankState]
    RANK_STATE_UNKNOWN: _ClassVar[RankState]
    RANK_STATE_SAVING: _ClassVar[RankState]
    RANK_STATE_GATHERING_STATE_DICT: _ClassVar[RankState]
    RANK_STATE_LOADING: _ClassVar[RankState]
    RANK_STATE_COLLECTIVE: _ClassVar[RankState]
    RANK_STATE_DEVICE_WAIT: _ClassVar[RankState]
    RANK_STATE_COMPUTE: _ClassVar[RankState]
    RANK_STATE_DATALOADER: _ClassVar[RankState]
    RANK_STATE_IDLE: _ClassVar[RankState]

class CollectiveOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COLLECTIVE_OP_UNSPECIFIED: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_BARRIER: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_BROADCAST: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_ALL_REDUCE: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_ALL_GATHER: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_GATHER: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_SCATTER: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_REDUCE: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_REDUCE_SCATTER: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_ALL_TO_ALL: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_SEND: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_RECV: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_ALL_GATHER_OBJECT: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_GATHER_OBJECT: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_BROADCAST_OBJECT_LIST: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_SCATTER_OBJECT_LIST: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_MONITORED_BARRIER: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_WAIT: _ClassVar[CollectiveOp]

class WaitEvidence(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WAIT_EVIDENCE_UNSPECIFIED: _ClassVar[WaitEvidence]
    WAIT_EVIDENCE_PYTHON_FRAME: _ClassVar[WaitEvidence]
    WAIT_EVIDENCE_NATIVE_FRAME: _ClassVar[WaitEvidence]
    WAIT_EVIDENCE_FLIGHT_RECORDER: _ClassVar[WaitEvidence]
    WAIT_EVIDENCE_STILLNESS: _ClassVar[WaitEvidence]

class MemoryLimitKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMORY_LIMIT_KIND_UNSPECIFIED: _ClassVar[MemoryLimitKind]
    MEMORY_LIMIT_KIND_HOST: _ClassVar[MemoryLimitKind]
    MEMORY_LIMIT_KIND_CGROUP: _ClassVar[MemoryLimitKind]
    MEMORY_LIMIT_KIND_ADDRESS_SPACE: _ClassVar[MemoryLimitKind]
RANK_STATE_UNSPECIFIED: RankState
RANK_STATE_UNKNOWN: RankState
RANK_STATE_SAVING: RankState
RANK_STATE_GATHERING_STATE_DICT: RankState
RANK_STATE_LOADING: RankState
RANK_STATE_COLLECTIVE: RankState
RANK_STATE_DEVICE_WAIT: RankState
RANK_STATE_COMPUTE: RankState
RANK_STATE_DATALOADER: RankState
RANK_STATE_IDLE: RankState
COLLECTIVE_OP_UNSPECIFIED: CollectiveOp
COLLECTIVE_OP_BARRIER: CollectiveOp
COLLECTIVE_OP_BROADCAST: CollectiveOp
COLLECTIVE_OP_ALL_REDUCE: CollectiveOp
COLLECTIVE_OP_ALL_GATHER: CollectiveOp
COLLECTIVE_OP_GATHER: CollectiveOp
COLLECTIVE_OP_SCATTER: CollectiveOp
COLLECTIVE_OP_REDUCE: CollectiveOp
COLLECTIVE_OP_REDUCE_SCATTER: CollectiveOp
COLLECTIVE_OP_ALL_TO_ALL: CollectiveOp
COLLECTIVE_OP_SEND: CollectiveOp
COLLECTIVE_OP_RECV: CollectiveOp
COLLECTIVE_OP_ALL_GATHER_OBJECT: CollectiveOp
COLLECTIVE_OP_GATHER_OBJECT: CollectiveOp
COLLECTIVE_OP_BROADCAST_OBJECT_LIST: CollectiveOp
COLLECTIVE_OP_SCATTER_OBJECT_LIST: CollectiveOp
COLLECTIVE_OP_MONITORED_BARRIER: CollectiveOp
COLLECTIVE_OP_WAIT: CollectiveOp
WAIT_EVIDENCE_UNSPECIFIED: WaitEvidence
WAIT_EVIDENCE_PYTHON_FRAME: WaitEvidence
WAIT_EVIDENCE_NATIVE_FRAME: WaitEvidence
WAIT_EVIDENCE_FLIGHT_RECORDER: WaitEvidence
WAIT_EVIDENCE_STILLNESS: WaitEvidence
MEMORY_LIMIT_KIND_UNSPECIFIED: MemoryLimitKind
MEMORY_LIMIT_KIND_HOST: MemoryLimitKind
MEMORY_LIMIT_KIND_CGROUP: MemoryLimitKind
MEMORY_LIMIT_KIND_ADDRESS_SPACE: MemoryLimitKind

class ReportRequest(_message.Message):
    __slots__ = ("protocol_version", "report")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    report: NodeReport
    def __init__(self, protocol_version: _Optional[int] = ..., report: _Optional[_Union[NodeReport, _Mapping]] = ...) -> None: ...

class NodeReport(_message.Message):
    __slots__ = ("node", "agent_id", "seq", "agent_monotonic_seconds", "agent_wall_seconds", "full_round", "stacks", "samples", "exited", "health", "interval_seconds", "briefs", "slots_reset", "changes", "timed_seq", "timed_round_trip_seconds", "queued_seconds")
    NODE_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    AGENT_MONOTONIC_SECONDS_FIELD_NUMBER: _ClassVar[int]
    AGENT_WALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FULL_ROUND_FIELD_NUMBER: _ClassVar[int]
    STACKS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BRIEFS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_RESET_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    TIMED_SEQ_FIELD_NUMBER: _ClassVar[int]
    TIMED_ROUND_TRIP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    node: str
    agent_id: str
    seq: int
    agent_monotonic_seconds: float
    agent_wall_seconds: float
    full_round: bool
    stacks: _containers.RepeatedCompositeFieldContainer[Stack]
    samples: _containers.RepeatedCompositeFieldContainer[RankSample]
    exited: _containers.RepeatedCompositeFieldContainer[RankIdentity]
    health: AgentHealth
    interval_seconds: float
    briefs: RankBriefs
    slots_reset: bool
    changes: _containers.RepeatedCompositeFieldContainer[RankChange]
    timed_seq: int
    timed_round_trip_seconds: float
    queued_seconds: float
    def __init__(self, node: _Optional[str] = ..., agent_id: _Optional[str] = ..., seq: _Optional[int] = ..., agent_monotonic_seconds: _Optional[float] = ..., agent_wall_seconds: _Optional[float] = ..., full_round: _Optional[bool] = ..., stacks: _Optional[_Iterable[_Union[Stack, _Mapping]]] = ..., samples: _Optional[_Iterable[_Union[RankSample, _Mapping]]] = ..., exited: _Optional[_Iterable[_Union[RankIdentity, _Mapping]]] = ..., health: _Optional[_Union[AgentHealth, _Mapping]] = ..., interval_seconds: _Optional[float] = ..., briefs: _Optional[_Union[RankBriefs, _Mapping]] = ..., slots_reset: _Optional[bool] = ..., changes: _Optional[_Iterable[_Union[RankChange, _Mapping]]] = ..., timed_seq: _Optional[int] = ..., timed_round_trip_seconds: _Optional[float] = ..., queued_seconds: _Optional[float] = ...) -> None: ...

class RankChange(_message.Message):
    __slots__ = ("slot", "state", "op", "state_seconds", "stack_age_seconds", "stack_id", "still_seconds", "cpu_utilization", "cpu_seconds", "evidence", "native_frame", "native_no_wait", "native_stack_id")
    SLOT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    STATE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STACK_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STACK_ID_FIELD_NUMBER: _ClassVar[int]
    STILL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CPU_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    NATIVE_FRAME_FIELD_NUMBER: _ClassVar[int]
    NATIVE_NO_WAIT_FIELD_NUMBER: _ClassVar[int]
    NATIVE_STACK_ID_FIELD_NUMBER: _ClassVar[int]
    slot: int
    state: RankState
    op: CollectiveOp
    state_seconds: float
    stack_age_seconds: float
    stack_id: str
    still_seconds: float
    cpu_utilization: float
    cpu_seconds: float
    evidence: WaitEvidence
    native_frame: str
    native_no_wait: bool
    native_stack_id: str
    def __init__(self, slot: _Optional[int] = ..., state: _Optional[_Union[RankState, str]] = ..., op: _Optional[_Union[CollectiveOp, str]] = ..., state_seconds: _Optional[float] = ..., stack_age_seconds: _Optional[float] = ..., stack_id: _Optional[str] = ..., still_seconds: _Optional[float] = ..., cpu_utilization: _Optional[float] = ..., cpu_seconds: _Optional[float] = ..., evidence: _Optional[_Union[WaitEvidence, str]] = ..., native_frame: _Optional[str] = ..., native_no_wait: _Optional[bool] = ..., native_stack_id: _Optional[str] = ...) -> None: ...

class RankBriefs(_message.Message):
    __slots__ = ("slot", "still_seconds", "cpu_utilization", "cpu_seconds")
    SLOT_FIELD_NUMBER: _ClassVar[int]
    STILL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CPU_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    slot: _containers.RepeatedScalarFieldContainer[int]
    still_seconds: _containers.RepeatedScalarFieldContainer[float]
    cpu_utilization: _containers.RepeatedScalarFieldContainer[float]
    cpu_seconds: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, slot: _Optional[_Iterable[int]] = ..., still_seconds: _Optional[_Iterable[float]] = ..., cpu_utilization: _Optional[_Iterable[float]] = ..., cpu_seconds: _Optional[_Iterable[float]] = ...) -> None: ...

class RankIdentity(_message.Message):
    __slots__ = ("job_id", "rank", "local_rank", "world_size", "pid", "rank_source", "rank_conflict", "container", "process_age_seconds", "start_ticks", "uid")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RANK_SOURCE_FIELD_NUMBER: _ClassVar[int]
    RANK_CONFLICT_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    PROCESS_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    START_TICKS_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    local_rank: int
    world_size: int
    pid: int
    rank_source: str
    rank_conflict: str
    container: ContainerInfo
    process_age_seconds: float
    start_ticks: int
    uid: int
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., local_rank: _Optional[int] = ..., world_size: _Optional[int] = ..., pid: _Optional[int] = ..., rank_source: _Optional[str] = ..., rank_conflict: _Optional[str] = ..., container: _Optional[_Union[ContainerInfo, _Mapping]] = ..., process_age_seconds: _Optional[float] = ..., start_ticks: _Optional[int] = ..., uid: _Optional[int] = ...) -> None: ...

class ContainerInfo(_message.Message):
    __slots__ = ("container_pid", "hostname", "container_id", "runtime", "pod_uid", "namespace", "pod", "declared_namespace", "declared_pod")
    CONTAINER_PID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    DECLARED_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    DECLARED_POD_FIELD_NUMBER: _ClassVar[int]
    container_pid: int
    hostname: str
    container_id: str
    runtime: str
    pod_uid: str
    namespace: str
    pod: str
    declared_namespace: str
    declared_pod: str
    def __init__(self, container_pid: _Optional[int] = ..., hostname: _Optional[str] = ..., container_id: _Optional[str] = ..., runtime: _Optional[str] = ..., pod_uid: _Optional[str] = ..., namespace: _Optional[str] = ..., pod: _Optional[str] = ..., declared_namespace: _Optional[str] = ..., declared_pod: _Optional[str] = ...) -> None: ...

class RankSample(_message.Message):
    __slots__ = ("identity", "state", "op", "state_seconds", "stack_age_seconds", "stack_id", "process", "gpu", "job", "flight_recorder", "still_seconds", "slot", "evidence", "native_frame", "native_no_wait", "native_stack_id", "blocked_in")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    STATE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STACK_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STACK_ID_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    FLIGHT_RECORDER_FIELD_NUMBER: _ClassVar[int]
    STILL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    NATIVE_FRAME_FIELD_NUMBER: _ClassVar[int]
    NATIVE_NO_WAIT_FIELD_NUMBER: _ClassVar[int]
    NATIVE_STACK_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_IN_FIELD_NUMBER: _ClassVar[int]
    identity: RankIdentity
    state: RankState
    op: CollectiveOp
    state_seconds: float
    stack_age_seconds: float
    stack_id: str
    process: ProcessStats
    gpu: _containers.RepeatedCompositeFieldContainer[GpuMemory]
    job: JobInfo
    flight_recorder: FlightRecorderSummary
    still_seconds: float
    slot: int
    evidence: WaitEvidence
    native_frame: str
    native_no_wait: bool
    native_stack_id: str
    blocked_in: str
    def __init__(self, identity: _Optional[_Union[RankIdentity, _Mapping]] = ..., state: _Optional[_Union[RankState, str]] = ..., op: _Optional[_Union[CollectiveOp, str]] = ..., state_seconds: _Optional[float] = ..., stack_age_seconds: _Optional[float] = ..., stack_id: _Optional[str] = ..., process: _Optional[_Union[ProcessStats, _Mapping]] = ..., gpu: _Optional[_Iterable[_Union[GpuMemory, _Mapping]]] = ..., job: _Optional[_Union[JobInfo, _Mapping]] = ..., flight_recorder: _Optional[_Union[FlightRecorderSummary, _Mapping]] = ..., still_seconds: _Optional[float] = ..., slot: _Optional[int] = ..., evidence: _Optional[_Union[WaitEvidence, str]] = ..., native_frame: _Optional[str] = ..., native_no_wait: _Optional[bool] = ..., native_stack_id: _Optional[str] = ..., blocked_in: _Optional[str] = ...) -> None: ...

class FlightRecorderSummary(_message.Message):
    __slots__ = ("dump_age_seconds", "version", "groups")
    DUMP_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    dump_age_seconds: float
    version: str
    groups: _containers.RepeatedCompositeFieldContainer[ProcessGroupProgress]
    def __init__(self, dump_age_seconds: _Optional[float] = ..., version: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[ProcessGroupProgress, _Mapping]]] = ...) -> None: ...

class ProcessGroupProgress(_message.Message):
    __slots__ = ("pg_id", "pg_name", "ranks", "last_enqueued", "last_started", "last_completed", "pending_op", "pending_seq", "pending_timeout_ms", "pending_seconds", "pg_desc", "last_op")
    PG_ID_FIELD_NUMBER: _ClassVar[int]
    PG_NAME_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    LAST_ENQUEUED_FIELD_NUMBER: _ClassVar[int]
    LAST_STARTED_FIELD_NUMBER: _ClassVar[int]
    LAST_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    PENDING_OP_FIELD_NUMBER: _ClassVar[int]
    PENDING_SEQ_FIELD_NUMBER: _ClassVar[int]
    PENDING_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PENDING_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PG_DESC_FIELD_NUMBER: _ClassVar[int]
    LAST_OP_FIELD_NUMBER: _ClassVar[int]
    pg_id: str
    pg_name: str
    ranks: _containers.RepeatedScalarFieldContainer[int]
    last_enqueued: int
    last_started: int
    last_completed: int
    pending_op: str
    pending_seq: int
    pending_timeout_ms: int
    pending_seconds: float
    pg_desc: str
    last_op: str
    def __init__(self, pg_id: _Optional[str] = ..., pg_name: _Optional[str] = ..., ranks: _Optional[_Iterable[int]] = ..., last_enqueued: _Optional[int] = ..., last_started: _Optional[int] = ..., last_completed: _Optional[int] = ..., pending_op: _Optional[str] = ..., pending_seq: _Optional[int] = ..., pending_timeout_ms: _Optional[int] = ..., pending_seconds: _Optional[float] = ..., pg_desc: _Optional[str] = ..., last_op: _Optional[str] = ...) -> None: ...

class ProcessStats(_message.Message):
    __slots__ = ("cpu_seconds", "cpu_utilization", "rss_bytes", "io_read_bytes", "io_write_bytes", "num_threads", "files_writing", "vms_bytes", "memory_limits")
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CPU_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    IO_READ_BYTES_FIELD_NUMBER: _ClassVar[int]
    IO_WRITE_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_THREADS_FIELD_NUMBER: _ClassVar[int]
    FILES_WRITING_FIELD_NUMBER: _ClassVar[int]
    VMS_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMITS_FIELD_NUMBER: _ClassVar[int]
    cpu_seconds: float
    cpu_utilization: float
    rss_bytes: int
    io_read_bytes: int
    io_write_bytes: int
    num_threads: int
    files_writing: _containers.RepeatedCompositeFieldContainer[OpenFile]
    vms_bytes: int
    memory_limits: _containers.RepeatedCompositeFieldContainer[MemoryLimit]
    def __init__(self, cpu_seconds: _Optional[float] = ..., cpu_utilization: _Optional[float] = ..., rss_bytes: _Optional[int] = ..., io_read_bytes: _Optional[int] = ..., io_write_bytes: _Optional[int] = ..., num_threads: _Optional[int] = ..., files_writing: _Optional[_Iterable[_Union[OpenFile, _Mapping]]] = ..., vms_bytes: _Optional[int] = ..., memory_limits: _Optional[_Iterable[_Union[MemoryLimit, _Mapping]]] = ...) -> None: ...

class OpenFile(_message.Message):
    __slots__ = ("path", "size_bytes", "previous_path", "previous_size_bytes", "expected_size_bytes", "expected_source", "copy_source_path", "header_error")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_PATH_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SOURCE_FIELD_NUMBER: _ClassVar[int]
    COPY_SOURCE_PATH_FIELD_NUMBER: _ClassVar[int]
    HEADER_ERROR_FIELD_NUMBER: _ClassVar[int]
    path: str
    size_bytes: int
    previous_path: str
    previous_size_bytes: int
    expected_size_bytes: int
    expected_source: str
    copy_source_path: str
    header_error: str
    def __init__(self, path: _Optional[str] = ..., size_bytes: _Optional[int] = ..., previous_path: _Optional[str] = ..., previous_size_bytes: _Optional[int] = ..., expected_size_bytes: _Optional[int] = ..., expected_source: _Optional[str] = ..., copy_source_path: _Optional[str] = ..., header_error: _Optional[str] = ...) -> None: ...

class MemoryLimit(_message.Message):
    __slots__ = ("kind", "used_bytes", "limit_bytes")
    KIND_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    kind: MemoryLimitKind
    used_bytes: int
    limit_bytes: int
    def __init__(self, kind: _Optional[_Union[MemoryLimitKind, str]] = ..., used_bytes: _Optional[int] = ..., limit_bytes: _Optional[int] = ...) -> None: ...

class GpuMemory(_message.Message):
    __slots__ = ("device_index", "device_uuid", "used_bytes", "device_total_bytes", "device_used_bytes", "device_util_percent", "device_power_watts", "device_power_limit_watts")
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UTIL_PERCENT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_POWER_WATTS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_POWER_LIMIT_WATTS_FIELD_NUMBER: _ClassVar[int]
    device_index: int
    device_uuid: str
    used_bytes: int
    device_total_bytes: int
    device_used_bytes: int
    device_util_percent: int
    device_power_watts: float
    device_power_limit_watts: float
    def __init__(self, device_index: _Optional[int] = ..., device_uuid: _Optional[str] = ..., used_bytes: _Optional[int] = ..., device_total_bytes: _Optional[int] = ..., device_used_bytes: _Optional[int] = ..., device_util_percent: _Optional[int] = ..., device_power_watts: _Optional[float] = ..., device_power_limit_watts: _Optional[float] = ...) -> None: ...

class JobInfo(_message.Message):
    __slots__ = ("source", "env", "watchdog_timeout_seconds", "watchdog_timeout_source", "scheduler_job", "packages")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    WATCHDOG_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WATCHDOG_TIMEOUT_SOURCE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_JOB_FIELD_NUMBER: _ClassVar[int]
    PACKAGES_FIELD_NUMBER: _ClassVar[int]
    source: str
    env: _containers.ScalarMap[str, str]
    watchdog_timeout_seconds: float
    watchdog_timeout_source: str
    scheduler_job: SchedulerJob
    packages: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, source: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., watchdog_timeout_seconds: _Optional[float] = ..., watchdog_timeout_source: _Optional[str] = ..., scheduler_job: _Optional[_Union[SchedulerJob, _Mapping]] = ..., packages: _Optional[_Iterable[str]] = ...) -> None: ...

class SchedulerJob(_message.Message):
    __slots__ = ("scheduler", "job_id", "job_name", "user", "source")
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    scheduler: str
    job_id: str
    job_name: str
    user: str
    source: str
    def __init__(self, scheduler: _Optional[str] = ..., job_id: _Optional[str] = ..., job_name: _Optional[str] = ..., user: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...

class Stack(_message.Message):
    __slots__ = ("id", "frames", "thread_name")
    ID_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    THREAD_NAME_FIELD_NUMBER: _ClassVar[int]
    id: str
    frames: _containers.RepeatedCompositeFieldContainer[Frame]
    thread_name: str
    def __init__(self, id: _Optional[str] = ..., frames: _Optional[_Iterable[_Union[Frame, _Mapping]]] = ..., thread_name: _Optional[str] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("name", "filename", "line")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    name: str
    filename: str
    line: int
    def __init__(self, name: _Optional[str] = ..., filename: _Optional[str] = ..., line: _Optional[int] = ...) -> None: ...

class AgentHealth(_message.Message):
    __slots__ = ("version", "ranks_watched", "nvml_up", "pyspy_runs_total", "pyspy_failures_total", "pyspy_seconds_total", "reports_dropped_total", "queue_length", "cpu_seconds_total", "gpus_expected", "fields_dropped_total", "texts_escaped_total", "texts_truncated_total", "native_dumps_total", "native_dump_failures_total", "native_dump_seconds_total", "native_dump_bucket_counts", "pause_budget_seconds_per_hour", "native_dumps_refused_total", "ranks_pause_budget_spent", "stacks_trimmed_total", "flight_recorder_trimmed_total", "reports_refused_total", "rank_budget_hits", "parts_left_out")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RANKS_WATCHED_FIELD_NUMBER: _ClassVar[int]
    NVML_UP_FIELD_NUMBER: _ClassVar[int]
    PYSPY_RUNS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PYSPY_FAILURES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PYSPY_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    REPORTS_DROPPED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    QUEUE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    GPUS_EXPECTED_FIELD_NUMBER: _ClassVar[int]
    FIELDS_DROPPED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TEXTS_ESCAPED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TEXTS_TRUNCATED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NATIVE_DUMPS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NATIVE_DUMP_FAILURES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NATIVE_DUMP_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NATIVE_DUMP_BUCKET_COUNTS_FIELD_NUMBER: _ClassVar[int]
    PAUSE_BUDGET_SECONDS_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    NATIVE_DUMPS_REFUSED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RANKS_PAUSE_BUDGET_SPENT_FIELD_NUMBER: _ClassVar[int]
    STACKS_TRIMMED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    FLIGHT_RECORDER_TRIMMED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    REPORTS_REFUSED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RANK_BUDGET_HITS_FIELD_NUMBER: _ClassVar[int]
    PARTS_LEFT_OUT_FIELD_NUMBER: _ClassVar[int]
    version: str
    ranks_watched: int
    nvml_up: bool
    pyspy_runs_total: int
    pyspy_failures_total: int
    pyspy_seconds_total: float
    reports_dropped_total: int
    queue_length: int
    cpu_seconds_total: float
    gpus_expected: int
    fields_dropped_total: int
    texts_escaped_total: int
    texts_truncated_total: int
    native_dumps_total: int
    native_dump_failures_total: int
    native_dump_seconds_total: float
    native_dump_bucket_counts: _containers.RepeatedScalarFieldContainer[int]
    pause_budget_seconds_per_hour: float
    native_dumps_refused_total: int
    ranks_pause_budget_spent: int
    stacks_trimmed_total: int
    flight_recorder_trimmed_total: int
    reports_refused_total: int
    rank_budget_hits: _containers.RepeatedScalarFieldContainer[int]
    parts_left_out: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, version: _Optional[str] = ..., ranks_watched: _Optional[int] = ..., nvml_up: _Optional[bool] = ..., pyspy_runs_total: _Optional[int] = ..., pyspy_failures_total: _Optional[int] = ..., pyspy_seconds_total: _Optional[float] = ..., reports_dropped_total: _Optional[int] = ..., queue_length: _Optional[int] = ..., cpu_seconds_total: _Optional[float] = ..., gpus_expected: _Optional[int] = ..., fields_dropped_total: _Optional[int] = ..., texts_escaped_total: _Optional[int] = ..., texts_truncated_total: _Optional[int] = ..., native_dumps_total: _Optional[int] = ..., native_dump_failures_total: _Optional[int] = ..., native_dump_seconds_total: _Optional[float] = ..., native_dump_bucket_counts: _Optional[_Iterable[int]] = ..., pause_budget_seconds_per_hour: _Optional[float] = ..., native_dumps_refused_total: _Optional[int] = ..., ranks_pause_budget_spent: _Optional[int] = ..., stacks_trimmed_total: _Optional[int] = ..., flight_recorder_trimmed_total: _Optional[int] = ..., reports_refused_total: _Optional[int] = ..., rank_budget_hits: _Optional[_Iterable[int]] = ..., parts_left_out: _Optional[_Iterable[int]] = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ("ack_seq", "missing_stack_ids", "commands", "rejected_jobs", "resync", "dropped_parts")
    ACK_SEQ_FIELD_NUMBER: _ClassVar[int]
    MISSING_STACK_IDS_FIELD_NUMBER: _ClassVar[int]
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    REJECTED_JOBS_FIELD_NUMBER: _ClassVar[int]
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    DROPPED_PARTS_FIELD_NUMBER: _ClassVar[int]
    ack_seq: int
    missing_stack_ids: _containers.RepeatedScalarFieldContainer[str]
    commands: _containers.RepeatedCompositeFieldContainer[Command]
    rejected_jobs: _containers.RepeatedCompositeFieldContainer[JobRejection]
    resync: bool
    dropped_parts: _containers.RepeatedCompositeFieldContainer[DroppedPart]
    def __init__(self, ack_seq: _Optional[int] = ..., missing_stack_ids: _Optional[_Iterable[str]] = ..., commands: _Optional[_Iterable[_Union[Command, _Mapping]]] = ..., rejected_jobs: _Optional[_Iterable[_Union[JobRejection, _Mapping]]] = ..., resync: _Optional[bool] = ..., dropped_parts: _Optional[_Iterable[_Union[DroppedPart, _Mapping]]] = ...) -> None: ...

class DroppedPart(_message.Message):
    __slots__ = ("what", "stack_id", "job_id", "rank", "bound", "reason")
    WHAT_FIELD_NUMBER: _ClassVar[int]
    STACK_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    what: str
    stack_id: str
    job_id: str
    rank: int
    bound: str
    reason: str
    def __init__(self, what: _Optional[str] = ..., stack_id: _Optional[str] = ..., job_id: _Optional[str] = ..., rank: _Optional[int] = ..., bound: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class JobRejection(_message.Message):
    __slots__ = ("job_id", "code", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    code: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., code: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("dump_stacks", "dump_flight_recorder")
    DUMP_STACKS_FIELD_NUMBER: _ClassVar[int]
    DUMP_FLIGHT_RECORDER_FIELD_NUMBER: _ClassVar[int]
    dump_stacks: DumpStacksCommand
    dump_flight_recorder: DumpFlightRecorderCommand
    def __init__(self, dump_stacks: _Optional[_Union[DumpStacksCommand, _Mapping]] = ..., dump_flight_recorder: _Optional[_Union[DumpFlightRecorderCommand, _Mapping]] = ...) -> None: ...

class DumpFlightRecorderCommand(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class DumpStacksCommand(_message.Message):
    __slots__ = ("job_id", "reason", "native")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    NATIVE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    native: bool
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ..., native: _Optional[bool] = ...) -> None: ...

class DumpStacksRequest(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class DumpStacksResponse(_message.Message):
    __slots__ = ("agents",)
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    agents: int
    def __init__(self, agents: _Optional[int] = ...) -> None: ...
