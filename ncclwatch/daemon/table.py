"""Each job's rank table: the latest sample per rank, and since-when.

Durations use the agent's monotonic clock (ages in the report) anchored at
the daemon's receive time, so clocks of different nodes never meet. Per-job
indexes (ranks by state, ranks in a collective) are updated on each change,
so detection reads a few sets instead of rescanning the table.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

from ncclwatch.envlint import EnvWarning, lint
from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.stacks import Frame, Stack
from ncclwatch.v1 import collector_pb2 as pb

#: Stacks kept by content id; least recently referenced go first.
MAX_STACKS = 200_000
#: A job whose ranks are all gone is forgotten after this long.
GONE_JOB_TTL = 120.0
#: Evidence curve per rank: points at least this far apart, this many kept.
CURVE_STEP = 0.9
CURVE_POINTS = 90


class Point:
    """One point of a rank's evidence curve (memory, I/O, the file it writes)."""

    __slots__ = ("t", "rss", "written", "file", "file_size", "limits", "gpu")

    def __init__(self, t: float, rss: int, written: int, file: str, file_size: int,
                 limits: tuple[tuple[str, int, int], ...],
                 gpu: tuple[tuple[int, int, int], ...]) -> None:
        self.t, self.rss, self.written = t, rss, written
        self.file, self.file_size = file, file_size
        self.limits, self.gpu = limits, gpu


LIMIT_NAMES = {
    pb.MEMORY_LIMIT_KIND_HOST: "host",
    pb.MEMORY_LIMIT_KIND_CGROUP: "cgroup",
    pb.MEMORY_LIMIT_KIND_ADDRESS_SPACE: "address_space",
}


class RankRecord:
    __slots__ = (
        "rank", "local_rank", "node", "agent_id", "pid", "state", "op", "since",
        "stack_id", "seen", "cpu_util", "rss_bytes", "io_write_bytes", "write_rate",
        "files", "gpu", "gone_at", "vms_bytes", "limits", "curve", "stack_at",
    )

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.local_rank = -1
        self.node = ""
        self.agent_id = ""
        self.pid = 0
        self.state = RankState.UNKNOWN
        self.op = CollectiveOp.NONE
        self.since = 0.0
        self.stack_id = ""
        self.seen = 0.0
        self.cpu_util = 0.0
        self.rss_bytes = 0
        self.io_write_bytes = 0
        self.write_rate = 0.0
        # (path, size, previous checkpoint path, its size)
        self.files: tuple[tuple[str, int, str, int], ...] = ()
        # (device, used by this process, total); device-wide use is in limits
        self.gpu: tuple[tuple[int, int, int], ...] = ()
        self.gone_at: float | None = None
        self.vms_bytes = 0
        # (kind, used, limit): host, cgroup, address_space, gpu<i>
        self.limits: tuple[tuple[str, int, int], ...] = ()
        self.curve: collections.deque[Point] = collections.deque(maxlen=CURVE_POINTS)
        # When the stack that gave ``state`` was taken (daemon clock), None: never.
        self.stack_at: float | None = None

    def record(self, now: float) -> None:
        """Append the current readings to the curve (downsampled)."""
        if self.curve and now - self.curve[-1].t < CURVE_STEP:
            return
        path, size = (self.files[0][0], self.files[0][1]) if self.files else ("", 0)
        self.curve.append(Point(now, self.rss_bytes, self.io_write_bytes, path, size,
                                self.limits, self.gpu))


@dataclass
class Job:
    job_id: str
    world_size: int
    first_seen: float
    source: str = ""
    env: dict[str, str] = field(default_factory=dict)
    declared_timeout: float = 0.0
    ranks: dict[int, RankRecord] = field(default_factory=dict)
    by_state: dict[RankState, set[int]] = field(
        default_factory=lambda: {s: set() for s in RankState})
    in_collective: set[int] = field(default_factory=set)
    last_update: float = 0.0
    #: Settings in the job's environment that defeat the watchdog or evidence.
    warnings: tuple[EnvWarning, ...] = ()

    def set_state(self, rec: RankRecord, state: RankState, op: CollectiveOp) -> None:
        self.by_state[rec.state].discard(rec.rank)
        self.by_state[state].add(rec.rank)
        if op is CollectiveOp.NONE:
            self.in_collective.discard(rec.rank)
        else:
            self.in_collective.add(rec.rank)
        rec.state, rec.op = state, op

    def remove_from_indexes(self, rec: RankRecord) -> None:
        self.by_state[rec.state].discard(rec.rank)
        self.in_collective.discard(rec.rank)

    @property
    def waiting(self) -> set[int]:
        """Ranks blocked on others: in a collective, or (NCCL) at a device sync."""
        dw = self.by_state[RankState.DEVICE_WAIT]
        return self.in_collective | dw if dw else self.in_collective

    @property
    def nodes(self) -> set[str]:
        return {r.node for r in self.ranks.values()}

    @property
    def live_ranks(self) -> int:
        return sum(1 for r in self.ranks.values() if r.gone_at is None)


