"""Translate the agent's view of its ranks into a NodeReport (pure).

Separate from transport, as in OpenTelemetry's exporters: this builds the
message; ``uplink`` decides when and how it travels, and attaches the stack
frames a stream has not seen yet.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence, TypeVar

from ncclwatch.agent import caps
from ncclwatch.agent.discover import RankProcess
from ncclwatch.agent.gpu import GpuDevice, GpuProcessMemory
from ncclwatch.agent.tracker import RankTracker
from ncclwatch.contract import checks
from ncclwatch.contract.limits import MAX_READING
from ncclwatch.jobid import UNKNOWN_RANK, UNKNOWN_SOURCE
from ncclwatch.sanitize import COUNTS, clean, for_log, gate
from ncclwatch.stacks import Frame, Stack, stack_id
from ncclwatch.v1 import collector_pb2 as pb

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: Reports as built here (full samples only); streams send them as protocol 2
#: with briefs (``delta``), or as this to a daemon that speaks only 1.
PROTOCOL_VERSION = 1

LIMIT_KINDS = {
    "host": pb.MEMORY_LIMIT_KIND_HOST,
    "cgroup": pb.MEMORY_LIMIT_KIND_CGROUP,
    "address_space": pb.MEMORY_LIMIT_KIND_ADDRESS_SPACE,
}



@dataclass
class AgentHealthCounts:
    version: str = ""
    nvml_up: bool = False
    gpus_expected: int = 0
    pyspy_runs_total: int = 0
    pyspy_failures_total: int = 0
    pyspy_seconds_total: float = 0.0
    reports_dropped_total: int = 0
    queue_length: int = 0
    cpu_seconds_total: float = 0.0
    #: Hostile text (ncclwatch.sanitize): a rank's field left out of a round
    #: because it could not be encoded, strings escaped, strings cut to a cap.
    fields_dropped_total: int = 0
    texts_escaped_total: int = 0
    texts_truncated_total: int = 0
    native_dumps_total: int = 0
    native_dump_failures_total: int = 0
    native_dump_seconds_total: float = 0.0
    native_dump_buckets: tuple[int, ...] = ()
    pause_budget_seconds: float = 0.0
    native_dumps_refused_total: int = 0
    ranks_pause_budget_spent: int = 0
    #: What one rank may cost (caps.py): stacks and FR summaries cut to the
    #: daemon's bounds, per-rank work cut for its budget (caps.BUDGET_REASONS).
    stacks_trimmed_total: int = 0
    flight_recorder_trimmed_total: int = 0
    rank_budget_hits: tuple[int, ...] = ()
    #: Parts the agent left out or changed before sending, by PART_REASONS.
    parts_left_out: tuple[int, ...] = ()


# -- text that leaves the node -------------------------------------------------------
#
# Every string of a report is a process's bytes: each goes through the one
# gate (ncclwatch.sanitize.gate), named by its report field, which redacts,
# escapes and caps it by that field's rule.


def sent_path(path: str) -> str:
    """A file path as it leaves the node: redacted, escaped, capped."""
    return gate("OpenFile.path", path)


def sent_frame(text: str) -> str:
    """A frame's function or file name as it leaves the node."""
    return gate("Frame.name", text)


def sent_env(env: dict[str, str]) -> dict[str, str]:
    """Env names and (already gated, ncclwatch.sanitize.filter_env) values."""
    return {gate("JobInfo.EnvEntry.key", k): gate("JobInfo.EnvEntry.value", v)
            for k, v in env.items()}


def _field(what: str, build: Callable[[], _T]) -> _T | None:
    """One field of one rank: a failure drops the field for this round, counted,
    never the round."""
    try:
        return build()
    except Exception as e:  # noqa: BLE001 - hostile input must not fail a round
        COUNTS.fields_dropped_total += 1
        log.debug("left %s out of a sample: %s", what, clean(repr(e), 200))
        return None


