"""Check a report whole before any of it is applied.

A report either passes and is applied, or fails with a gRPC status code and
a message that says what is wrong; nothing of a rejected report reaches the
job tables, so a bad agent cannot corrupt the state of other jobs.
"""

from __future__ import annotations

import math
from typing import Callable

import grpc

from ncclwatch.stacks import Frame, stack_id
from ncclwatch.v1 import collector_pb2 as pb

#: 2: briefs for steady ranks; 1: full samples only (accepted for one release).
PROTOCOL_VERSIONS = frozenset({1, 2})
MAX_SAMPLES = 4096
MAX_STACKS = 4096
MAX_FRAMES = 1024
MAX_STRING = 4096
MAX_JOB_ID = 128
MAX_WORLD_SIZE = 1 << 20
MAX_ENV = 256
MAX_FILES = 64
_STATES = frozenset(pb.RankState.values())
_isfinite = math.isfinite
_OPS = frozenset(pb.CollectiveOp.values())


class ReportError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _bad(msg: str) -> ReportError:
    return ReportError(grpc.StatusCode.INVALID_ARGUMENT, msg)


def _too_big(msg: str) -> ReportError:
    return ReportError(grpc.StatusCode.RESOURCE_EXHAUSTED, msg)


def validate_request(req: pb.ReportRequest,
                     world_size_of: Callable[[str], int | None] = lambda job: None,
                     ) -> dict[str, ReportError]:
    """Raise ReportError unless ``req`` may be applied; return the jobs it may not.

    A malformed report is refused whole. A well-formed one whose samples of
    some job contradict what the daemon knows of that job (``world_size_of``
    gives a tracked job's world size, or None: a report may not change it) is
    applied without that job: the result maps each such job to why.
    """
    if req.protocol_version not in PROTOCOL_VERSIONS:
        raise ReportError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"unsupported protocol_version {req.protocol_version}; "
                          f"this daemon speaks {sorted(PROTOCOL_VERSIONS)}")
    if not req.HasField("report"):
        raise _bad("request has no report")
    r = req.report
    if not r.node or len(r.node) > 255:
        raise _bad("report.node must be a host name of 1-255 characters")
    if not r.agent_id or len(r.agent_id) > 64:
        raise _bad("report.agent_id must be 1-64 characters")
    for name in ("agent_monotonic_seconds", "agent_wall_seconds", "interval_seconds"):
        v = getattr(r, name)
        if not math.isfinite(v) or v < 0:
            raise _bad(f"report.{name} must be finite and >= 0, got {v}")
    if len(r.samples) > MAX_SAMPLES:
        raise _too_big(f"{len(r.samples)} samples in one report (max {MAX_SAMPLES})")
    if len(r.stacks) > MAX_STACKS:
        raise _too_big(f"{len(r.stacks)} stacks in one report (max {MAX_STACKS})")
    for s in r.stacks:
        _check_stack(s)
    seen: set[tuple[str, int]] = set()
    new_jobs: dict[str, int] = {}  # jobs first seen in this very report
    rejected: dict[str, ReportError] = {}
    for i, s in enumerate(r.samples):
        key = _check_sample(i, s, world_size_of, new_jobs, rejected)
        if key in seen:
            raise _bad(f"samples[{i}]: rank {key[1]} of job {key[0]!r} appears twice")
        seen.add(key)
    for i, e in enumerate(r.exited):
        if not e.job_id or len(e.job_id) > MAX_JOB_ID or e.rank < -1:
            raise _bad(f"exited[{i}]: needs a job_id and a rank >= -1")
    if r.HasField("briefs") or r.slots_reset or r.changes:
        if req.protocol_version < 2:
            raise _bad("briefs, changes and slots need protocol_version 2")
        _check_briefs(r.briefs, len(r.samples) + len(r.changes))
        for i, c in enumerate(r.changes):
            _check_change(i, c)
    return rejected


def _check_change(i: int, c: pb.RankChange) -> None:
    if not c.slot:
        raise _bad(f"changes[{i}]: slot 0 names no rank")
    if c.state not in _STATES or c.op not in _OPS:
        raise _bad(f"changes[{i}]: unknown state {c.state} or op {c.op}")
    for v in (c.state_seconds, c.stack_age_seconds):
        if not 0 <= v < 1e9:  # NaN fails too
            raise _bad(f"changes[{i}]: state_seconds and stack_age_seconds must be finite "
                       f"and in [0, 1e9)")
    for v in (c.still_seconds, c.cpu_utilization, c.cpu_seconds):
        if not 0 <= v < 1e12:
            raise _bad(f"changes[{i}]: still_seconds, cpu_utilization and cpu_seconds must "
                       f"be finite and >= 0")
    if len(c.stack_id) > 64:
        raise _bad(f"changes[{i}]: stack_id too long")


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


def _check_stack(s: pb.Stack) -> None:
    if len(s.frames) > MAX_FRAMES:
        raise _too_big(f"stack {s.id[:16]!r} has {len(s.frames)} frames (max {MAX_FRAMES})")
    for f in s.frames:
        if len(f.name) > MAX_STRING or len(f.filename) > MAX_STRING:
            raise _too_big(f"stack {s.id[:16]!r}: frame name/filename over {MAX_STRING} chars")
    expect = stack_id(Frame(f.name, f.filename, f.line) for f in s.frames)
    if s.id != expect:
        raise _bad(f"stack id {s.id[:32]!r} does not match its frames (expected {expect})")


