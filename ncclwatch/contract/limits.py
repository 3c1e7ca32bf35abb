"""The wire limits of a report: numbers every agent and daemon agree on.

Fixed numbers, not settings (those are ``contract.bounds``): the agent caps
what it sends under them and the daemon drops the part past one.
"""

from __future__ import annotations

from ncclwatch.contract.bounds import Bounds

#: 2: briefs for steady ranks; 1: full samples only (accepted for one release).
PROTOCOL_VERSIONS = frozenset({1, 2})
#: Samples (and briefs) and stacks of one report: past them the report is
#: refused whole (the transport's limit, the node's own fault).
MAX_SAMPLES = 4096
MAX_STACKS = 4096
MAX_STRING = 4096
MAX_JOB_ID = 128
MAX_WORLD_SIZE = 1 << 20
MAX_ENV = 256
MAX_FILES = 64
DEFAULT_BOUNDS = Bounds()
#: Frames of one stack under the default bounds (a setting: max_stack_frames).
MAX_FRAMES = DEFAULT_BOUNDS.max_stack_frames
MAX_ENV_NAME = 256
#: Seconds since boot no machine reaches (317 years): the daemon anchors ages
#: on the agent's clock (table.AgentRecord.clock_offset), so it must be one.
MAX_CLOCK = 1e10
MAX_NODE = 255
MAX_ID = 64            # agent ids, stack ids, rank and job sources, versions
MAX_CONTAINER = 253
MAX_PG_TEXT = 256
MAX_FR_VERSION = 32
MAX_HEADER_ERROR = 256
MAX_THREAD_NAME = 256
MAX_DEVICE_UUID = 256
#: RankSample.blocked_in: a call and a kernel symbol (syscalls.MAX_READING).
MAX_BLOCKED_IN = 600
#: GpuMemory's device power and power limit: no board draws 10 kW (a GB200
#: superchip's limit is 2.7 kW); past it, not a reading.
MAX_GPU_WATTS = 10_000.0
MAX_PROCESS_GROUPS = 256
#: A process-group timeout above a year is not a timeout.
MAX_TIMEOUT_MS = 366 * 86400 * 1000
#: A reading (stillness, CPU seconds) no process reaches: past it, not a reading.
MAX_READING = 1e12

#: JobInfo.packages: names per sample and characters per name.
MAX_PACKAGES = 64
MAX_PACKAGE_NAME = 64

#: The most characters the daemon accepts (and so stores) of each string field
#: reachable from a NodeReport: a number, or the Bounds setting that sets it.
#: A part with a longer one is dropped (``string_too_long``), the rest applied;
#: a longer node name or agent id refuses the report (the node's own fields).
#: The agent's gate (ncclwatch.sanitize.FIELDS) caps each field at or under
#: this; tests/unit/test_sanitize_gate.py walks the proto and fails when a
#: string field has no row here, or a row that the checks (contract.checks) do
#: not enforce.
STRING_BOUNDS: dict[str, int | str] = {
    "NodeReport.node": MAX_NODE,
    "NodeReport.agent_id": MAX_ID,
    "RankChange.stack_id": MAX_ID,
    "RankChange.native_frame": MAX_STRING,
    "RankChange.native_stack_id": MAX_ID,
    "RankIdentity.job_id": MAX_JOB_ID,
    "RankIdentity.rank_source": MAX_ID,
    "RankIdentity.rank_conflict": MAX_JOB_ID,
    "ContainerInfo.hostname": MAX_CONTAINER,
    "ContainerInfo.container_id": MAX_CONTAINER,
    "ContainerInfo.runtime": MAX_CONTAINER,
    "ContainerInfo.pod_uid": MAX_CONTAINER,
    "ContainerInfo.namespace": MAX_CONTAINER,
    "ContainerInfo.pod": MAX_CONTAINER,
    "ContainerInfo.declared_namespace": MAX_CONTAINER,
    "ContainerInfo.declared_pod": MAX_CONTAINER,
    "RankSample.stack_id": MAX_ID,
    "RankSample.native_frame": MAX_STRING,
    "RankSample.native_stack_id": MAX_ID,
    "RankSample.blocked_in": MAX_BLOCKED_IN,
    "FlightRecorderSummary.version": MAX_FR_VERSION,
    "ProcessGroupProgress.pg_id": MAX_PG_TEXT,
    "ProcessGroupProgress.pg_name": MAX_PG_TEXT,
    "ProcessGroupProgress.pending_op": MAX_PG_TEXT,
    "ProcessGroupProgress.pg_desc": MAX_PG_TEXT,
    "ProcessGroupProgress.last_op": MAX_PG_TEXT,
    "OpenFile.path": "max_path",
    "OpenFile.previous_path": "max_path",
    "OpenFile.expected_source": MAX_ID,
    "OpenFile.copy_source_path": "max_path",
    "OpenFile.header_error": MAX_HEADER_ERROR,
    "GpuMemory.device_uuid": MAX_DEVICE_UUID,
    "JobInfo.source": MAX_ID,
    "JobInfo.watchdog_timeout_source": MAX_ID,
    "JobInfo.packages": MAX_PACKAGE_NAME,
    "JobInfo.EnvEntry.key": MAX_ENV_NAME,
    "JobInfo.EnvEntry.value": "max_env_value",
    "SchedulerJob.scheduler": MAX_JOB_ID,
    "SchedulerJob.job_id": MAX_JOB_ID,
    "SchedulerJob.job_name": MAX_JOB_ID,
    "SchedulerJob.user": MAX_JOB_ID,
    "SchedulerJob.source": MAX_JOB_ID,
    "Stack.id": MAX_ID,
    "Stack.thread_name": MAX_THREAD_NAME,
    "Frame.name": MAX_STRING,
    "Frame.filename": "max_path",
    "AgentHealth.version": MAX_ID,
}


def string_bound(field: str, bounds: Bounds) -> int:
    """The characters the daemon accepts of ``field`` under ``bounds``."""
    b = STRING_BOUNDS[field]
    return getattr(bounds, b) if isinstance(b, str) else b
