"""Each job's rank table: the latest sample per rank, and since-when.

Durations use the agent's monotonic clock (ages in the report) anchored at
the daemon's receive time, so clocks of different nodes never meet. Per-job
indexes (ranks by state, ranks in a collective) are updated on each change,
so detection reads a few sets instead of rescanning the table.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from array import array
from dataclasses import dataclass, field
from collections.abc import Collection
from typing import Any

from ncclwatch.envlint import EnvWarning, lint
from ncclwatch.daemon.waits import WaitLearner
from ncclwatch.flightrec import is_default_group
from ncclwatch.model import CollectiveOp, RankState, WaitEvidence
from ncclwatch.stacks import Frame, Stack
from ncclwatch.v1 import collector_pb2 as pb

log = logging.getLogger(__name__)

#: Stacks kept by content id; least recently referenced go first.
MAX_STACKS = 200_000
#: Packages kept per job (Job.packages).
MAX_PACKAGES = 128
#: Timeout changes kept per job (Job.timeout_changes).
TIMEOUT_CHANGES = 8
#: A job whose ranks are all gone is forgotten after this long.
GONE_JOB_TTL = 120.0
#: A state's start moving later by more than this on the agent's clock: a new
#: episode of it (the agent re-anchors a wait it saw the rank progress out of).
NEW_EPISODE = 0.5
#: Seconds of reports the transit-free clock offset is the minimum over
#: (AgentRecord.clock_offset).
CLOCK_WINDOW = 30.0
#: A transit longer than this is taken for a clock that stopped or jumped.
CLOCK_JUMP = 10.0
#: Evidence curve per rank: points at least this far apart, this many kept.
CURVE_STEP = 0.9
CURVE_POINTS = 90
#: ... and none older than this before the newest: a steady rank (protocol 2
#: sends it in full once a snapshot) keeps a handful of points, not 90.
CURVE_SPAN = CURVE_POINTS * CURVE_STEP


class Point:
    """One point of a rank's evidence curve (memory, I/O, the file it writes)."""

    __slots__ = ("t", "rss", "written", "file", "file_size", "limits")

    def __init__(self, t: float, rss: int, written: int, file: str, file_size: int,
                 limits: tuple[tuple[str, int, int], ...]) -> None:
        self.t, self.rss, self.written = t, rss, written
        self.file, self.file_size = file, file_size
        self.limits = limits


#: Detail (all but time and RSS) is kept for points this close to the newest:
#: forecasts fit over the last forecast.WINDOW seconds before "now" (never
#: earlier than the newest point), so older detail is never read.
CURVE_DETAIL = 15.0
#: Device-name tuples of memory bounds, shared between points (bounded).
_SHAPES: dict[tuple[str, ...], tuple[str, ...]] = {}


class Curve:
    """A rank's evidence curve, kept as machine numbers rather than objects.

    Every rank has one (any rank can turn culprit, and its forecast then
    needs the minute before), so at 16k ranks the curves are most of the
    daemon's memory. A curve of ``Point`` objects with their tuples cost
    ~80 KiB per rank; here it is two rings of ``array`` values:

    - time and RSS of the last ``CURVE_POINTS`` points (``gathered_bytes``
      looks for the RSS before the rank's state began);
    - bytes written, the file being written and the memory bounds for the
      points within ``CURVE_DETAIL`` seconds of the newest (rate fits).

    ``recent()`` rebuilds those points as ``Point`` objects on demand:
    forecasts run for culprits only.
    """

    __slots__ = ("t", "rss", "_written", "_file", "_shape", "_bounds", "_detail")

    def __init__(self) -> None:
        self.t = array("d")
        self.rss = array("Q")
        self._detail = 0                          # points with detail: the newest ones
        self._written = array("Q")
        self._file: list[tuple[str, int] | None] = []
        self._shape: list[tuple[str, ...]] = []   # device names of each point's bounds
        self._bounds = array("Q")                 # used, limit per device, point after point

    def __len__(self) -> int:
        return len(self.t)

    def add(self, t: float, rss: int, written: int,
            files: tuple[tuple[str, int, str, int, int, str], ...],
            limits: tuple[tuple[str, int, int], ...]) -> None:
        """Append a point unless the newest is less than ``CURVE_STEP`` old."""
        ts = self.t
        if ts and t - ts[-1] < CURVE_STEP:
            return
        ts.append(t)
        self.rss.append(rss)
        old = 0
        while len(ts) - old > CURVE_POINTS or ts[old] < t - CURVE_SPAN:
            old += 1  # never the newest: t - CURVE_SPAN < t
        if old:
            del ts[:old]
            del self.rss[:old]
        self._written.append(written)
        self._file.append((files[0][0], files[0][1]) if files else None)
        names = tuple([d for d, _, _ in limits])
        self._shape.append(_SHAPES.setdefault(names, names) if len(_SHAPES) < 4096 else names)
        for _, used, limit in limits:
            self._bounds.append(used)
            self._bounds.append(limit)
        self._detail += 1
        # Drop detail older than CURVE_DETAIL (and any the time ring has dropped).
        first = len(ts) - self._detail
        while self._detail > 1 and (first < 0 or t - ts[first] > CURVE_DETAIL):
            del self._written[0]
            del self._file[0]
            del self._bounds[:2 * len(self._shape.pop(0))]
            self._detail -= 1
            first += 1

    def recent(self) -> list[Point]:
        """The points within ``CURVE_DETAIL`` of the newest, oldest first."""
        out, j = [], 0
        first = len(self.t) - self._detail
        b = self._bounds
        for i in range(self._detail):
            names = self._shape[i]
            limits = tuple([(d, b[j + 2 * k], b[j + 2 * k + 1]) for k, d in enumerate(names)])
            j += 2 * len(names)
            f = self._file[i]
            out.append(Point(self.t[first + i], self.rss[first + i], self._written[i],
                             f[0] if f else "", f[1] if f else 0, limits))
        return out

    def rss_points(self) -> zip:
        """(time, RSS) of every point, oldest first."""
        return zip(self.t, self.rss)


