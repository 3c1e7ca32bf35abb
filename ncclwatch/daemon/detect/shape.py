"""Waits no frame shows: the job's shape and the live Flight Recorder.

On NCCL a rank blocks in C++ (``work.wait()``, ``.item()``, DDP's backward)
and its Python stack reads compute. Two kinds of evidence need no frame
(issue 18):

- *stillness*: every rank but the ones at work has made no progress (no
  read/write syscalls, no voluntary switches of its main thread) for a
  threshold. A finding resting on stillness alone is provisional.
- the *live Flight Recorder*: a rank with collective N of a group enqueued
  and not completed, that a peer never enqueued, waits on that peer, named
  by sequence numbers. It confirms a provisional finding, or names the
  culprit where every rank sits still.
"""

from __future__ import annotations

from ncclwatch.daemon import progress
from ncclwatch.daemon.records import Job, RankRecord
from ncclwatch.daemon.table import JobTable
from ncclwatch.daemon.waits import WaitPolicy
from ncclwatch.model import CHECKPOINT_STATES, CollectiveOp, RankState


def still_since(job: Job, at: float) -> list[int]:
    """Live ranks still since ``at`` or earlier, from the job's index of still
    ranks (no walk over the job: most ticks of most jobs have none)."""
    ranks = job.ranks
    return [r for r in job.still if (rec := ranks[r]).gone_at is None
            and rec.still_since is not None and rec.still_since <= at]


def live_ranks(job: Job, table: JobTable, now: float) -> dict | None:
    """The job's live ranks if every one of them reports fresh (else None:
    a rank not heard from breaks any shape). Too few live ranks is told by
    the job's counts (statecounts.py) without a walk."""
    counts = table.state_counts(job)
    if counts is not None and counts.live < max(job.world_size, 2):
        return None
    live = job.live_records()   # kept across ticks (records.Job.ranks_version)
    if len(live) < max(job.world_size, 2):
        return None
    stale, agents = table.stale_agents(now), job.live_agents()
    if not stale.isdisjoint(agents) or not agents <= table.agents.keys():
        return None
    return live


def past_normal(rec: RankRecord, threshold: float, policy: WaitPolicy) -> float:
    """How long ``rec`` must sit still to count: ``threshold``, or longer where
    its own still periods were longer (a GPU rank still through each 30 s
    step is not waiting): the rule the agent pauses by (stillness.py)."""
    return policy.rank.limit(rec.history, threshold)


def stepped(rec: RankRecord, policy: WaitPolicy) -> bool:
    """The rank was seen stepping (stillness.py), so its stillness means
    something. A GPU rank whose batches come through shared memory or an mmap
    makes no read/write calls after its start-up: it is still through every
    step, healthy, for days; its peer at work (rank 0 logging) would be named
    the culprit of a hang at the first ceiling (the gpu-shaped-healthy-8s-mmap
    row, in CI)."""
    return policy.rank.stepped(rec.history)


def halted(job: Job, table: JobTable, now: float, floor: float, policy: WaitPolicy) -> bool:
    """The job stopped: every live rank (fresh, with progress readings) has
    sat still past ``floor`` and past its own normal (``past_normal``), none
    in checkpoint work, each had warmed up (``policy.rank.stepped``), and
    some wait is not shown by a frame.

    The shape of a hang in a job whose ranks stepped fast (no still period
    of their own to judge by, stillness.py): the one that lets agents pause
    them, as a rank in checkpoint work beside still ones does. Ranks still
    through every healthy step stay within their normal; a job whose ranks
    never end a still period and have no rank at work (no logging) is asked
    once, its single still period being all there is."""
    if len(job.still) < max(job.world_size, 2):
        return False
    counts = table.state_counts(job)
    if counts is not None and (counts.still_live < counts.live or counts.checkpoint):
        return False   # a live rank not still, or at checkpoint work: no walk needed
    live = live_ranks(job, table, now)
    if live is None:
        return False
    framed = True
    for rec in live.values():
        if (not rec.progress_known or rec.still_since is None
                or rec.state in CHECKPOINT_STATES or not policy.rank.stepped(rec.history)
                or rec.still_since > now - past_normal(rec, floor, policy)):
            return False
        framed = framed and rec.state is RankState.COLLECTIVE
    return not framed