@dataclass
class AgentRecord:
    agent_id: str
    node: str
    last_seq: int = 0
    last_recv: float = 0.0       # daemon monotonic
    last_recv_wall: float = 0.0  # daemon wall clock, for the timestamp metric
    interval: float = 1.0
    gaps_total: int = 0
    reports_total: int = 0
    connected: bool = False
    health: pb.AgentHealth = field(default_factory=pb.AgentHealth)
    ranks: set[tuple[str, int]] = field(default_factory=set)
    commands: collections.deque = field(default_factory=lambda: collections.deque(maxlen=64))

    def stale(self, now: float, staleness: float) -> bool:
        return now - self.last_recv > max(staleness, 3 * self.interval)


class StackStore:
    """Interned stacks by id, bounded LRU."""

    def __init__(self, limit: int = MAX_STACKS) -> None:
        self._stacks: collections.OrderedDict[str, Stack] = collections.OrderedDict()
        self._limit = limit

    def __contains__(self, sid: str) -> bool:
        return sid in self._stacks

    def __len__(self) -> int:
        return len(self._stacks)

    def add(self, s: pb.Stack) -> None:
        if s.id in self._stacks:
            self._stacks.move_to_end(s.id)
            return
        self._stacks[s.id] = Stack(
            frames=tuple(Frame(f.name, f.filename, f.line) for f in s.frames),
            thread_name=s.thread_name,
        )
        while len(self._stacks) > self._limit:
            self._stacks.popitem(last=False)

    def get(self, sid: str) -> Stack | None:
        return self._stacks.get(sid)

    def touch(self, sid: str) -> bool:
        if sid in self._stacks:
            self._stacks.move_to_end(sid)
            return True
        return False