#: Where an agent may say a file's expected size came from (anything else is dropped).
_SIZE_SOURCES = {s: s for s in ("torch_zip_header", "safetensors_header", "copy_source")}
LIMIT_NAMES = {
    pb.MEMORY_LIMIT_KIND_HOST: "host",
    pb.MEMORY_LIMIT_KIND_CGROUP: "cgroup",
    pb.MEMORY_LIMIT_KIND_ADDRESS_SPACE: "address_space",
}
#: Wire values -> enums, looked up per sample (from_proto goes through names).
_STATE_OF = {v: RankState.from_proto(v) for v in pb.RankState.values()}
_OP_OF = {v: CollectiveOp.from_proto(v) for v in pb.CollectiveOp.values()}
_EVIDENCE_OF = {v: WaitEvidence.from_proto(v) for v in pb.WaitEvidence.values()}
_GPU_NAMES = {i: f"gpu{i}" for i in range(64)}


_TIMEOUT_FIELD = {"flight_recorder": "fr_timeout", "job": "declared_timeout"}


def _set_timeout(job: Job, what: str, value: float, recv: float, node: str, rank: int) -> None:
    """A timeout that sets the job's budget; a change of a known one is logged
    and kept (Job.timeout_changes): the budget moves with it."""
    attr = _TIMEOUT_FIELD[what]
    old = getattr(job, attr)
    if value == old:
        return
    setattr(job, attr, value)
    if old and value and not any(c[1] == what and c[3] == value for c in job.timeout_changes):
        job.timeout_changes.append((recv, what, old, value, node, rank))
        log.warning("job %r: %s timeout changed from %gs to %gs (node %r, rank %d)",
                    job.job_id, what, old, value, node, rank)


def _owns_ranked(job: Job, node: str) -> bool:
    return any(k >= 0 and r.node == node and r.gone_at is None for k, r in job.ranks.items())


def _gpu_name(index: int) -> str:
    """``gpu<index>``, one shared string per common index."""
    return _GPU_NAMES.get(index) or f"gpu{index}"


#: Seconds over which ``RankRecord.cpu_recent`` forgets: a rank that stopped
#: computing reads idle after a few of them, one starved round does not.
CPU_RECENT_TAU = 2.0


def _smooth(avg: float, value: float, dt: float) -> float:
    """Exponential average of CPU use over ``CPU_RECENT_TAU`` seconds."""
    if dt <= 0 or dt > 60 * CPU_RECENT_TAU:
        return value
    a = 1.0 - math.exp(-dt / CPU_RECENT_TAU)
    return avg + a * (value - avg)


def _progress(job: Job, rec: RankRecord, still: float, changed: bool, recv: float,
              interval: float) -> None:
    """Apply a progress reading (still_seconds) to the rank and its job's learner."""
    if still <= 0 and rec.still_since is not None:
        job.waits.still_ended(recv - rec.still_since)
        rec.still_ended(recv - rec.still_since)
    if still <= 0:
        rec.moved_rounds += 1
        rec.moved_last = recv
        if rec.moved_first is None:
            rec.moved_first = recv
    if still > 0:
        rec.still_since = recv - still
        job.still.add(rec.rank)
    else:
        rec.still_since = None
        job.still.discard(rec.rank)
    _follow_wait(job, rec, rec.state, rec.op, still, changed, recv, interval)


def _follow_wait(job: Job, rec: RankRecord, state: RankState, op: CollectiveOp,
                 still: float, changed: bool, recv: float, interval: float) -> None:
    """Track the rank's still wait and teach the job's learner when one ends.

    A wait is the run of rounds a rank sits still in one op. It ends when the
    rank makes progress or its stack shows another state; its length is
    taken up to this report (an upper bound: the learner errs long).
    """
    if op is CollectiveOp.NONE and state is not RankState.DEVICE_WAIT:
        wop = CollectiveOp.NONE
    else:
        wop = op if op is not CollectiveOp.NONE else CollectiveOp.WAIT
    if rec.still_at is not None and (changed or still <= 0 or wop is not rec.still_op):
        job.waits.ended(rec.still_op, recv - rec.still_at, recv)
        rec.still_at = None
    if still <= 0:
        job.waits.stepped(recv)
    if wop is CollectiveOp.NONE:
        return
    if still <= 0:
        # Progress after the stack that placed the rank in the op: it got out.
        # (Progress in the round the stack was taken may be how it got in.)
        if rec.stack_at is not None and recv - rec.stack_at >= interval:
            job.waits.progressed(wop, recv)
    elif rec.still_at is None and rec.stack_at is not None and rec.stack_at >= recv - still:
        # Only a stack taken while the rank sat still says where it sits.
        rec.still_at = max(rec.since, recv - still)
        rec.still_op = wop