def identity_pb(proc: RankProcess) -> pb.RankIdentity:
    i = proc.identity
    out = pb.RankIdentity(job_id=gate("RankIdentity.job_id", i.job_id), rank=i.rank,
                          local_rank=i.local_rank, world_size=i.world_size, pid=proc.pid,
                          rank_source=gate("RankIdentity.rank_source", i.rank_source),
                          rank_conflict=gate("RankIdentity.rank_conflict", i.rank_conflict),
                          process_age_seconds=max(0.0, time.time() - proc.create_time)
                          if proc.create_time else 0.0, start_ticks=proc.start_ticks)
    if proc.uid >= 0:
        out.uid = proc.uid
    c = proc.container
    if c:
        out.container.CopyFrom(pb.ContainerInfo(
            container_pid=c.container_pid, hostname=gate("ContainerInfo.hostname", c.hostname),
            container_id=gate("ContainerInfo.container_id", c.container_id),
            runtime=gate("ContainerInfo.runtime", c.runtime),
            pod_uid=gate("ContainerInfo.pod_uid", c.pod_uid),
            namespace=gate("ContainerInfo.namespace", c.namespace),
            pod=gate("ContainerInfo.pod", c.pod),
            declared_namespace=gate("ContainerInfo.declared_namespace", c.declared_namespace),
            declared_pod=gate("ContainerInfo.declared_pod", c.declared_pod)))
    return out


def stack_pb(stack: Stack) -> pb.Stack:
    """The stack as it leaves the node. Its id is the hash of the frames as
    sent (gated), which the daemon checks: a frame that had to be escaped or
    redacted once made the id of the raw frames, and the daemon refused the
    whole report. Samples name the stack by this id. Within the daemon's
    bounds (caps.trim_frames, on the frames as sent): a deeper or larger stack
    keeps its innermost and outermost frames and a marker between."""
    raw = caps.trim_frames(stack.frames)   # the frames gated: at most STACK_FRAMES
    gated = tuple(Frame(gate("Frame.name", f.name), gate("Frame.filename", f.filename), f.line)
                  for f in raw)
    frames = caps.trim_frames(gated)       # escaping may lengthen text: cut again
    if any(f.filename == caps.MARKER_FILE for f in frames):
        caps.COUNTS.stacks_trimmed_total += 1   # here or when py-spy's dump was read
    return pb.Stack(
        id=gate("Stack.id", stack_id(frames)),
        thread_name=gate("Stack.thread_name", stack.thread_name),
        frames=[pb.Frame(name=f.name, filename=f.filename, line=f.line) for f in frames],
    )


def _activity_pb(m: pb.GpuMemory, d: GpuDevice) -> None:
    """The device's utilisation and power, each only where NVML answered (absent: unknown)."""
    if 0 <= d.util_percent <= 100:
        m.device_util_percent = d.util_percent
    if d.power_watts >= 0:
        m.device_power_watts = d.power_watts
    if d.power_limit_watts > 0:
        m.device_power_limit_watts = d.power_limit_watts


def sample_pb(t: RankTracker, now: float, gpu: Sequence[GpuProcessMemory],
              devices: dict[int, GpuDevice], with_job: bool) -> pb.RankSample:
    s = pb.RankSample(
        identity=identity_pb(t.proc),
        state=t.shown_state.to_proto(),
        op=t.op.to_proto(),
        state_seconds=max(0.0, now - t.state_since),
        stack_age_seconds=max(0.0, now - t.stack_at) if t.stack_at is not None else 0.0,
        stack_id=gate("RankSample.stack_id", t.stack_id),
        evidence=t.evidence.to_proto(),
        # a symbol name the rank chose (ctypes, cffi, a JIT): redacted like a frame
        native_frame=gate("RankSample.native_frame", t.native.frame) if t.native is not None
        else "",
        native_no_wait=t.native_no_wait,
        native_stack_id=gate("RankSample.native_stack_id", t.native_stack_id_now),
    )
    if t.sample is not None:
        s.still_seconds = t.still_seconds(now)
        s.blocked_in = gate("RankSample.blocked_in", t.sample.blocked_in)
        process = _field("process stats", lambda: _process_pb(t))
        if process is not None:
            s.process.CopyFrom(process)
    for g in gpu:
        d = devices.get(g.device_index)
        m = s.gpu.add(
            device_index=g.device_index, used_bytes=g.used_bytes,
            device_uuid=gate("GpuMemory.device_uuid", d.uuid) if d else "",
            device_total_bytes=d.total_bytes if d else 0,
            device_used_bytes=d.used_bytes if d else 0)
        if d is not None:
            _activity_pb(m, d)
    if t.flight_recorder is not None:
        fr = t.flight_recorder
        if _field("flight recorder summary", fr.SerializeToString) is not None:
            s.flight_recorder.CopyFrom(fr)
    if with_job:
        job = _field("job info", lambda: _job_pb(t))
        if job is not None:
            s.job.CopyFrom(job)
    return s