def still_peers(job: Job, table: JobTable, now: float, threshold: float,
                workers: set[int], policy: WaitPolicy | None = None) -> tuple[int, ...] | None:
    """The ranks outside ``workers`` and ``job.waiting`` if every one of them
    (and at least one) has sat still for ``threshold`` (and, with ``policy``,
    past its own normal still periods, ``past_normal``, having shown that it
    steps, ``stepped``), else None.

    Every rank of the job must be live and fresh, with progress readings: a
    rank not heard from, one that moves, or one whose native dump found no
    wait breaks the shape. More live ranks neither waiting nor still than
    ``workers`` (the job's counts, statecounts.py) break it without a walk.
    """
    counts = table.state_counts(job)
    if counts is not None and counts.moving > len(workers):
        return None
    live = live_ranks(job, table, now)
    if live is None:
        return None
    waiting, out = job.waiting, []
    for r, rec in live.items():
        if r in workers or r in waiting:
            continue
        need = threshold if policy is None else past_normal(rec, threshold, policy)
        if policy is not None and not stepped(rec, policy):
            return None
        if (not rec.progress_known or rec.native_no_wait
                or rec.still_since is None or rec.still_since > now - need
                or rec.state in CHECKPOINT_STATES):
            return None
        out.append(r)
    return tuple(sorted(out)) or None


def elsewhere(job: Job, workers: set[int], still: set[int]) -> set[int]:
    """The workers whose last stack is not where the still ranks sit: a rank
    at work on the very frames its peers are still on (rank 0 logging, or
    writing a metrics file, in the step the others spin through) is in the
    same step, not missing from it. Ranks without a stack keep their place."""
    ranks = job.ranks
    shared = {ranks[r].stack_id for r in still} - {""}
    return {r for r in workers if ranks[r].stack_id not in shared}


def movers(job: Job, table: JobTable, now: float) -> set[int]:
    """Fresh live ranks making progress now, outside checkpoint work and waits
    (none, without a walk, where the job's counts show no live rank moving)."""
    counts = table.state_counts(job)
    if counts is not None and not counts.moving:
        return set()
    agents = table.fresh_agents(now)
    return {r for r, rec in job.ranks.items()
            if rec.gone_at is None and rec.agent_id in agents and rec.progress_known
            and rec.still_since is None and rec.state not in CHECKPOINT_STATES
            and r not in job.waiting}


def fr_waiting(job: Job, workers: set[int] | None, since: float,
               ) -> tuple[dict[int, tuple[CollectiveOp, str]], set[int]]:
    """What the Flight Recorder (dumps written at or after ``since``) says.

    Returns (waiting, missing): the ranks in a collective that a peer never
    enqueued, rank -> (op, "op #seq of group"), and those peers. With
    ``workers``, only collectives one of them is missing count, and only
    they are named missing.
    """
    if not job.flight_recorder:
        return {}, set()
    a = progress.analysis(job, since)
    waiting: dict[int, tuple[CollectiveOp, str]] = {}
    missing: set[int] = set()
    for st in a.stuck if a is not None else ():
        gone = set(st.missing_ranks) if workers is None else workers & set(st.missing_ranks)
        if not gone:
            continue
        missing |= gone
        try:
            op = CollectiveOp(st.op)
        except ValueError:
            op = CollectiveOp.WAIT
        for r in st.waiting_ranks:
            waiting.setdefault(r, (op, f"{st.op} #{st.seq} of {st.pg_desc or st.pg_name}"))
    return waiting, missing


def fr_note(fr: dict[int, tuple[CollectiveOp, str]]) -> str:
    """The summary's clause naming the collectives the Flight Recorder shows."""
    return ("; Flight Recorder: " + ", ".join(sorted({v[1] for v in fr.values()}))
            if fr else "")