#: Ended still periods per bucket of a rank's rolling normal (RankRecord.still_normal).
STILL_RECENT = 8


class RankRecord:
    __slots__ = (
        "rank", "local_rank", "node", "agent_id", "pid", "state", "op", "since",
        "stack_id", "seen", "cpu_util", "cpu_recent", "cpu_seconds", "rss_bytes", "io_write_bytes", "write_rate",
        "files", "gpu", "gone_at", "vms_bytes", "limits", "curve", "stack_at",
        "rank_source", "container",
        "still_since", "still_at", "still_op", "since_agent", "progress_known",
        "_still_normal", "_still_before", "_still_count",
        "moved_rounds", "moved_first", "moved_last",
        "file_first", "evidence", "native_frame", "native_no_wait", "start",
    )

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.local_rank = -1
        self.node = ""
        self.agent_id = ""
        self.pid = 0
        # (path, bytes written by the rank, file size) when the file it writes was
        # first seen: a preallocated file is full-size from the start, so its
        # progress is the rank's own writes since (forecast.write_forecast).
        self.file_first: tuple[str, int, int] = ("", 0, 0)
        self.state = RankState.UNKNOWN
        self.op = CollectiveOp.NONE
        self.since = 0.0
        self.stack_id = ""
        self.seen = 0.0
        self.cpu_util = 0.0
        # cpu_util smoothed over the last seconds (CPU_RECENT_TAU): one round's
        # reading of a starved or just-sampled rank can be near 0 while it computes.
        self.cpu_recent = 0.0
        self.cpu_seconds = 0.0
        self.rss_bytes = 0
        self.io_write_bytes = 0
        self.write_rate = 0.0
        # (path, size, previous checkpoint path, its size, expected size, its source):
        # the expected size as the agent read it from the file (0, "": unknown)
        self.files: tuple[tuple[str, int, str, int, int, str], ...] = ()
        # (device, used by this process, total); device-wide use is in limits
        self.gpu: tuple[tuple[int, int, int], ...] = ()
        self.gone_at: float | None = None
        self.vms_bytes = 0
        # (kind, used, limit): host, cgroup, address_space, gpu<i>
        self.limits: tuple[tuple[str, int, int], ...] = ()
        self.curve = Curve()
        # When the stack that gave ``state`` was taken (daemon clock), None: never.
        self.stack_at: float | None = None
        # How the agent identified the rank ("env:RANK", "spawn_index", "unknown", ...).
        self.rank_source = ""
        # (container pid, hostname, container id, runtime, pod uid, namespace,
        # pod, declared namespace, declared pod) of a rank in a container
        # (ContainerInfo), None on the host.
        self.container: tuple[int, str, str, str, str, str, str, str, str] | None = None

        # Since when the rank has made no progress, whatever its state (daemon
        # clock); None: it made some in its last round, or no reading.
        self.still_since: float | None = None
        # ``since`` on the agent's own clock: a later start of the same state
        # there is a new wait (the agent saw progress in between), not jitter.
        self.since_agent = 0.0
        # Whether the agent reports progress (still_seconds) for this rank.
        self.progress_known = False
        # Its normal still periods (those that ended in progress): the longest
        # of the last STILL_RECENT to 2 x STILL_RECENT (a rolling max in two
        # buckets, three slots a rank); a GPU rank sits still through each step.
        self._still_normal = 0.0
        self._still_before = 0.0
        self._still_count = 0
        # Its rounds with progress, and the first and last of them (daemon
        # clock): a rank that moved only while it started (a GPU rank fed by
        # shared memory or mmap is still through every step) has shown no
        # normal, and its stillness says nothing (shape.stepped).
        self.moved_rounds = 0
        self.moved_first: float | None = None
        self.moved_last: float | None = None
        # Since when the rank has sat still (no progress) in its current wait,
        # daemon clock, and in which op; None: not in a still wait (or no reading).
        self.still_at: float | None = None
        self.still_op = CollectiveOp.NONE
        # How the agent established the rank's waiting (WaitEvidence), the native
        # frame that said so, and whether a native dump of its current still
        # period found no wait ("still, reason unknown").
        self.evidence = WaitEvidence.NONE
        self.native_frame = ""
        self.native_no_wait = False
        # When its process started (daemon clock, from the agent's process age);
        # None: not known. Evidence when two nodes claim the rank (ownership.py).
        self.start: float | None = None

    def still_ended(self, seconds: float) -> None:
        """A still period of this rank ended in progress after ``seconds``."""
        if self._still_count >= STILL_RECENT:
            self._still_before, self._still_normal, self._still_count = \
                self._still_normal, 0.0, 0
        self._still_normal = max(self._still_normal, seconds)
        self._still_count += 1

    @property
    def still_normal(self) -> float:
        """The longest recent still period that ended normally (0: none seen)."""
        return max(self._still_normal, self._still_before)


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
    #: Ranks sitting still now (still_since set): the job's shape is read
    #: only when some rank is (detect/shape.py).
    still: set[int] = field(default_factory=set)
    last_update: float = 0.0
    #: Settings in the job's environment that defeat the watchdog or evidence.
    warnings: tuple[EnvWarning, ...] = ()
    #: (fresh-agents set it was made with, records): detect.fresh_waiting's
    #: list for the current tick, shared by the detectors.
    fresh_waiting: Any = field(default=None, repr=False, compare=False)
    #: rank -> (daemon time the dump was written, its FlightRecorderSummary): the
    #: job's own record of its collectives, asked for during a stall.
    flight_recorder: dict[int, tuple[float, Any]] = field(default_factory=dict)
    #: The process-group timeout a Flight Recorder dump states (timeout_ms), seconds.
    fr_timeout: float = 0.0
    #: How the batch scheduler names the job (scheduler, job_id, job_name, user,
    #: source), as the agent found it; None: not under a scheduler, or not yet known.
    scheduler_job: dict[str, str] | None = None
    #: A ranked member set the job-level facts (env, timeout, scheduler names,
    #: Flight Recorder timeout): members without a rank may no longer replace them.
    facts_ranked: bool = False
    #: Top-level packages the ranks imported (JobInfo.packages, by the agents'
    #: evidence), what decides the job's framework (frameworks.py); bounded.
    packages: frozenset[str] = frozenset()
    #: Changes of a timeout that sets the budget once it was known: (daemon
    #: time, "flight_recorder" or "job", old seconds, new seconds, node, rank);
    #: the newest TIMEOUT_CHANGES kept, each logged (the API and status show them).
    timeout_changes: collections.deque = field(
        default_factory=lambda: collections.deque(maxlen=TIMEOUT_CHANGES))

    #: (node, pid) -> key of a member whose rank is unknown: -1, -2, ... in
    #: order of arrival, so such a member has a row, can wait or be a culprit.
    unknown_keys: dict[tuple[str, int], int] = field(default_factory=dict)

    def key_of(self, rank: int, node: str, pid: int, create: bool = True) -> int | None:
        """The table key of a reported rank: the rank itself, or a member's key."""
        if rank >= 0:
            return rank
        key = self.unknown_keys.get((node, pid))
        if key is None and create:
            key = self.unknown_keys[(node, pid)] = -1 - len(self.unknown_keys)
        return key

    @property
    def unidentified(self) -> int:
        """Live members whose rank is unknown (each is one of the missing numbers)."""
        return sum(1 for k, r in self.ranks.items() if k < 0 and r.gone_at is None)

    #: How long this job's ranks normally sit still in each collective op.
    waits: WaitLearner = field(default_factory=WaitLearner)

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
        self.still.discard(rec.rank)

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
    #: Jobs this agent reported that the table still holds (live or gone, until
    #: they expire): what bounds.max_jobs_per_agent counts.
    jobs: set[str] = field(default_factory=set)
    commands: collections.deque = field(default_factory=lambda: collections.deque(maxlen=64))
    #: Protocol 2: slot -> (job, rank record, (job id, rank)) of this agent's
    #: stream; None: a rank of a job left out of the report (briefs skip it).
    slots: dict[int, Any] = field(default_factory=dict)
    #: Briefs named slots not held: ask the agent for full samples (once).
    resync: bool = False
    briefs_total: int = 0
    changes_total: int = 0
    #: Briefs and changes that named a slot not held.
    briefs_unresolved_total: int = 0

    #: (receipt, recv - agent clock) of recent reports, offsets increasing:
    #: the sliding minimum of ``clock_offset`` (an upper bound on the offset).
    _offsets: collections.deque = field(default_factory=collections.deque)
    #: (receipt, a lower bound on the offset) from timed acknowledgements,
    #: bounds decreasing: their sliding maximum.
    _lows: collections.deque = field(default_factory=collections.deque)
    #: seq -> recv - agent clock of recent reports, for their timed acks.
    _by_seq: dict = field(default_factory=dict)
    _last_clock: float = 0.0

    def stale(self, now: float, staleness: float) -> bool:
        return now - self.last_recv > max(staleness, 3 * self.interval)

    def clock_offset(self, recv: float, agent_clock: float, seq: int = 0,
                     timed_seq: int = 0, round_trip: float = 0.0) -> float:
        """Daemon time minus agent time, no larger than it truly is when the
        agent times its acknowledgements, and with as little transit in it
        as the reports allow when it does not.

        ``recv - agent_clock`` holds the clocks' offset plus this report's
        transit (queueing in the agent, the network, the daemon's loop): an
        anchor at ``recv`` puts every age in the report that much late, and a
        late start makes the watchdog budget err large. Each report bounds the
        offset from above; the smallest bound of the last CLOCK_WINDOW seconds
        wins (a window, not all time: two hosts' clocks drift, a paused VM's
        stops). A timed acknowledgement (report ``timed_seq`` was acknowledged
        ``round_trip`` after it was built) bounds that report's transit, so
        its ``recv - clock - round_trip`` bounds the offset from below: the
        largest such bound of the window is the offset used, and ages count
        back from no later than the truth, whatever the transit. An agent
        clock that went back (a new agent process), or fell behind by more
        than CLOCK_JUMP (a suspended host: its waits would be dated that much
        early), starts afresh.
        """
        off = recv - agent_clock
        q, lows = self._offsets, self._lows
        if agent_clock <= 0 or agent_clock < self._last_clock \
                or (q and off - q[0][1] > CLOCK_JUMP):
            q.clear()
            lows.clear()
            self._by_seq.clear()
        self._last_clock = agent_clock
        if agent_clock <= 0:
            return off  # no clock in the report: anchor at receipt
        while q and q[-1][1] >= off:
            q.pop()
        q.append((recv, off))
        while q[0][0] < recv - CLOCK_WINDOW:
            q.popleft()
        timed = self._by_seq.pop(timed_seq, None) if timed_seq else None
        if seq:
            self._by_seq[seq] = off
            if len(self._by_seq) > 128:
                del self._by_seq[next(iter(self._by_seq))]
        # A bound far below the upper one (a round trip of more than
        # CLOCK_JUMP) says little and may come from a clock that jumped.
        if timed is not None and 0 <= round_trip <= CLOCK_JUMP:
            low = timed - round_trip
            while lows and lows[-1][1] <= low:
                lows.pop()
            lows.append((recv, low))
        while lows and lows[0][0] < recv - CLOCK_WINDOW:
            lows.popleft()
        return min(lows[0][1], q[0][1]) if lows else q[0][1]