def _process_pb(t: RankTracker) -> pb.ProcessStats:
    p = t.sample
    out = pb.ProcessStats(
        cpu_seconds=p.cpu_seconds, cpu_utilization=t.cpu_util, rss_bytes=p.rss_bytes,
        io_read_bytes=p.io_read_bytes, io_write_bytes=p.io_write_bytes,
        num_threads=p.num_threads,
        vms_bytes=p.vms_bytes,
        memory_limits=[pb.MemoryLimit(kind=LIMIT_KINDS[m.kind], used_bytes=m.used_bytes,
                                      limit_bytes=m.limit_bytes)
                       for m in p.memory_limits],
    )
    for f in p.files_writing:
        one = _field("an open file", lambda f=f: pb.OpenFile(
            path=gate("OpenFile.path", f.path), size_bytes=f.size_bytes,
            previous_path=gate("OpenFile.previous_path", f.previous_path),
            previous_size_bytes=f.previous_size_bytes,
            expected_size_bytes=f.expected_size_bytes,
            expected_source=gate("OpenFile.expected_source", f.expected_source),
            copy_source_path=gate("OpenFile.copy_source_path", f.copy_source_path),
            header_error=gate("OpenFile.header_error", f.header_error)))
        if one is not None:
            out.files_writing.append(one)
    out.SerializeToString()       # whatever slipped through fails here, not in the round
    return out


def _job_pb(t: RankTracker) -> pb.JobInfo:
    env = t.proc.env
    timeout, timeout_source = t.stated_timeout()
    out = pb.JobInfo(source=gate("JobInfo.source", t.proc.identity.job_source), env=sent_env(env),
                     watchdog_timeout_seconds=timeout,
                     watchdog_timeout_source=gate("JobInfo.watchdog_timeout_source", timeout_source),
                     packages=[gate("JobInfo.packages", p) for p in sorted(t.packages)])
    sj = t.scheduler_job
    if sj is not None:
        out.scheduler_job.CopyFrom(pb.SchedulerJob(
            scheduler=gate("SchedulerJob.scheduler", sj.scheduler),
            job_id=gate("SchedulerJob.job_id", sj.job_id),
            job_name=gate("SchedulerJob.job_name", sj.name), user=gate("SchedulerJob.user", sj.user),
            source=gate("SchedulerJob.source", sj.source)))
    out.SerializeToString()
    return out


def build_report(*, node: str, agent_id: str, seq: int, now: float, wall: float,
                 interval: float, samples: Iterable[pb.RankSample],
                 exited: Iterable[RankProcess], health: AgentHealthCounts,
                 ranks_watched: int) -> pb.NodeReport:
    return pb.NodeReport(
        node=gate("NodeReport.node", node), agent_id=gate("NodeReport.agent_id", agent_id),
        seq=seq,
        agent_monotonic_seconds=now, agent_wall_seconds=wall,
        interval_seconds=interval, full_round=True,
        samples=list(samples),
        exited=[identity_pb(p) for p in exited],
        health=pb.AgentHealth(
            version=gate("AgentHealth.version", health.version), ranks_watched=ranks_watched, nvml_up=health.nvml_up,
            gpus_expected=health.gpus_expected,
            pyspy_runs_total=health.pyspy_runs_total,
            pyspy_failures_total=health.pyspy_failures_total,
            pyspy_seconds_total=health.pyspy_seconds_total,
            reports_dropped_total=health.reports_dropped_total,
            queue_length=health.queue_length,
            cpu_seconds_total=health.cpu_seconds_total,
            fields_dropped_total=health.fields_dropped_total,
            texts_escaped_total=health.texts_escaped_total,
            texts_truncated_total=health.texts_truncated_total,
            native_dumps_total=health.native_dumps_total,
            native_dump_failures_total=health.native_dump_failures_total,
            native_dump_seconds_total=health.native_dump_seconds_total,
            native_dump_bucket_counts=list(health.native_dump_buckets),
            pause_budget_seconds_per_hour=health.pause_budget_seconds,
            native_dumps_refused_total=health.native_dumps_refused_total,
            ranks_pause_budget_spent=health.ranks_pause_budget_spent,
            stacks_trimmed_total=health.stacks_trimmed_total,
            flight_recorder_trimmed_total=health.flight_recorder_trimmed_total,
            rank_budget_hits=list(health.rank_budget_hits),
            parts_left_out=list(health.parts_left_out),
        ),
    )



