"""What the daemon holds per rank and per job: the records the table fills.

``RankRecord``: a rank's latest state and since-when, its resources, its
history of stillness, its evidence curve. ``Job``: its ranks, the indexes
detection reads (ranks by state, in a collective, still), its environment
and timeouts.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Callable

from ncclwatch.daemon.curve import Curve
from ncclwatch.daemon.waits import WaitLearner
from ncclwatch.envlint import EnvWarning
from ncclwatch.model import CollectiveOp, RankState, WaitEvidence
from ncclwatch.stillness import StillHistory

_NO_OP, _DEVICE_WAIT = CollectiveOp.NONE, RankState.DEVICE_WAIT

#: Packages kept per job (Job.packages).
MAX_PACKAGES = 128
#: Timeout changes kept per job (Job.timeout_changes).
TIMEOUT_CHANGES = 8


class RankRecord:
    __slots__ = (
        "rank", "local_rank", "node", "agent_id", "pid", "state", "op", "since",
        "stack_id", "seen", "cpu_util", "cpu_recent", "cpu_seconds", "rss_bytes", "io_write_bytes", "write_rate",
        "files", "gpu", "gpu_uuids", "gpu_activity", "gone_at", "vms_bytes", "limits", "curve", "stack_at",
        "rank_source", "rank_conflict", "container",
        "still_since", "still_at", "still_op", "since_agent", "progress_known",
        "history",
        "file_first", "evidence", "native_frame", "native_no_wait", "native_stack_id", "blocked_in", "start",
        "proc_id",
        "payer", "cost", "seen_in_state", "gone_waiting",
    )

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.local_rank = -1
        self.node = ""
        # The node identity its bytes count against, and how many (nodebudget.py).
        self.payer = ""
        self.cost = 0
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
        # (device index, NVML UUID) of those devices: dcgm-exporter's gpu and UUID
        self.gpu_uuids: tuple[tuple[int, str], ...] = ()
        # (device index, utilisation percent or -1, power W or -1, power limit W
        # or 0) of those devices, device-wide: what gpuactivity.judge reads
        self.gpu_activity: tuple[tuple[int, int, float, float], ...] = ()
        self.gone_at: float | None = None
        # Whether it was waiting on its peers (in a collective, at a device
        # sync) when it went: a waiter the watchdog killed, not a rank that
        # died first (outcome.py).
        self.gone_waiting = False
        self.vms_bytes = 0
        # (kind, used, limit): host, cgroup, address_space, gpu<i>
        self.limits: tuple[tuple[str, int, int], ...] = ()
        self.curve = Curve()
        # When the stack that gave ``state`` was taken (daemon clock), None: never.
        self.stack_at: float | None = None
        # How the agent identified the rank ("env:RANK", "spawn_index", "unknown", ...).
        self.rank_source = ""
        # Sources that showed different numbers for this member (agent ranklearn).
        self.rank_conflict = ""
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
        # When a report first showed the current state (daemon time): the latest
        # the state can have begun; ``since`` is the earliest.
        self.seen_in_state = 0.0
        # Whether the agent reports progress (still_seconds) for this rank.
        self.progress_known = False
        # Its rounds of progress and the still periods they ended: its normal
        # (stillness.py; a GPU rank sits still through each step, and one fed
        # by shared memory or mmap moved only while it started).
        self.history = StillHistory()
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
        #: The interned stack of the native dump behind them ("": none taken).
        self.native_stack_id = ""
        #: What its thread is blocked in, as its agent last read it
        #: (syscalls.reading; "" unknown): renewed each round the rank sits
        #: still, so a still rank's is of its current still period.
        self.blocked_in = ""
        # When its process started (daemon clock, from the agent's process age);
        # None: not known. Evidence when two nodes claim the rank (ownership.py).
        self.start: float | None = None
        # (start ticks, owner uid) of its process as its agent read them
        # (0 / -1: not known): what the commands shown for it check before
        # they act on its pid (actions.py).
        self.proc_id: tuple[int, int] = (0, -1)


@dataclass(slots=True)
class TimeoutNote:
    """A job's timeout as its own evidence showed it: seconds, source, when
    (daemon clock). Small on purpose: it outlives the job (jobfacts.PastTimeouts)."""

    seconds: float = 0.0
    source: str = ""
    at: float = 0.0


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
    #: Bumped whenever the job's records may change as lists: a record added
    #: or dropped, gone or back, moved to another agent, a rank in or out of
    #: the waiting set. The views below are kept while it stands, so a stall's
    #: ticks do not walk its 100k ranks to rebuild them.
    ranks_version: int = field(default=0, repr=False, compare=False)
    #: ((ranks_version, agents_version, stale agents), records):
    #: detect.fresh_waiting's list, shared by the detectors and kept across ticks.
    fresh_waiting: Any = field(default=None, repr=False, compare=False)
    #: View name -> (ranks_version, view): ``live_waiting``, ``live_records``,
    #: ``live_agents`` (``_kept``).
    views: dict[str, tuple[int, Any]] = field(default_factory=dict, repr=False, compare=False)
    #: (fresh_waiting's list, the tick's stamp, the ranks picked, their Blocked):
    #: detect.blocked's last answer, reused by another detector of the same tick
    #: that picks the same.
    blocked_memo: Any = field(default=None, repr=False, compare=False)
    #: [(records picked, in rank order, ranks, their evidence as read, the
    #: evidence pairs)], the last two: detect.blocked's order and pairs kept
    #: across ticks while the same ranks show the same evidence.
    evidence_memo: Any = field(default=None, repr=False, compare=False)
    #: rank -> (daemon time the dump was written, its FlightRecorderSummary): the
    #: job's own record of its collectives, asked for during a stall.
    flight_recorder: dict[int, tuple[float, Any]] = field(default_factory=dict)
    #: The process-group timeout a Flight Recorder dump states (timeout_ms), seconds.
    fr_timeout: float = 0.0
    #: Where the job stated declared_timeout (``args:--ddp_timeout``,
    #: ``env:DEEPSPEED_TIMEOUT``, ``locals:...``: agent.timeouts); "": not said.
    declared_timeout_source: str = ""
    #: The timeout this incarnation showed last, from its own evidence (what a
    #: later incarnation of the same job id starts from: jobfacts.PastTimeouts).
    timeout_note: TimeoutNote = field(default_factory=lambda: TimeoutNote())
    #: (seconds, source) a previous incarnation of this job id showed; (0, ""): none.
    previous_timeout: tuple[float, str] = (0.0, "")
    #: How the batch scheduler names the job (scheduler, job_id, job_name, user,
    #: source), as the agent found it; None: not under a scheduler, or not yet known.
    scheduler_job: dict[str, str] | None = None
    #: A ranked member set the job-level facts (env, timeout, scheduler names,
    #: Flight Recorder timeout): members without a rank may no longer replace them.
    facts_ranked: bool = False
    #: Top-level packages the ranks imported (JobInfo.packages, by the agents'
    #: evidence), what decides the job's framework (frameworks.py); bounded.
    packages: frozenset[str] = frozenset()
    #: The node identity the job's facts (JobInfo) count against, and their bytes.
    facts_payer: str = ""
    facts_cost: int = 0
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
        if (rec.op is _NO_OP) is not (op is _NO_OP) or \
                (rec.state is _DEVICE_WAIT) is not (state is _DEVICE_WAIT):
            # In or out of either set ``waiting`` is made of: its members, or
            # their order, may differ.
            self.ranks_version += 1
        self.by_state[rec.state].discard(rec.rank)
        self.by_state[state].add(rec.rank)
        if op is CollectiveOp.NONE:
            self.in_collective.discard(rec.rank)
        else:
            self.in_collective.add(rec.rank)
        rec.state, rec.op = state, op

    def remove_from_indexes(self, rec: RankRecord) -> None:
        self.ranks_version += 1
        self.by_state[rec.state].discard(rec.rank)
        self.in_collective.discard(rec.rank)
        self.still.discard(rec.rank)

    @property
    def waiting(self) -> set[int]:
        """Ranks blocked on others: in a collective, or (NCCL) at a device sync."""
        dw = self.by_state[RankState.DEVICE_WAIT]
        return self.in_collective | dw if dw else self.in_collective

    def _kept(self, name: str, build: Callable[[], Any]) -> Any:
        """The view ``name``, built again only when ``ranks_version`` moved
        (read-only: callers share it)."""
        kept = self.views.get(name)
        if kept is not None and kept[0] == self.ranks_version:
            return kept[1]
        out = build()
        self.views[name] = (self.ranks_version, out)
        return out

    def live_waiting(self) -> list[RankRecord]:
        """The records of the waiting ranks not gone, in the waiting set's order."""
        ranks = self.ranks
        return self._kept("live_waiting", lambda: [
            rec for r in self.waiting if (rec := ranks[r]).gone_at is None])

    def live_records(self) -> dict[int, RankRecord]:
        """Rank -> record of the ranks not gone."""
        return self._kept("live_records", lambda: {
            r: rec for r, rec in self.ranks.items() if rec.gone_at is None})

    def live_agents(self) -> set[str]:
        """The agents of the ranks not gone."""
        return self._kept("live_agents", lambda: {
            rec.agent_id for rec in self.ranks.values() if rec.gone_at is None})

    @property
    def nodes(self) -> set[str]:
        return {r.node for r in self.ranks.values()}

    @property
    def live_ranks(self) -> int:
        return sum(1 for r in self.ranks.values() if r.gone_at is None)