class JobTable:
    """All jobs and agents this daemon knows. Mutated only on the event loop."""

    def __init__(self, staleness: float = 10.0) -> None:
        self.jobs: dict[str, Job] = {}
        self.agents: dict[str, AgentRecord] = {}
        self.stacks = StackStore()
        self.staleness = staleness
        self.dirty: set[str] = set()
        self.samples_total = 0
        self.reports_total = 0
        self.duplicates_total = 0

    def apply(self, report: pb.NodeReport, recv: float, recv_wall: float | None = None) -> list[str]:
        """Apply a validated report; return stack ids the daemon lacks."""
        agent = self.agents.get(report.agent_id)
        if agent is None:
            agent = self.agents[report.agent_id] = AgentRecord(report.agent_id, report.node)
        elif report.seq <= agent.last_seq:
            # Resent after a lost acknowledgement: already applied (or older).
            self.duplicates_total += 1
            return []
        elif report.seq > agent.last_seq + 1:
            agent.gaps_total += report.seq - agent.last_seq - 1
        agent.last_seq = report.seq
        agent.last_recv = recv
        agent.last_recv_wall = recv_wall if recv_wall is not None else time.time()
        agent.interval = report.interval_seconds or agent.interval
        agent.health = report.health
        agent.reports_total += 1
        self.reports_total += 1

        for s in report.stacks:
            self.stacks.add(s)
        missing: list[str] = []
        reported: set[tuple[str, int]] = set()
        for s in report.samples:
            ident = s.identity
            job = self.jobs.get(ident.job_id)
            if job is None:
                job = self.jobs[ident.job_id] = Job(ident.job_id, ident.world_size, recv)
            rec = job.ranks.get(ident.rank)
            if rec is None:
                rec = job.ranks[ident.rank] = RankRecord(ident.rank)
            elif rec.gone_at is not None:
                rec.gone_at = None
            state = RankState.from_proto(s.state)
            op = CollectiveOp.from_proto(s.op)
            since = recv - s.state_seconds
            if state is not rec.state or op is not rec.op or rec.pid != ident.pid:
                job.set_state(rec, state, op)
                rec.since = since
            else:
                # Same state: keep the earliest anchor, immune to network jitter.
                rec.since = min(rec.since, since)
            p = s.process
            if rec.seen and p.io_write_bytes >= rec.io_write_bytes and recv > rec.seen:
                rate = (p.io_write_bytes - rec.io_write_bytes) / (recv - rec.seen)
                rec.write_rate = 0.5 * rec.write_rate + 0.5 * rate
            rec.io_write_bytes = p.io_write_bytes
            rec.local_rank = ident.local_rank
            rec.node = report.node
            rec.agent_id = report.agent_id
            rec.pid = ident.pid
            rec.seen = recv
            rec.cpu_util = p.cpu_utilization
            rec.rss_bytes = p.rss_bytes
            rec.files = tuple((f.path, f.size_bytes, f.previous_path, f.previous_size_bytes)
                              for f in p.files_writing)
            rec.gpu = tuple((g.device_index, g.used_bytes, g.device_total_bytes) for g in s.gpu)
            rec.vms_bytes = p.vms_bytes
            rec.limits = tuple(
                (LIMIT_NAMES.get(m.kind, "host"), m.used_bytes, m.limit_bytes)
                for m in p.memory_limits if m.limit_bytes > 0
            ) + tuple((f"gpu{g.device_index}", g.device_used_bytes, g.device_total_bytes)
                      for g in s.gpu if g.device_total_bytes > 0)
            rec.record(recv)
            if s.stack_id and s.stack_id != rec.stack_id and not self.stacks.touch(s.stack_id):
                missing.append(s.stack_id)
            rec.stack_id = s.stack_id
            # The state is what the stack of stack_age_seconds ago showed.
            rec.stack_at = recv - s.stack_age_seconds if state is not RankState.UNKNOWN else None
            if s.HasField("job"):
                job.source = s.job.source
                if dict(s.job.env) != job.env:
                    job.env = dict(s.job.env)
                    job.warnings = lint(job.env)
                job.declared_timeout = s.job.watchdog_timeout_seconds
            job.last_update = recv
            reported.add((ident.job_id, ident.rank))
            self.dirty.add(ident.job_id)
        self.samples_total += len(report.samples)

        for ident in report.exited:
            self._gone(ident.job_id, ident.rank, ident.pid, recv)
        if report.full_round:
            for job_id, rank in agent.ranks - reported:
                self._gone(job_id, rank, None, recv)
            agent.ranks = reported
        else:
            agent.ranks |= reported
        return missing

    def _gone(self, job_id: str, rank: int, pid: int | None, now: float) -> None:
        job = self.jobs.get(job_id)
        rec = job.ranks.get(rank) if job else None
        if rec is None or rec.gone_at is not None or (pid is not None and rec.pid != pid):
            return
        rec.gone_at = now
        job.set_state(rec, RankState.UNKNOWN, CollectiveOp.NONE)
        rec.since = now
        self.dirty.add(job_id)

    def world_size(self, job_id: str) -> int | None:
        job = self.jobs.get(job_id)
        return job.world_size if job else None

    def fresh(self, rec: RankRecord, now: float) -> bool:
        """Whether a rank's latest sample can be trusted for a verdict now."""
        if rec.gone_at is not None:
            return False
        agent = self.agents.get(rec.agent_id)
        return agent is not None and not agent.stale(now, self.staleness)

    def expire(self, now: float) -> list[str]:
        """Forget jobs whose ranks are all gone (or silent) for a while."""
        dead = []
        for job_id, job in self.jobs.items():
            if now - job.last_update < GONE_JOB_TTL:
                continue
            if all(r.gone_at is not None or not self.fresh(r, now) for r in job.ranks.values()):
                dead.append(job_id)
        for job_id in dead:
            del self.jobs[job_id]
        for agent_id in [a for a, rec in self.agents.items()
                         if not rec.connected and now - rec.last_recv > GONE_JOB_TTL]:
            del self.agents[agent_id]
        return dead