def _text_of(st: Stack) -> int:
    return len(st.thread_name) + sum(len(f.name) + len(f.filename) for f in st.frames)


class StackStore:
    """Interned stacks by id, bounded LRU."""

    def __init__(self, limit: int = MAX_STACKS, max_bytes: int = 64 << 20) -> None:
        self._stacks: collections.OrderedDict[str, Stack] = collections.OrderedDict()
        self._limit = limit
        #: Text (names, file names) of the stacks kept, and its bound: by
        #: count alone 30 reports of 9 MB stacks took 270 MiB (issue 20).
        self.max_bytes = max_bytes
        self.bytes = 0
        #: Stacks evicted to stay under ``max_bytes`` (a bound hit each).
        self.evicted_for_bytes_total = 0

    def __contains__(self, sid: str) -> bool:
        return sid in self._stacks

    def __len__(self) -> int:
        return len(self._stacks)

    def add(self, s: pb.Stack) -> None:
        if s.id in self._stacks:
            self._stacks.move_to_end(s.id)
            return
        st = self._stacks[s.id] = Stack(
            frames=tuple(Frame(f.name, f.filename, f.line) for f in s.frames),
            thread_name=s.thread_name,
        )
        self.bytes += _text_of(st)
        while len(self._stacks) > self._limit:
            self.bytes -= _text_of(self._stacks.popitem(last=False)[1])
        while self.bytes > self.max_bytes and len(self._stacks) > 1:
            self.bytes -= _text_of(self._stacks.popitem(last=False)[1])
            self.evicted_for_bytes_total += 1

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
        self._fresh_agents: tuple[float, set[str]] | None = None
        #: Rank samples applied by the form they came in (protocol 2), and the
        #: resyncs asked for (briefs or changes naming slots not held).
        self.forms_total = {"full": 0, "change": 0, "brief": 0}
        self.resyncs_total = 0
        #: Parts of reports refused because the node does not own them, by what.
        self.identity_refusals_total: collections.Counter[str] = collections.Counter()

    def apply(self, report: pb.NodeReport, recv: float, recv_wall: float | None = None,
              left_out: Collection[str] = (), left_out_slots: Collection[int] = ()) -> list[str]:
        """Apply a validated report; return stack ids the daemon lacks.

        ``left_out``: jobs whose samples were taken out of the report (rejected):
        a full round without them says nothing about their ranks, and
        ``left_out_slots`` (their samples' slots) are skipped by later briefs."""
        self._fresh_agents = None
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
        briefs = report.briefs.slot
        if report.slots_reset:
            agent.slots = {}
        # A full round of full samples names every live rank of the stream:
        # its slots replace the table (slots of ranks gone are dropped).
        slots = agent.slots if briefs or report.changes or not report.full_round else {}
        for slot in left_out_slots:
            slots[slot] = None
        agent.reports_total += 1
        self.reports_total += 1

        for s in report.stacks:
            self.stacks.add(s)
        missing: list[str] = []
        reported: set[tuple[str, int]] = set()
        # The hot loop (bench/daemon_ingest.py): each protobuf field is read
        # once, and strings every rank shares (node, agent, job id) are kept
        # as one object each, not one per rank.
        node = report.node
        if node == agent.node:
            node = agent.node
        agent_id = agent.agent_id
        agent_clock = report.agent_monotonic_seconds
        anchor = agent.clock_offset(recv, agent_clock, report.seq, report.timed_seq,
                                    report.timed_round_trip_seconds) + agent_clock  # <= recv
        jobs = self.jobs
        job: Job | None = None
        for s in report.samples:
            ident = s.identity
            job_id = ident.job_id
            if job is None or job_id != job.job_id:
                job = jobs.get(job_id)
                if job is None:
                    job = jobs[job_id] = Job(job_id, ident.world_size, recv)
                self.dirty.add(job.job_id)
                agent.jobs.add(job.job_id)
            rank, pid = ident.rank, ident.pid
            if rank < 0:
                rank = job.key_of(rank, node, pid)
            if not job.world_size and ident.world_size:
                job.world_size = ident.world_size  # PMIx ranks do not say it
            rec = job.ranks.get(rank)
            if rec is None:
                rec = job.ranks[rank] = RankRecord(rank)
            elif rec.gone_at is not None:
                rec.gone_at = None
            changed = self._take_state(job, rec, s, anchor, agent_clock, missing, rec.pid != pid)
            p = s.process
            written = p.io_write_bytes
            if rec.seen and written >= rec.io_write_bytes and recv > rec.seen:
                rate = (written - rec.io_write_bytes) / (recv - rec.seen)
                rec.write_rate = 0.5 * rec.write_rate + 0.5 * rate
            rec.io_write_bytes = written
            rec.local_rank = ident.local_rank
            rec.rank_source = ident.rank_source
            if ident.HasField("container"):
                c = ident.container
                rec.container = (c.container_pid, c.hostname, c.container_id, c.runtime,
                                 c.pod_uid, c.namespace, c.pod, c.declared_namespace,
                                 c.declared_pod)
            else:
                rec.container = None
            rec.node = node
            rec.agent_id = agent_id
            rec.pid = pid
            age = ident.process_age_seconds
            rec.start = recv - age if age > 0 else None
            rec.cpu_recent = _smooth(rec.cpu_recent, p.cpu_utilization, recv - rec.seen)
            rec.seen = recv
            rec.cpu_util = p.cpu_utilization
            rec.cpu_seconds = p.cpu_seconds
            rec.rss_bytes = p.rss_bytes
            files = p.files_writing
            rec.files = tuple([(f.path, f.size_bytes, f.previous_path, f.previous_size_bytes,
                                f.expected_size_bytes, _SIZE_SOURCES.get(f.expected_source, ""))
                               for f in files]) if files else ()
            if files and files[0].path != rec.file_first[0]:
                rec.file_first = (files[0].path, written, files[0].size_bytes)
            rec.vms_bytes = p.vms_bytes
            limits = [(LIMIT_NAMES.get(m.kind, "host"), m.used_bytes, lim)
                      for m in p.memory_limits if (lim := m.limit_bytes) > 0]
            gpus = s.gpu
            if gpus:
                rec.gpu = tuple([(g.device_index, g.used_bytes, g.device_total_bytes)
                                 for g in gpus])
                limits += [(_gpu_name(g.device_index), g.device_used_bytes, total)
                           for g in gpus if (total := g.device_total_bytes) > 0]
            else:
                rec.gpu = ()
            rec.limits = tuple(limits)
            rec.curve.add(recv, rec.rss_bytes, written, rec.files, rec.limits)  # downsampled
            if s.HasField("still_seconds"):
                rec.progress_known = True
                _progress(job, rec, s.still_seconds, changed, recv, agent.interval)
            elif rec.progress_known:
                rec.progress_known = False
                rec.still_since = rec.still_at = None
                job.still.discard(rec.rank)
            # Job-level facts come from the nodes that own ranked members (a
            # ranked sample here is its owner's: ownership.py set the others
            # aside). A member without a rank proves no place in the job: it may
            # fill in facts nobody ranked gave, or speak for a node that owns a
            # ranked member, never replace them otherwise.
            has_facts = s.HasField("flight_recorder") or s.HasField("job")
            facts = has_facts and (ident.rank >= 0 or not job.facts_ranked
                                   or _owns_ranked(job, node))
            if has_facts and not facts:
                self.identity_refusals_total["rankless_job_facts"] += 1
            if facts and s.HasField("flight_recorder"):
                job.facts_ranked |= ident.rank >= 0
                fr = s.flight_recorder
                job.flight_recorder[rank] = (recv - fr.dump_age_seconds, fr)
                for g in fr.groups:
                    if g.pending_timeout_ms and (is_default_group(g.pg_name, g.pg_desc)
                                                 or not job.fr_timeout):
                        _set_timeout(job, "flight_recorder", g.pending_timeout_ms / 1000.0,
                                     recv, node, ident.rank)
            if facts and s.HasField("job"):
                info = s.job
                job.facts_ranked |= ident.rank >= 0
                job.source = info.source
                env = dict(info.env)
                if env != job.env:
                    job.env = env
                    job.warnings = lint(job.env)
                _set_timeout(job, "job", info.watchdog_timeout_seconds, recv, node, ident.rank)
                if info.packages and not job.packages.issuperset(info.packages):
                    job.packages = frozenset(sorted(job.packages.union(info.packages))
                                             [:MAX_PACKAGES])
                if info.HasField("scheduler_job"):
                    sj = info.scheduler_job
                    job.scheduler_job = {"scheduler": sj.scheduler, "job_id": sj.job_id,
                                         "job_name": sj.job_name, "user": sj.user,
                                         "source": sj.source}
            job.last_update = recv
            key = (job.job_id, rank)
            reported.add(key)
            if s.slot:
                slots[s.slot] = (job, rec, key)
        self.samples_total += len(report.samples)
        self.forms_total["full"] += len(report.samples)
        if report.changes:
            self._apply_changes(agent, report.changes, slots, reported, recv, anchor,
                                agent_clock, missing)
        if briefs:
            self._apply_briefs(agent, report.briefs, slots, reported, recv)
        agent.slots = slots

        for ident in report.exited:
            rank = ident.rank
            job = self.jobs.get(ident.job_id)
            if rank < 0:
                rank = job.key_of(rank, node, ident.pid, create=False) if job else None
                if rank is None:
                    continue
            rec = job.ranks.get(rank) if job else None
            if rec is not None and rec.node and rec.node != node:
                # Only the node that reports a rank may say it exited.
                self.identity_refusals_total["exited"] += 1
                continue
            self._gone(ident.job_id, rank, ident.pid, recv)
        if report.full_round:
            kept = {jr for jr in agent.ranks if jr[0] in left_out} if left_out else set()
            for job_id, rank in agent.ranks - reported - kept:
                self._gone(job_id, rank, None, recv, agent_id)
            agent.ranks = reported | kept
        else:
            agent.ranks |= reported
        return missing

    def _take_state(self, job: Job, rec: RankRecord, m: Any, anchor: float, agent_clock: float,
                    missing: list[str], moved: bool = False) -> bool:
        """State, op, since and stack of a RankSample or a RankChange (the same
        fields); True when the rank entered a new state (or ``moved``: a new pid).

        ``anchor``: the daemon time the report's ages count back from, the
        moment the agent built it as best known (AgentRecord.clock_offset),
        never later than its receipt."""
        state = _STATE_OF.get(m.state) or RankState.from_proto(m.state)
        op = _OP_OF.get(m.op) or CollectiveOp.from_proto(m.op)
        since = anchor - m.state_seconds
        since_agent = agent_clock - m.state_seconds
        changed = moved or state is not rec.state or op is not rec.op
        if changed or since_agent > rec.since_agent + NEW_EPISODE:
            changed = True
            job.set_state(rec, state, op)
            rec.since = since
        elif since < rec.since:
            # Same state: keep the earliest anchor, immune to network jitter.
            rec.since = since
        rec.since_agent = since_agent
        ev = m.evidence
        rec.evidence = _EVIDENCE_OF[ev] if ev in _EVIDENCE_OF else WaitEvidence.from_proto(ev)
        rec.native_frame = m.native_frame
        rec.native_no_wait = m.native_no_wait
        sid = m.stack_id
        if sid != rec.stack_id:
            if sid and not self.stacks.touch(sid):
                missing.append(sid)
            rec.stack_id = sid
        # The state is what the stack of stack_age_seconds ago showed.
        rec.stack_at = anchor - m.stack_age_seconds if state is not RankState.UNKNOWN else None
        return changed

    def _resolve(self, agent: AgentRecord, slots: dict[int, Any], slot: int) -> Any:
        """The (job, record, key) a slot names; None: skip it; False: not held."""
        ent = slots.get(slot, False)
        if ent:
            job, rec, key = ent
            if rec.gone_at is not None or rec.agent_id != agent.agent_id \
                    or self.jobs.get(key[0]) is not job:
                return False
        return ent

    def _apply_changes(self, agent: AgentRecord, changes, slots: dict[int, Any],
                       reported: set[tuple[str, int]], recv: float, anchor: float,
                       agent_clock: float, missing: list[str]) -> None:
        """Ranks whose state, op, stack or state start moved: the state part of a
        full sample (``apply``), without the process stats it would repeat."""
        unresolved = 0
        for c in changes:
            ent = self._resolve(agent, slots, c.slot)
            if not ent:
                unresolved += ent is False
                continue
            job, rec, key = ent
            changed = self._take_state(job, rec, c, anchor, agent_clock, missing)
            cpu = c.cpu_utilization
            rec.cpu_recent = _smooth(rec.cpu_recent, cpu, recv - rec.seen)
            rec.seen = recv
            rec.cpu_util = cpu
            rec.cpu_seconds = c.cpu_seconds
            _progress(job, rec, c.still_seconds, changed, recv, agent.interval)
            self.dirty.add(key[0])
            job.last_update = recv
            reported.add(key)
        agent.changes_total += len(changes)
        self._counted(agent, "change", len(changes), unresolved)

    def _apply_briefs(self, agent: AgentRecord, b: pb.RankBriefs, slots: dict[int, Any],
                      reported: set[tuple[str, int]], recv: float) -> None:
        """Steady ranks: a proof of life, CPU and progress; nothing else moved.

        The hot path of protocol 2 (bench/daemon_ingest.py): a few attribute
        writes per rank. A slot the daemon does not hold (it restarted, or
        forgot the job) asks the agent to resync with full samples.
        """
        interval, dirty, resolve = agent.interval, self.dirty, self._resolve
        unresolved = 0
        last_dt, a = -1.0, 1.0  # the smoothing weight, shared by ranks seen together
        none, device_wait, wait = CollectiveOp.NONE, RankState.DEVICE_WAIT, CollectiveOp.WAIT
        for slot, still, cpu, cpu_s in zip(b.slot, b.still_seconds, b.cpu_utilization,
                                           b.cpu_seconds):
            ent = resolve(agent, slots, slot)
            if not ent:
                unresolved += ent is False  # None: a rank of a job this daemon left out
                continue
            job, rec, key = ent
            dt = recv - rec.seen
            if dt != last_dt:
                last_dt = dt
                a = 1.0 - math.exp(-dt / CPU_RECENT_TAU) if 0 < dt <= 60 * CPU_RECENT_TAU \
                    else 1.0
            rec.cpu_recent += a * (cpu - rec.cpu_recent)
            rec.seen = recv
            rec.cpu_util = cpu
            rec.cpu_seconds = cpu_s
            if still > 0 or rec.still_since is not None or rec.still_at is not None:
                _progress(job, rec, still, False, recv, interval)
                if still > 0:
                    dirty.add(key[0])  # a rank sitting still may be worth fresh stacks
            else:
                # _progress for a rank that made progress and was not still: the
                # common case, inlined (bench/daemon_ingest.py).
                waits = job.waits
                waits.stepped(recv)
                op = rec.op
                if (op is not none or rec.state is device_wait) and rec.stack_at is not None \
                        and recv - rec.stack_at >= interval:
                    waits.progressed(op if op is not none else wait, recv)
            job.last_update = recv
            reported.add(key)
        agent.briefs_total += len(b.slot)
        self._counted(agent, "brief", len(b.slot), unresolved)

    def _counted(self, agent: AgentRecord, form: str, n: int, unresolved: int) -> None:
        """Count ``n`` samples of a protocol-2 form; slots not held ask for a resync."""
        self.samples_total += n
        self.forms_total[form] += n
        if unresolved:
            agent.briefs_unresolved_total += unresolved
            agent.resync = True

    def _gone(self, job_id: str, rank: int, pid: int | None, now: float,
              agent_id: str | None = None) -> None:
        """``agent_id``: only if that agent still owns the rank (another node may
        have taken it over: ownership.py)."""
        job = self.jobs.get(job_id)
        rec = job.ranks.get(rank) if job else None
        if rec is None or rec.gone_at is not None or (pid is not None and rec.pid != pid) \
                or (agent_id is not None and rec.agent_id != agent_id):
            return
        rec.gone_at = now
        rec.still_at = None  # a wait cut short by exit is no normal wait
        job.set_state(rec, RankState.UNKNOWN, CollectiveOp.NONE)
        rec.since = now
        self.dirty.add(job_id)

    def resize(self, job_id: str, world: int, now: float) -> None:
        """The job runs at another world size now (ownership.resize): ranks
        beyond it are dropped (gone: their slots resync)."""
        job = self.jobs[job_id]
        job.world_size = world
        for key in [k for k in job.ranks if k >= world]:
            rec = job.ranks.pop(key)
            job.remove_from_indexes(rec)
            rec.gone_at = now
            job.flight_recorder.pop(key, None)
        self.dirty.add(job_id)

    def world_size(self, job_id: str) -> int | None:
        job = self.jobs.get(job_id)
        return job.world_size if job else None

    def fresh_agents(self, now: float) -> set[str]:
        """Agents whose reports can be trusted now; for the detectors on the loop.

        One pass over the agents per tick instead of an agent lookup per rank
        (100k ranks are 12.5k agents); forgotten by the next report applied.
        """
        cached = self._fresh_agents
        if cached is not None and cached[0] == now:
            return cached[1]
        staleness = self.staleness
        out = {aid for aid, a in self.agents.items() if not a.stale(now, staleness)}
        self._fresh_agents = (now, out)
        return out

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
            job = self.jobs.pop(job_id)
            for aid in {r.agent_id for r in job.ranks.values()}:
                if (agent := self.agents.get(aid)) is not None:
                    agent.jobs.discard(job_id)
        for agent_id in [a for a, rec in self.agents.items()
                         if not rec.connected and now - rec.last_recv > GONE_JOB_TTL]:
            del self.agents[agent_id]
        return dead
