"""Stall detectors: pure functions over one job's rank table.

Each detector takes the job, the table (for freshness) and ``now`` and
returns findings; the registry below is the list the daemon runs. A finding
is a kind, the culprit ranks, who waits and since when: the decision, kept
apart from the metrics computed from it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable

from ncclwatch.daemon import clock
from ncclwatch.daemon.records import Job, RankRecord
from ncclwatch.daemon.settings import DaemonConfig
from ncclwatch.daemon.table import JobTable
from ncclwatch.daemon.waits import WaitPolicy
from ncclwatch.model import CollectiveOp, RankState, StallKind, WaitEvidence


@dataclass(frozen=True)
class DetectConfig:
    """The daemon's settings of the same names (settings.py declares them and
    their defaults)."""

    #: A rank counts as blocked after this long in a collective.
    stall_threshold: float = DaemonConfig.stall_threshold
    #: Waits with no checkpoint to explain them count after this long: the
    #: ceiling of the learned per-job threshold (waits.py), and the threshold
    #: for ranks with no progress reading.
    hang_threshold: float = DaemonConfig.hang_threshold
    #: The learned threshold never goes below this.
    hang_floor: float = DaemonConfig.hang_floor

    @property
    def waits(self) -> WaitPolicy:
        return WaitPolicy(floor=min(self.hang_floor, self.hang_threshold),
                          ceiling=self.hang_threshold)


@dataclass(frozen=True)
class Culprit:
    rank: int
    node: str
    pid: int
    state: RankState
    op: CollectiveOp
    stack_id: str
    for_seconds: float                # since the earliest start the evidence allows
    seen_for: float | None = None     # since the first report that showed it (None: same)


@dataclass(frozen=True)
class Finding:
    kind: StallKind
    job_id: str
    culprits: tuple[Culprit, ...]
    waiting: tuple[int, ...]        # ranks blocked in a collective
    waiting_ops: tuple[CollectiveOp, ...]
    started_at: float               # when the first waiting rank blocked (daemon clock)
    summary: str
    unknown: tuple[int, ...] = ()   # ranks gone or silent: never culprits by guess
    #: (rank, how its waiting was established) for each waiting rank.
    evidence: tuple[tuple[int, WaitEvidence], ...] = ()
    #: Every waiting rank's only evidence is stillness: shown as provisional
    #: until native frames or the Flight Recorder confirm it (or it is withdrawn).
    provisional: bool = False
    #: How the hang threshold that made the finding was set: "learned" from
    #: the job's own steps, "ceiling" (the fixed hang_threshold: before the
    #: job's first steps, or in an op it never showed); "" for kinds that use none.
    threshold_basis: str = ""
    threshold_seconds: float | None = None


Detector = Callable[[Job, JobTable, float, DetectConfig], list[Finding]]


@dataclass(frozen=True)
class Blocked:
    """Fresh ranks of a job blocked in a collective for at least a threshold."""

    ranks: tuple[int, ...]
    ops: tuple[CollectiveOp, ...]
    started_at: float  # when the first of them blocked (daemon clock)
    evidence: tuple[tuple[int, WaitEvidence], ...] = ()


def fresh_waiting(job: Job, table: JobTable, now: float) -> list[RankRecord]:
    """The job's waiting ranks whose reports can be trusted, once per tick.

    Every detector starts from this list; at 100k ranks in a collective the
    walk was most of a tick, so it is made once and kept on the job while the
    same records wait and the same agents are stale (records.Job.ranks_version,
    table.stale_agents): a stall's ticks reuse it, a report that moves no rank
    in or out of the waiting set does not void it.
    """
    key = (job.ranks_version, table.agents_version, table.stale_agents(now))
    cached = job.fresh_waiting
    if cached is not None and cached[0] == key:
        return cached[1]
    stale = key[2]
    agents = table.agents
    out = [rec for rec in job.live_waiting()
           if rec.agent_id in agents and rec.agent_id not in stale]
    job.fresh_waiting = (key, out)
    return out


def blocked(job: Job, table: JobTable, now: float, threshold: float,
            select: Callable[[list[RankRecord]], list[RankRecord]] | None = None,
            ) -> Blocked | None:
    """Ranks in a collective for ``threshold`` (or those ``select`` picks of them)."""
    waiting = fresh_waiting(job, table, now)
    if select is None:
        since_at = now - threshold
        hit = [rec for rec in waiting if rec.since <= since_at]
    else:
        hit = select(waiting)
    if not hit:
        return None
    # In rank order: sorted by the int key (the waiting set yields ranks nearly in
    # order), not as (rank, evidence) tuples, which cost most of a 100k-rank tick.
    # The same records picked in the same order as a recent tick (a stall's
    # waiters, tick after tick) are that tick's sorted list, found by identity.
    kept = job.evidence_memo
    entry = next((e for e in kept if e[0] == hit), None) if kept else None
    picked = hit
    hit = entry[1] if entry is not None else sorted(hit, key=_RANK)
    # The detectors of one tick often pick the same ranks (a checkpoint stall's
    # waiters are the hang detector's too): the same records, read at the same
    # moment with no report applied between (the stamp), give the same.
    memo = job.blocked_memo
    stamp = (now, table.reports_total)   # no report applied since, at this moment
    if memo is not None and memo[0] is waiting and memo[1] == stamp and memo[2] == hit:
        return memo[3]
    # Comprehensions, not a loop of appends: at 100k waiting ranks this is a tick's bulk.
    ops = {rec.op for rec in hit}
    if CollectiveOp.NONE in ops:  # a device_wait rank's op is unknown (no c10d frame)
        ops.discard(CollectiveOp.NONE)
        ops.add(CollectiveOp.WAIT)
    started = min(now, min([rec.since for rec in hit]))
    # An agent that does not say how (evidence NONE) found the wait in Python frames.
    # A pair per rank is the one allocation per rank of a tick (100k of them
    # once a stall opens, every tick it stays open): the pairs of the last tick
    # serve while the same ranks show the same evidence, read without one.
    none, python = WaitEvidence.NONE, WaitEvidence.PYTHON_FRAME
    shown = [rec.evidence for rec in hit]
    if entry is not None and entry[3] == shown:
        ranks, evidence = entry[2], entry[4]
    else:
        ranks = tuple([rec.rank for rec in hit])
        evidence = tuple([(r, python if ev is none else ev) for r, ev in zip(ranks, shown)])
        # Two kept: the checkpoint and hang detectors may pick different ranks.
        job.evidence_memo = [(picked, hit, ranks, shown, evidence), *(kept or ())[:1]]
    out = Blocked(ranks, tuple(sorted(ops, key=lambda o: o.value)), started, evidence)
    job.blocked_memo = (waiting, stamp, hit, out)
    return out


_RANK = operator.attrgetter("rank")


def culprit_of(job: Job, rank: int, now: float) -> Culprit:
    rec = job.ranks[rank]
    return Culprit(rank=rank, node=rec.node, pid=rec.pid, state=rec.state, op=rec.op,
                   stack_id=rec.stack_id, for_seconds=now - rec.since,
                   seen_for=clock.seen_for(rec, now))


def _registry() -> tuple[Detector, ...]:
    from ncclwatch.daemon.detect import checkpoint, hang

    return (checkpoint.detect, hang.detect)


DETECTORS: tuple[Detector, ...] = _registry()
#: The kinds the registry can report; exported as 0 when inactive.
DETECTED_KINDS: tuple[StallKind, ...] = tuple(StallKind)


def detect_job(job: Job, table: JobTable, now: float, cfg: DetectConfig) -> list[Finding]:
    out: list[Finding] = []
    for d in DETECTORS:
        out.extend(d(job, table, now, cfg))
    return out
