"""Check a report whole before any of it is applied.

A report either passes and is applied, or fails with a gRPC status code and
a message that says what is wrong; nothing of a rejected report reaches the
job tables, so a bad agent cannot corrupt the state of other jobs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import grpc

from ncclwatch.daemon.bounds import Bounds
from ncclwatch.stacks import Frame, stack_id
from ncclwatch.v1 import collector_pb2 as pb

#: 2: briefs for steady ranks; 1: full samples only (accepted for one release).
PROTOCOL_VERSIONS = frozenset({1, 2})
MAX_SAMPLES = 4096
MAX_STACKS = 4096
MAX_STRING = 4096
MAX_JOB_ID = 128
MAX_WORLD_SIZE = 1 << 20
MAX_ENV = 256
MAX_FILES = 64
_STATES = frozenset(pb.RankState.values())
_isfinite = math.isfinite
_OPS = frozenset(pb.CollectiveOp.values())
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

#: JobInfo.packages: names per sample and characters per name.
MAX_PACKAGES = 64
MAX_PACKAGE_NAME = 64

#: The most characters the daemon accepts (and so stores) of each string field
#: reachable from a NodeReport: a number, or the Bounds setting that sets it.
#: A report with a longer one is refused whole, so nothing of it is applied.
#: The agent's gate (ncclwatch.sanitize.FIELDS) caps each field at or under
#: this; tests/test_gate.py walks the proto and fails when a string field has
#: no row here, or a row that the checks below do not enforce.
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


@dataclass(frozen=True)
class Dropped:
    """A part of a report left out for a bound of its own, the rest applied:
    a stack (``stack_id``) or a sample's Flight Recorder summary (``job_id``,
    ``rank``)."""

    what: str
    error: "ReportError"
    stack_id: str = ""
    job_id: str = ""
    rank: int = -1


#: The gRPC codes a report, or a job in it, is refused with: the label values of
#: ncclwatch_daemon_rejected_*_total, exported at 0 before the first refusal.
REJECT_CODES: tuple[str, ...] = (
    "INVALID_ARGUMENT", "FAILED_PRECONDITION", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED")


class ReportError(Exception):
    """``bound``: the label (bounds.BOUND_LABELS) of the bound it hit, if any."""

    def __init__(self, code: grpc.StatusCode, message: str, bound: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.bound = bound



def _bad(msg: str, bound: str = "") -> ReportError:
    return ReportError(grpc.StatusCode.INVALID_ARGUMENT, msg, bound)


def _too_big(msg: str, bound: str = "") -> ReportError:
    return ReportError(grpc.StatusCode.RESOURCE_EXHAUSTED, msg, bound)


def validate_request(req: pb.ReportRequest,
                     world_size_of: Callable[[str], int | None] = lambda job: None,
                     bounds: Bounds = DEFAULT_BOUNDS,
                     dropped: list[Dropped] | None = None) -> dict[str, ReportError]:
    """Raise ReportError unless ``req`` may be applied; return the jobs it may not.

    A malformed report is refused whole. A well-formed one whose samples of
    some job contradict what the daemon knows of that job (``world_size_of``
    gives a tracked job's world size, or None: a report may not change it) is
    applied without that job: the result maps each such job to why.

    With ``dropped``, a stack or a Flight Recorder summary that breaks a check
    of its own (too many frames, too much text, too many groups) is taken out
    of ``req`` and listed there instead: one rank's deep stack never refuses
    the node's report. Without it, as for any other field, the report is.
    """
    if req.protocol_version not in PROTOCOL_VERSIONS:
        raise ReportError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"unsupported protocol_version {req.protocol_version}; "
                          f"this daemon speaks {sorted(PROTOCOL_VERSIONS)}")
    if not req.HasField("report"):
        raise _bad("request has no report")
    r = req.report
    if not r.node or len(r.node) > MAX_NODE:
        raise _bad(f"report.node must be a host name of 1-{MAX_NODE} characters")
    if not r.agent_id or len(r.agent_id) > MAX_ID:
        raise _bad(f"report.agent_id must be 1-{MAX_ID} characters")
    if len(r.health.version) > MAX_ID:
        raise _bad(f"report.health.version over {MAX_ID} characters")
    for name in ("agent_monotonic_seconds", "agent_wall_seconds", "interval_seconds",
                 "timed_round_trip_seconds"):
        v = getattr(r, name)
        if not math.isfinite(v) or v < 0:
            raise _bad(f"report.{name} must be finite and >= 0, got {v}")
    if r.agent_monotonic_seconds > MAX_CLOCK:
        raise _bad(f"report.agent_monotonic_seconds {r.agent_monotonic_seconds:g} is not a "
                   f"monotonic clock (over {MAX_CLOCK:g})", "age")
    if r.interval_seconds > bounds.max_interval_seconds:
        raise _bad(f"report.interval_seconds {r.interval_seconds:g} over "
                   f"{bounds.max_interval_seconds:g} (max_interval_seconds)", "interval")
    if len(r.samples) > MAX_SAMPLES:
        raise _too_big(f"{len(r.samples)} samples in one report (max {MAX_SAMPLES})")
    if len(r.stacks) > MAX_STACKS:
        raise _too_big(f"{len(r.stacks)} stacks in one report (max {MAX_STACKS})")
    _check_stacks(r, bounds, dropped)
    seen: set[tuple[str, int]] = set()
    new_jobs: dict[str, int] = {}  # jobs first seen in this very report
    rejected: dict[str, ReportError] = {}
    for i, s in enumerate(r.samples):
        key = _check_sample(i, s, world_size_of, new_jobs, rejected, bounds, dropped)
        if key in seen:
            raise _bad(f"samples[{i}]: rank {key[1]} of job {key[0]!r} appears twice")
        seen.add(key)
    for i, e in enumerate(r.exited):
        if not e.job_id or len(e.job_id) > MAX_JOB_ID or e.rank < -1:
            raise _bad(f"exited[{i}]: needs a job_id and a rank >= -1")
        if len(e.rank_source) > MAX_ID:
            raise _bad(f"exited[{i}]: rank_source too long")
        if len(e.rank_conflict) > MAX_JOB_ID:
            raise _bad(f"exited[{i}]: rank_conflict too long")
        if e.HasField("container"):
            _check_container(f"exited[{i}]", e.container)
    if r.HasField("briefs") or r.slots_reset or r.changes:
        if req.protocol_version < 2:
            raise _bad("briefs, changes and slots need protocol_version 2")
        _check_briefs(r.briefs, len(r.samples) + len(r.changes))
        for i, c in enumerate(r.changes):
            _check_change(i, c, bounds.max_age_seconds)
    return rejected


def _check_stacks(r: pb.NodeReport, bounds: Bounds, dropped: list[Dropped] | None) -> None:
    """Each stack, and their text in all; with ``dropped``, the stacks that
    fail (and those past the report's total) leave ``r`` and are listed."""
    text, kept = 0, []
    for s in r.stacks:
        try:
            n = _check_stack(s, bounds)
            if text + n > bounds.max_report_stack_bytes:
                raise _too_big(f"{text + n} bytes of stack text in one report "
                               f"(max_report_stack_bytes {bounds.max_report_stack_bytes})",
                               "report_stack_bytes")
        except ReportError as e:
            if dropped is None:
                raise
            dropped.append(Dropped("stack", e, stack_id=s.id[:MAX_ID]))
            continue
        text += n
        kept.append(s)
    if len(kept) < len(r.stacks):
        del r.stacks[:]
        r.stacks.extend(kept)


def _check_change(i: int, c: pb.RankChange, max_age: float) -> None:
    if not c.slot:
        raise _bad(f"changes[{i}]: slot 0 names no rank")
    if c.state not in _STATES or c.op not in _OPS:
        raise _bad(f"changes[{i}]: unknown state {c.state} or op {c.op}")
    for v in (c.state_seconds, c.stack_age_seconds):
        if not 0 <= v <= max_age:  # NaN fails too
            raise _bad(f"changes[{i}]: state_seconds and stack_age_seconds must be finite "
                       f"and in [0, {max_age:g}] (max_age_seconds)", "age")
    for v in (c.still_seconds, c.cpu_utilization, c.cpu_seconds):
        if not 0 <= v < 1e12:
            raise _bad(f"changes[{i}]: still_seconds, cpu_utilization and cpu_seconds must "
                       f"be finite and >= 0")
    if len(c.stack_id) > MAX_ID or len(c.native_stack_id) > MAX_ID:
        raise _bad(f"changes[{i}]: stack_id or native_stack_id too long")
    if len(c.native_frame) > MAX_STRING:
        raise _too_big(f"changes[{i}]: native_frame over {MAX_STRING} characters")


def _check_briefs(b: pb.RankBriefs, samples: int) -> None:
    """Parallel arrays of one length, slots > 0, readings finite and >= 0."""
    n = len(b.slot)
    if n + samples > MAX_SAMPLES:
        raise _too_big(f"{n} briefs and {samples} samples in one report (max {MAX_SAMPLES})")
    if not len(b.still_seconds) == len(b.cpu_utilization) == len(b.cpu_seconds) == n:
        raise _bad(f"briefs: {n} slots but {len(b.still_seconds)} still_seconds, "
                   f"{len(b.cpu_utilization)} cpu_utilization, {len(b.cpu_seconds)} cpu_seconds")
    if n and min(b.slot) == 0:
        raise _bad("briefs: slot 0 names no rank")
    if not n:
        return
    if _in_range([*b.still_seconds, *b.cpu_utilization, *b.cpu_seconds]):
        return  # one pass for all three (the hot path); the loop below names the bad one
    for name in ("still_seconds", "cpu_utilization", "cpu_seconds"):
        if not _in_range(list(getattr(b, name))):
            raise _bad(f"briefs.{name} must be finite and >= 0")


def _in_range(values: list[float]) -> bool:
    """All finite, >= 0 and < 1e12: in C loops (min, max, sum), not a Python one."""
    total = sum(values)  # NaN if any is NaN (min and max may step over one)
    return min(values) >= 0 and max(values) < 1e12 and total == total


def _check_stack(s: pb.Stack, bounds: Bounds) -> int:
    """Check one stack; return the characters of text it holds."""
    if len(s.frames) > bounds.max_stack_frames:
        raise _too_big(f"stack {s.id[:16]!r} has {len(s.frames)} frames (max_stack_frames "
                       f"{bounds.max_stack_frames})", "stack_frames")
    if len(s.id) > MAX_ID or len(s.thread_name) > MAX_THREAD_NAME:
        raise _too_big(f"stack {s.id[:16]!r}: id over {MAX_ID} or thread_name over "
                       f"{MAX_THREAD_NAME} characters")
    text = len(s.thread_name)
    for f in s.frames:
        a, b = len(f.name), len(f.filename)
        if a > MAX_STRING or b > min(MAX_STRING, bounds.max_path):
            raise _too_big(f"stack {s.id[:16]!r}: frame name/filename over {MAX_STRING} chars",
                           "path_length" if b > bounds.max_path else "")
        text += a + b
    if text > bounds.max_stack_bytes:
        raise _too_big(f"stack {s.id[:16]!r}: {text} bytes of text (max_stack_bytes "
                       f"{bounds.max_stack_bytes})", "stack_bytes")
    expect = stack_id(Frame(f.name, f.filename, f.line) for f in s.frames)
    if s.id != expect:
        raise _bad(f"stack id {s.id[:32]!r} does not match its frames (expected {expect})")
    return text


def _check_sample(i: int, s: pb.RankSample, world_size_of: Callable[[str], int | None],
                  new_jobs: dict[str, int], rejected: dict[str, ReportError],
                  bounds: Bounds = DEFAULT_BOUNDS,
                  dropped: list[Dropped] | None = None) -> tuple[str, int]:
    # Runs for every sample: each field is read once, messages built only on error.
    ident = s.identity
    job_id, world, rank = ident.job_id, ident.world_size, ident.rank
    if not job_id or len(job_id) > MAX_JOB_ID:
        raise _bad(f"samples[{i}]: job_id must be 1-{MAX_JOB_ID} characters")
    # world_size 0: unknown (PMIx); rank -1: a member whose rank is unknown.
    top = min(MAX_WORLD_SIZE, bounds.max_ranks_per_job)
    if not 0 <= world <= top:
        raise _bad(f"samples[{i}]: world_size {world} out of range 0..{top} "
                   f"(max_ranks_per_job)", "ranks_per_job" if world > 0 else "")
    if not (rank == -1 or 0 <= rank < (world or top)):
        raise _bad(f"samples[{i}]: rank {rank} out of range for world size {world}")
    if len(ident.rank_source) > MAX_ID:
        raise _bad(f"samples[{i}]: rank_source too long")
    if len(ident.rank_conflict) > MAX_JOB_ID:
        raise _bad(f"samples[{i}]: rank_conflict too long")
    if ident.HasField("container"):
        _check_container(f"samples[{i}]", ident.container)
    known = world_size_of(job_id)
    if known is None:
        known = new_jobs.setdefault(job_id, world)
    if known and world and known != world and job_id not in rejected:
        rejected[job_id] = ReportError(grpc.StatusCode.FAILED_PRECONDITION,
                                       f"samples[{i}]: job {job_id!r} has world size {known}, "
                                       f"report says {world}")
    if ident.pid <= 0:
        raise _bad(f"samples[{i}]: pid must be > 0")
    if s.state not in _STATES or s.op not in _OPS:
        raise _bad(f"samples[{i}]: unknown state {s.state} or op {s.op}")
    max_age = bounds.max_age_seconds
    v = s.state_seconds
    if not 0 <= v <= max_age:  # NaN fails too
        raise _bad(f"samples[{i}]: state_seconds must be finite and in [0, {max_age:g}] "
                   f"(max_age_seconds), got {v}", "age")
    v = s.stack_age_seconds
    if not 0 <= v <= max_age:
        raise _bad(f"samples[{i}]: stack_age_seconds must be finite and in [0, {max_age:g}] "
                   f"(max_age_seconds), got {v}", "age")
    if len(s.stack_id) > MAX_ID or len(s.native_stack_id) > MAX_ID:
        raise _bad(f"samples[{i}]: stack_id or native_stack_id too long")
    if len(s.native_frame) > MAX_STRING:
        raise _too_big(f"samples[{i}]: native_frame over {MAX_STRING} characters")
    p = s.process
    cpu = p.cpu_utilization
    if not _isfinite(cpu) or cpu < 0:
        raise _bad(f"samples[{i}]: cpu_utilization must be finite and >= 0")
    has_job = s.HasField("job")  # without it: no env, no declared timeout
    files, env = len(p.files_writing), len(s.job.env) if has_job else 0
    if files > MAX_FILES or env > MAX_ENV:
        raise _too_big(f"samples[{i}]: too many files ({files}) or env entries ({env})")
    if files:
        top = bounds.max_path
        for f in p.files_writing:
            if max(len(f.path), len(f.previous_path), len(f.copy_source_path)) > top:
                raise _too_big(f"samples[{i}]: a path of process.files_writing over {top} "
                               f"characters (max_path)", "path_length")
            if len(f.expected_source) > MAX_ID or len(f.header_error) > MAX_HEADER_ERROR:
                raise _too_big(f"samples[{i}]: process.files_writing: expected_source over "
                               f"{MAX_ID} or header_error over {MAX_HEADER_ERROR} characters")
    for g in s.gpu:
        if len(g.device_uuid) > MAX_DEVICE_UUID:
            raise _too_big(f"samples[{i}]: gpu.device_uuid over {MAX_DEVICE_UUID} characters")
    if env:
        top = bounds.max_env_value
        for k, v in s.job.env.items():
            if len(k) > MAX_ENV_NAME or len(v) > top:
                raise _too_big(f"samples[{i}]: job.env entry {k[:32]!r}: name over "
                               f"{MAX_ENV_NAME} or value over {top} characters "
                               f"(max_env_value)", "env_length")
    if has_job and s.job.packages:
        pk = s.job.packages
        if len(pk) > MAX_PACKAGES or max(map(len, pk)) > MAX_PACKAGE_NAME:
            raise _too_big(f"samples[{i}]: job.packages: over {MAX_PACKAGES} names or a "
                           f"name over {MAX_PACKAGE_NAME} characters")
    if has_job:
        if len(s.job.source) > MAX_ID:
            raise _bad(f"samples[{i}]: job.source over {MAX_ID} characters")
        if len(s.job.watchdog_timeout_source) > MAX_ID:
            raise _bad(f"samples[{i}]: job.watchdog_timeout_source over {MAX_ID} characters")
        timeout = s.job.watchdog_timeout_seconds
        if not _isfinite(timeout) or timeout < 0:
            raise _bad(f"samples[{i}]: job.watchdog_timeout_seconds must be finite and >= 0")
        sj = s.job.scheduler_job
        if any(len(v) > MAX_JOB_ID for v in (sj.scheduler, sj.job_id, sj.job_name, sj.user,
                                             sj.source)):
            raise _too_big(f"samples[{i}]: job.scheduler_job field over {MAX_JOB_ID} chars")
    if s.HasField("flight_recorder"):
        try:
            _check_flight_recorder(i, s.flight_recorder, world, bounds)
        except ReportError as e:
            if dropped is None:
                raise
            dropped.append(Dropped("flight_recorder", e, job_id=job_id, rank=rank))
            s.ClearField("flight_recorder")   # the sample itself is applied
    return (job_id, rank if rank >= 0 else -1 - ident.pid)


def _check_container(where: str, c: pb.ContainerInfo) -> None:
    if c.container_pid < 0 or max(len(c.hostname), len(c.container_id), len(c.runtime),
                                  len(c.pod_uid), len(c.namespace), len(c.pod),
                                  len(c.declared_namespace), len(c.declared_pod)) > MAX_CONTAINER:
        raise _bad(f"{where}: container fields out of bounds")


MAX_PROCESS_GROUPS = 256
#: A process-group timeout above a year is not a timeout.
MAX_TIMEOUT_MS = 366 * 86400 * 1000


def _check_flight_recorder(i: int, fr: pb.FlightRecorderSummary, world: int,
                           bounds: Bounds = DEFAULT_BOUNDS) -> None:
    """Rare (one per dump) and read by the cross-rank analysis: check it all."""
    where = f"samples[{i}].flight_recorder"
    if not 0 <= fr.dump_age_seconds <= bounds.max_age_seconds:
        raise _bad(f"{where}: dump_age_seconds must be finite and in "
                   f"[0, {bounds.max_age_seconds:g}] (max_age_seconds)", "age")
    groups = min(MAX_PROCESS_GROUPS, bounds.max_flight_recorder_groups)
    if len(fr.groups) > groups or len(fr.version) > MAX_FR_VERSION:
        raise _too_big(f"{where}: {len(fr.groups)} process groups (max_flight_recorder_groups "
                       f"{groups})", "flight_recorder_groups" if len(fr.groups) > groups else "")
    listed = sum(len(g.ranks) for g in fr.groups)
    if listed > bounds.max_flight_recorder_ranks:
        raise _too_big(f"{where}: its groups list {listed} ranks (max_flight_recorder_ranks "
                       f"{bounds.max_flight_recorder_ranks})", "flight_recorder_ranks")
    for g in fr.groups:
        if max(len(g.pg_id), len(g.pg_name), len(g.pg_desc), len(g.pending_op),
               len(g.last_op)) > MAX_PG_TEXT:
            raise _too_big(f"{where}: a process-group name or op over 256 characters")
        if len(g.ranks) > world or any(not 0 <= r < world for r in g.ranks):
            raise _bad(f"{where}: group {g.pg_name!r} lists ranks outside the world of {world}")
        if min(g.last_enqueued, g.last_started, g.last_completed) < -1 or g.pending_seq < 0:
            raise _bad(f"{where}: group {g.pg_name!r}: sequence ids must be >= -1")
        if g.pending_timeout_ms > MAX_TIMEOUT_MS:
            raise _bad(f"{where}: group {g.pg_name!r}: pending_timeout_ms over a year")
        if not _isfinite(g.pending_seconds) or not 0 <= g.pending_seconds < 1e9:
            raise _bad(f"{where}: group {g.pg_name!r}: pending_seconds must be finite, >= 0")
