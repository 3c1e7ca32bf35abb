"""The checks of a report's parts: pure, each fault named by its part and reason.

One home for the rules a report must satisfy beyond the node's own fields:
the agent runs them on what it is about to send (after rank numbers are
learned), the daemon on receipt (daemon/admission.py). A fault costs only
its own part: the sample, change, exited entry, stack or Flight Recorder
summary it is in, never the node's report. ``REASONS`` names every reason a
fault may be counted under; ``PARTS`` the parts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from ncclwatch.contract.bounds import Bounds
from ncclwatch.contract.limits import (
    DEFAULT_BOUNDS, MAX_BLOCKED_IN, MAX_CONTAINER, MAX_DEVICE_UUID, MAX_ENV, MAX_GPU_WATTS, MAX_ENV_NAME, MAX_FILES,
    MAX_FR_VERSION, MAX_HEADER_ERROR, MAX_ID, MAX_JOB_ID, MAX_PACKAGE_NAME, MAX_PACKAGES,
    MAX_PG_TEXT, MAX_PROCESS_GROUPS, MAX_READING, MAX_STRING, MAX_THREAD_NAME, MAX_TIMEOUT_MS,
    MAX_WORLD_SIZE)
from ncclwatch.stacks import Frame, stack_id
from ncclwatch.v1 import collector_pb2 as pb

#: The parts of a report a fault can cost ("node": the whole report).
PARTS = ("node", "job", "rank_sample", "change", "brief", "exited", "stack",
         "flight_recorder")

#: Every reason a part is dropped (or a report refused) for, and what it means:
#: the label values of the counters by reason on both ends. Append only: the
#: agent sends its counts in this order (AgentHealth.parts_left_out), so a
#: reason moved or removed would relabel an older agent's counts.
REASONS: dict[str, str] = {
    # the node's own fields: the whole report
    "unsupported_protocol": "a protocol version this daemon does not speak",
    "no_report": "a request without a report",
    "bad_node": "a node name empty or too long",
    "bad_agent_id": "an agent id empty or too long",
    "bad_clock": "a report clock or interval not finite, negative or past its bound",
    "too_many_parts": "more samples, briefs or stacks than one report may carry",
    "bad_briefs": "briefs whose slot arrays do not line up, or need protocol 2",
    "identity": "a node or agent its certificate may not report for",
    "agents_over_limit": "a new agent id past the node's or the daemon's bound",
    # a part of it, dropped alone
    "bad_job_id": "a job id empty or too long",
    "world_size_over_limit": "a world size past max_ranks_per_job",
    "bad_world_size": "a negative world size",
    "world_size_mismatch": "a world size other than the one the job has",
    "rank_out_of_range": "a rank outside its world",
    "duplicate_rank": "a second process for one (job, rank) in one report",
    "bad_pid": "a pid that is not > 0",
    "bad_slot": "a change for slot 0",
    "bad_state": "an unknown state or collective op",
    "not_finite": "a number that is NaN, infinite, negative or past any reading",
    "age_over_limit": "an age past max_age_seconds",
    "string_too_long": "a string past its bound (limits.STRING_BOUNDS)",
    "path_too_long": "a path past max_path",
    "env_too_long": "an environment name or value past its bound",
    "too_many_items": "more files, env entries, packages or process groups than allowed",
    "bad_container": "container fields out of bounds",
    "stack_too_deep": "a stack of more frames than max_stack_frames",
    "stack_too_big": "a stack, or the report's stacks, past their bytes of text",
    "stack_id_mismatch": "a stack whose id is not the hash of its frames",
    "flight_recorder_ranks": "a Flight Recorder summary listing too many ranks",
    "bad_sequence": "a Flight Recorder sequence id below -1",
    "job_over_bound": "a job past a bound of jobs, ranks or bytes",
    "bad_gpu_reading": "a GPU utilisation over 100%, or a power or power limit not finite, "
                       "negative or past limits.MAX_GPU_WATTS",
}

#: gRPC status names a fault would have refused a report with (daemon side).
INVALID, TOO_BIG = "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"


@dataclass(frozen=True)
class Fault:
    """Why one part breaks the contract: ``part`` (PARTS), ``reason``
    (REASONS), a message for people, the bound's label it hit
    (bounds.BOUND_LABELS, "" for none) and the gRPC status name a refusal
    would carry."""

    part: str
    reason: str
    message: str
    bound: str = ""
    code: str = INVALID

    def __post_init__(self) -> None:
        assert self.part in PARTS and self.reason in REASONS, (self.part, self.reason)


_STATES = frozenset(pb.RankState.values())
_OPS = frozenset(pb.CollectiveOp.values())
_isfinite = math.isfinite


def _too_long(*texts: str, top: int) -> bool:
    return max(map(len, texts)) > top


def check_container(part: str, c: Any) -> Fault | None:
    if c.container_pid < 0 or _too_long(c.hostname, c.container_id, c.runtime, c.pod_uid,
                                        c.namespace, c.pod, c.declared_namespace,
                                        c.declared_pod, top=MAX_CONTAINER):
        return Fault(part, "bad_container", "container fields out of bounds")
    return None


def rank_key(ident: Any) -> tuple[str, int]:
    """The (job, rank) one process holds in a report; a rank-less member
    is keyed by its pid (-1 - pid), as the daemon keys it."""
    return (ident.job_id, ident.rank if ident.rank >= 0 else -1 - ident.pid)


def _bad_activity(g: Any) -> bool:
    """A GPU utilisation or power no device reports (absent fields are unknown, not bad)."""
    if g.HasField("device_util_percent") and g.device_util_percent > 100:
        return True
    for name in ("device_power_watts", "device_power_limit_watts"):
        if g.HasField(name) and not 0.0 <= getattr(g, name) <= MAX_GPU_WATTS:
            return True  # NaN fails both comparisons
    return False


def check_sample(s: Any, bounds: Bounds = DEFAULT_BOUNDS,
                 check_job: Callable[[Any, Bounds], Fault | None] | None = None) -> Fault | None:
    """The first fault of rank sample ``s`` (its Flight Recorder summary
    apart: check_flight_recorder), or None. Runs for every sample: each
    field is read once, messages built only on a fault. ``check_job``: how
    its JobInfo is checked (``check_job_info``; the daemon remembers the
    verdict for a job's one JobInfo that every rank sends)."""
    P = "rank_sample"
    ident = s.identity
    job_id, world, rank = ident.job_id, ident.world_size, ident.rank
    if not job_id or len(job_id) > MAX_JOB_ID:
        return Fault(P, "bad_job_id", f"job_id must be 1-{MAX_JOB_ID} characters")
    # world_size 0: unknown (PMIx); rank -1: a member whose rank is unknown.
    top = min(MAX_WORLD_SIZE, bounds.max_ranks_per_job)
    if not 0 <= world <= top:
        over = world > 0
        return Fault(P, "world_size_over_limit" if over else "bad_world_size",
                     f"world_size {world} out of range 0..{top} (max_ranks_per_job)",
                     "ranks_per_job" if over else "")
    if not (rank == -1 or 0 <= rank < (world or top)):
        return Fault(P, "rank_out_of_range", f"rank {rank} out of range for world size {world}")
    if len(ident.rank_source) > MAX_ID:
        return Fault(P, "string_too_long", "rank_source too long")
    if len(ident.rank_conflict) > MAX_JOB_ID:
        return Fault(P, "string_too_long", "rank_conflict too long")
    if ident.HasField("container") and (f := check_container(P, ident.container)):
        return f
    if ident.pid <= 0:
        return Fault(P, "bad_pid", "pid must be > 0")
    if s.state not in _STATES or s.op not in _OPS:
        return Fault(P, "bad_state", f"unknown state {s.state} or op {s.op}")
    max_age = bounds.max_age_seconds
    for name, v in (("state_seconds", s.state_seconds),
                    ("stack_age_seconds", s.stack_age_seconds)):
        if not 0 <= v <= max_age:  # NaN fails too
            over = max_age < v < math.inf
            return Fault(P, "age_over_limit" if over else "not_finite",
                         f"{name} must be finite and in [0, {max_age:g}] (max_age_seconds), "
                         f"got {v}", "age" if over else "")
    if not 0 <= s.still_seconds < MAX_READING or not 0 <= ident.process_age_seconds < MAX_READING:
        return Fault(P, "not_finite", "still_seconds and process_age_seconds must be finite "
                     "and >= 0")
    if len(s.stack_id) > MAX_ID or len(s.native_stack_id) > MAX_ID:
        return Fault(P, "string_too_long", "stack_id or native_stack_id too long")
    if len(s.native_frame) > MAX_STRING:
        return Fault(P, "string_too_long", f"native_frame over {MAX_STRING} characters",
                     code=TOO_BIG)
    if len(s.blocked_in) > MAX_BLOCKED_IN:
        return Fault(P, "string_too_long", f"blocked_in over {MAX_BLOCKED_IN} characters",
                     code=TOO_BIG)
    p = s.process
    cpu = p.cpu_utilization
    if not _isfinite(cpu) or cpu < 0:
        return Fault(P, "not_finite", "cpu_utilization must be finite and >= 0")
    has_job = s.HasField("job")  # without it: no env, no declared timeout
    files, env = len(p.files_writing), len(s.job.env) if has_job else 0
    if files > MAX_FILES or env > MAX_ENV:
        return Fault(P, "too_many_items", f"too many files ({files}) or env entries ({env})",
                     code=TOO_BIG)
    if files:
        top = bounds.max_path
        for f in p.files_writing:
            if _too_long(f.path, f.previous_path, f.copy_source_path, top=top):
                return Fault(P, "path_too_long", f"a path of process.files_writing over {top} "
                             f"characters (max_path)", "path_length", TOO_BIG)
            if len(f.expected_source) > MAX_ID or len(f.header_error) > MAX_HEADER_ERROR:
                return Fault(P, "string_too_long", f"process.files_writing: expected_source "
                             f"over {MAX_ID} or header_error over {MAX_HEADER_ERROR} "
                             f"characters", code=TOO_BIG)
    for g in s.gpu:
        if len(g.device_uuid) > MAX_DEVICE_UUID:
            return Fault(P, "string_too_long", f"gpu.device_uuid over {MAX_DEVICE_UUID} "
                         f"characters", code=TOO_BIG)
        if _bad_activity(g):
            return Fault(P, "bad_gpu_reading", "gpu: device_util_percent over 100, or "
                         "device_power_watts / device_power_limit_watts not finite, "
                         f"negative or over {MAX_GPU_WATTS:.0f} W")
    if not has_job:
        return None
    return (check_job or check_job_info)(s.job, bounds)


def check_job_info(job: Any, bounds: Bounds = DEFAULT_BOUNDS) -> Fault | None:
    """The first fault of a sample's JobInfo past its count of entries (which
    ``check_sample`` checks with the files'), or None."""
    P = "rank_sample"
    if job.env:
        top = bounds.max_env_value
        for k, v in job.env.items():
            if len(k) > MAX_ENV_NAME or len(v) > top:
                return Fault(P, "env_too_long", f"job.env entry {k[:32]!r}: name over "
                             f"{MAX_ENV_NAME} or value over {top} characters (max_env_value)",
                             "env_length", TOO_BIG)
    pk = job.packages
    if pk and (len(pk) > MAX_PACKAGES or max(map(len, pk)) > MAX_PACKAGE_NAME):
        return Fault(P, "too_many_items", f"job.packages: over {MAX_PACKAGES} names or a "
                     f"name over {MAX_PACKAGE_NAME} characters", code=TOO_BIG)
    if len(job.source) > MAX_ID:
        return Fault(P, "string_too_long", f"job.source over {MAX_ID} characters")
    if len(job.watchdog_timeout_source) > MAX_ID:
        return Fault(P, "string_too_long",
                     f"job.watchdog_timeout_source over {MAX_ID} characters")
    timeout = job.watchdog_timeout_seconds
    if not _isfinite(timeout) or timeout < 0:
        return Fault(P, "not_finite", "job.watchdog_timeout_seconds must be finite and >= 0")
    sj = job.scheduler_job
    if _too_long(sj.scheduler, sj.job_id, sj.job_name, sj.user, sj.source, top=MAX_JOB_ID):
        return Fault(P, "string_too_long", f"job.scheduler_job field over {MAX_JOB_ID} chars",
                     code=TOO_BIG)
    return None


def check_change(c: Any, bounds: Bounds = DEFAULT_BOUNDS) -> Fault | None:
    """The first fault of a protocol-2 RankChange, or None."""
    P = "change"
    if not c.slot:
        return Fault(P, "bad_slot", "slot 0 names no rank")
    if c.state not in _STATES or c.op not in _OPS:
        return Fault(P, "bad_state", f"unknown state {c.state} or op {c.op}")
    max_age = bounds.max_age_seconds
    for v in (c.state_seconds, c.stack_age_seconds):
        if not 0 <= v <= max_age:  # NaN fails too
            over = max_age < v < math.inf
            return Fault(P, "age_over_limit" if over else "not_finite",
                         f"state_seconds and stack_age_seconds must be finite and in "
                         f"[0, {max_age:g}] (max_age_seconds)", "age" if over else "")
    for v in (c.still_seconds, c.cpu_utilization, c.cpu_seconds):
        if not 0 <= v < MAX_READING:
            return Fault(P, "not_finite", "still_seconds, cpu_utilization and cpu_seconds "
                         "must be finite and >= 0")
    if len(c.stack_id) > MAX_ID or len(c.native_stack_id) > MAX_ID:
        return Fault(P, "string_too_long", "stack_id or native_stack_id too long")
    if len(c.native_frame) > MAX_STRING:
        return Fault(P, "string_too_long", f"native_frame over {MAX_STRING} characters",
                     code=TOO_BIG)
    return None


def check_exited(e: Any) -> Fault | None:
    """The first fault of an ExitedRank entry, or None."""
    P = "exited"
    if not e.job_id or len(e.job_id) > MAX_JOB_ID:
        return Fault(P, "bad_job_id", "needs a job_id of 1-128 characters")
    if e.rank < -1:
        return Fault(P, "rank_out_of_range", "needs a rank >= -1")
    if len(e.rank_source) > MAX_ID:
        return Fault(P, "string_too_long", "rank_source too long")
    if len(e.rank_conflict) > MAX_JOB_ID:
        return Fault(P, "string_too_long", "rank_conflict too long")
    if e.HasField("container"):
        return check_container(P, e.container)
    return None


def check_stack(s: Any, bounds: Bounds = DEFAULT_BOUNDS) -> tuple[Fault | None, int]:
    """The first fault of one stack, or None; and the characters of text it holds."""
    P = "stack"
    if len(s.frames) > bounds.max_stack_frames:
        return Fault(P, "stack_too_deep", f"stack {s.id[:16]!r} has {len(s.frames)} frames "
                     f"(max_stack_frames {bounds.max_stack_frames})", "stack_frames",
                     TOO_BIG), 0
    if len(s.id) > MAX_ID or len(s.thread_name) > MAX_THREAD_NAME:
        return Fault(P, "string_too_long", f"stack {s.id[:16]!r}: id over {MAX_ID} or "
                     f"thread_name over {MAX_THREAD_NAME} characters", code=TOO_BIG), 0
    text = len(s.thread_name)
    top = min(MAX_STRING, bounds.max_path)
    for f in s.frames:
        a, b = len(f.name), len(f.filename)
        if a > MAX_STRING or b > top:
            path = b > bounds.max_path
            return Fault(P, "path_too_long" if path else "string_too_long",
                         f"stack {s.id[:16]!r}: frame name/filename over {MAX_STRING} chars",
                         "path_length" if path else "", TOO_BIG), 0
        text += a + b
    if text > bounds.max_stack_bytes:
        return Fault(P, "stack_too_big", f"stack {s.id[:16]!r}: {text} bytes of text "
                     f"(max_stack_bytes {bounds.max_stack_bytes})", "stack_bytes", TOO_BIG), 0
    expect = stack_id(Frame(f.name, f.filename, f.line) for f in s.frames)
    if s.id != expect:
        return Fault(P, "stack_id_mismatch", f"stack id {s.id[:32]!r} does not match its "
                     f"frames (expected {expect})"), 0
    return None, text


def check_flight_recorder(fr: Any, world: int,
                          bounds: Bounds = DEFAULT_BOUNDS) -> Fault | None:
    """The first fault of a sample's Flight Recorder summary (its sample
    stays), or None. Rare (one per dump) and read by the cross-rank
    analysis: it is checked whole."""
    P, where = "flight_recorder", "flight_recorder"
    if not 0 <= fr.dump_age_seconds <= bounds.max_age_seconds:
        over = bounds.max_age_seconds < fr.dump_age_seconds < math.inf
        return Fault(P, "age_over_limit" if over else "not_finite", f"{where}: dump_age_seconds "
                     f"must be finite and in [0, {bounds.max_age_seconds:g}] (max_age_seconds)",
                     "age" if over else "")
    groups = min(MAX_PROCESS_GROUPS, bounds.max_flight_recorder_groups)
    if len(fr.groups) > groups or len(fr.version) > MAX_FR_VERSION:
        many = len(fr.groups) > groups
        return Fault(P, "too_many_items" if many else "string_too_long",
                     f"{where}: {len(fr.groups)} process groups (max_flight_recorder_groups "
                     f"{groups})", "flight_recorder_groups" if many else "", TOO_BIG)
    listed = sum(len(g.ranks) for g in fr.groups)
    if listed > bounds.max_flight_recorder_ranks:
        return Fault(P, "flight_recorder_ranks", f"{where}: its groups list {listed} ranks "
                     f"(max_flight_recorder_ranks {bounds.max_flight_recorder_ranks})",
                     "flight_recorder_ranks", TOO_BIG)
    for g in fr.groups:
        if _too_long(g.pg_id, g.pg_name, g.pg_desc, g.pending_op, g.last_op, top=MAX_PG_TEXT):
            return Fault(P, "string_too_long", f"{where}: a process-group name or op over "
                         f"{MAX_PG_TEXT} characters", code=TOO_BIG)
        if len(g.ranks) > world or any(not 0 <= r < world for r in g.ranks):
            return Fault(P, "rank_out_of_range", f"{where}: group {g.pg_name!r} lists ranks "
                         f"outside the world of {world}")
        if min(g.last_enqueued, g.last_started, g.last_completed) < -1 or g.pending_seq < 0:
            return Fault(P, "bad_sequence", f"{where}: group {g.pg_name!r}: sequence ids "
                         f"must be >= -1")
        if g.pending_timeout_ms > MAX_TIMEOUT_MS:
            return Fault(P, "not_finite", f"{where}: group {g.pg_name!r}: pending_timeout_ms "
                         f"over a year")
        if not _isfinite(g.pending_seconds) or not 0 <= g.pending_seconds < 1e9:
            return Fault(P, "not_finite", f"{where}: group {g.pg_name!r}: pending_seconds "
                         f"must be finite, >= 0")
    return None


def prefer(a: Any, b: Any) -> bool:
    """Of two samples holding one (job, rank), whether ``a`` keeps the number:
    the environment's (rank_source ``env:...``) over a learned one, else the
    older process (larger process_age_seconds), else the first (``a``)."""
    ea = a.identity.rank_source.startswith("env:")
    eb = b.identity.rank_source.startswith("env:")
    if ea != eb:
        return ea
    return a.identity.process_age_seconds >= b.identity.process_age_seconds


def bad_briefs(b: Any) -> list[int]:
    """Indexes of the briefs (protocol 2) whose readings are not finite, >= 0
    and under MAX_READING: each is its rank's, dropped alone. The arrays'
    shape is the node's (daemon/validate.py)."""
    values = [*b.still_seconds, *b.cpu_utilization, *b.cpu_seconds]
    if not values or _in_range(values):
        return []     # one pass for all three (the hot path)
    return [i for i, v in enumerate(zip(b.still_seconds, b.cpu_utilization, b.cpu_seconds))
            if not _in_range(list(v))]


def _in_range(values: list[float]) -> bool:
    """All finite, >= 0 and < MAX_READING: in C loops (min, max, sum), not a Python one."""
    total = sum(values)  # NaN if any is NaN (min and max may step over one)
    return min(values) >= 0 and max(values) < MAX_READING and total == total