def _check_sample(i: int, s: pb.RankSample, world_size_of: Callable[[str], int | None],
                  new_jobs: dict[str, int], rejected: dict[str, ReportError]) -> tuple[str, int]:
    # Runs for every sample: each field is read once, messages built only on error.
    ident = s.identity
    job_id, world, rank = ident.job_id, ident.world_size, ident.rank
    if not job_id or len(job_id) > MAX_JOB_ID:
        raise _bad(f"samples[{i}]: job_id must be 1-{MAX_JOB_ID} characters")
    # world_size 0: unknown (PMIx); rank -1: a member whose rank is unknown.
    if not 0 <= world <= MAX_WORLD_SIZE:
        raise _bad(f"samples[{i}]: world_size {world} out of range 0..{MAX_WORLD_SIZE}")
    if not (rank == -1 or 0 <= rank < (world or MAX_WORLD_SIZE)):
        raise _bad(f"samples[{i}]: rank {rank} out of range for world size {world}")
    if len(ident.rank_source) > 64:
        raise _bad(f"samples[{i}]: rank_source too long")
    if ident.HasField("container"):
        c = ident.container
        if c.container_pid < 0 or max(len(c.hostname), len(c.container_id), len(c.runtime),
                                      len(c.pod_uid), len(c.namespace), len(c.pod)) > 253:
            raise _bad(f"samples[{i}]: container fields out of bounds")
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
    v = s.state_seconds
    if not _isfinite(v) or not 0 <= v < 1e9:
        raise _bad(f"samples[{i}]: state_seconds must be finite and in [0, 1e9), got {v}")
    v = s.stack_age_seconds
    if not _isfinite(v) or not 0 <= v < 1e9:
        raise _bad(f"samples[{i}]: stack_age_seconds must be finite and in [0, 1e9), got {v}")
    if len(s.stack_id) > 64:
        raise _bad(f"samples[{i}]: stack_id too long")
    p = s.process
    cpu = p.cpu_utilization
    if not _isfinite(cpu) or cpu < 0:
        raise _bad(f"samples[{i}]: cpu_utilization must be finite and >= 0")
    has_job = s.HasField("job")  # without it: no env, no declared timeout
    files, env = len(p.files_writing), len(s.job.env) if has_job else 0
    if files > MAX_FILES or env > MAX_ENV:
        raise _too_big(f"samples[{i}]: too many files ({files}) or env entries ({env})")
    if has_job:
        timeout = s.job.watchdog_timeout_seconds
        if not _isfinite(timeout) or timeout < 0:
            raise _bad(f"samples[{i}]: job.watchdog_timeout_seconds must be finite and >= 0")
        sj = s.job.scheduler_job
        if any(len(v) > MAX_JOB_ID for v in (sj.scheduler, sj.job_id, sj.job_name, sj.user,
                                             sj.source)):
            raise _too_big(f"samples[{i}]: job.scheduler_job field over {MAX_JOB_ID} chars")
    if s.HasField("flight_recorder"):
        _check_flight_recorder(i, s.flight_recorder, world)
    return (job_id, rank if rank >= 0 else -1 - ident.pid)


MAX_PROCESS_GROUPS = 256
#: A process-group timeout above a year is not a timeout.
MAX_TIMEOUT_MS = 366 * 86400 * 1000


def _check_flight_recorder(i: int, fr: pb.FlightRecorderSummary, world: int) -> None:
    """Rare (one per dump) and read by the cross-rank analysis: check it all."""
    where = f"samples[{i}].flight_recorder"
    if not _isfinite(fr.dump_age_seconds) or not 0 <= fr.dump_age_seconds < 1e9:
        raise _bad(f"{where}: dump_age_seconds must be finite and in [0, 1e9)")
    if len(fr.groups) > MAX_PROCESS_GROUPS or len(fr.version) > 32:
        raise _too_big(f"{where}: {len(fr.groups)} process groups (max {MAX_PROCESS_GROUPS})")
    for g in fr.groups:
        if max(len(g.pg_id), len(g.pg_name), len(g.pg_desc), len(g.pending_op)) > 256:
            raise _too_big(f"{where}: a process-group name or op over 256 characters")
        if len(g.ranks) > world or any(not 0 <= r < world for r in g.ranks):
            raise _bad(f"{where}: group {g.pg_name!r} lists ranks outside the world of {world}")
        if min(g.last_enqueued, g.last_started, g.last_completed) < -1 or g.pending_seq < 0:
            raise _bad(f"{where}: group {g.pg_name!r}: sequence ids must be >= -1")
        if g.pending_timeout_ms > MAX_TIMEOUT_MS:
            raise _bad(f"{where}: group {g.pg_name!r}: pending_timeout_ms over a year")
        if not _isfinite(g.pending_seconds) or not 0 <= g.pending_seconds < 1e9:
            raise _bad(f"{where}: group {g.pg_name!r}: pending_seconds must be finite, >= 0")