# -- each part within the daemon's rules, before it is sent -------------------------
#
# The daemon judges a report part by part (ncclwatch.contract.checks); the
# agent applies the same checks to what it is about to send, after the ranks'
# numbers are learned, so one process's reading costs its own part, never the
# node's report.

#: Why a part was left out or changed before sending, in
#: AgentHealth.parts_left_out order: the contract's reasons (checks.REASONS).
PART_REASONS = tuple(checks.REASONS)

#: Readings of a sample cleared when not finite (field, breaks it): the rank's
#: state, stack and wait still go, counted under ``not_finite``. Every other
#: fault (a world past max_ranks_per_job, a rank outside its world, an age
#: past max_age_seconds) leaves the whole sample out.
READING_RULES: tuple[tuple[str, Callable[[pb.RankSample], bool]], ...] = (
    ("still_seconds", lambda s: s.HasField("still_seconds")
     and not 0 <= s.still_seconds < MAX_READING),
    ("process", lambda s: s.HasField("process") and not all(
        0 <= v < MAX_READING for v in (s.process.cpu_utilization, s.process.cpu_seconds))),
    ("job", lambda s: s.HasField("job") and not 0 <= s.job.watchdog_timeout_seconds
     < MAX_READING),
)


def neutralise(s: pb.RankSample) -> list[str]:
    """Clear the readings of ``s`` that are not finite; return their names."""
    cleared = [name for name, breaks in READING_RULES if breaks(s)]
    for name in cleared:
        s.ClearField(name)
    return cleared


class PartCounts:
    """Parts left out or changed, by reason (sent in the agent's health), each
    said once per process and reason."""

    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()
        self._said: set[tuple[str, int, int, str]] = set()

    def left_out(self, reason: str, s: pb.RankSample, why: str) -> None:
        assert reason in checks.REASONS, reason
        self.counts[reason] += 1
        i = s.identity
        key = (i.job_id, i.rank, i.pid, reason)
        if key not in self._said:
            if len(self._said) > 4096:
                self._said.clear()
            self._said.add(key)
            log.warning("pid %d of job %s: %s (%s)", i.pid, for_log(i.job_id), for_log(why),
                        reason)

    def as_list(self) -> list[int]:
        return [self.counts[r] for r in PART_REASONS]


PARTS = PartCounts()


def one_per_rank(samples: Sequence[pb.RankSample]) -> list[pb.RankSample]:
    """One process per (job, rank) among ``samples``: the number stays with
    the one the contract prefers (checks.prefer: the environment's, else the
    older); each other claimant is sent unnumbered, its ``rank_conflict``
    naming the number it claimed and the process that holds it: never
    merged. Return those changed."""
    holder: dict[tuple[str, int], pb.RankSample] = {}
    losers = []
    for s in samples:
        if s.identity.rank == UNKNOWN_RANK:
            continue
        key = (s.identity.job_id, s.identity.rank)
        cur = holder.get(key)
        if cur is None:
            holder[key] = s
        elif checks.prefer(s, cur):
            holder[key] = s
            losers.append(cur)
        else:
            losers.append(s)
    for s in losers:
        i, h = s.identity, holder[(s.identity.job_id, s.identity.rank)].identity
        i.rank_conflict = gate("RankIdentity.rank_conflict",
                               f"{i.rank_source}:{i.rank} held by pid {h.pid} "
                               f"({h.rank_source})")
        i.rank, i.rank_source = UNKNOWN_RANK, UNKNOWN_SOURCE
    return losers


def admit(samples: Sequence[pb.RankSample], parts: PartCounts = PARTS) -> list[pb.RankSample]:
    """``samples`` as they may go: readings that are not finite cleared, each
    sample checked by the contract (checks.check_sample; a failing one left
    out alone, counted by its reason), then one process per (job, rank)."""
    kept = []
    for s in samples:
        cleared = neutralise(s)
        if cleared:
            parts.left_out("not_finite", s, f"left out {', '.join(cleared)}: not a finite "
                                            f"reading")
        fault = checks.check_sample(s)
        if fault is not None:
            parts.left_out(fault.reason, s, f"its sample was left out: {fault.message}")
            continue
        kept.append(s)
    for s in one_per_rank(kept):
        parts.left_out("duplicate_rank", s, f"sent unnumbered: {s.identity.rank_conflict}")
    return kept
