"""collective_hang, desync, rank_lost: the waits nobody is checkpointing for.

- collective_hang: ranks block in a collective while other live ranks are
  elsewhere (compute, dataloader, ...): those absent ranks are the culprits.
- desync: every live rank is in a collective, but not the same one; the
  culprits are the ranks outside the largest group.
- rank_lost: ranks block while some rank exited or stopped reporting. No
  culprit is guessed from missing data; the finding lists the unknown ranks.

Absent ranks in checkpoint work are left to the checkpoint detector. These
kinds wait longer before speaking: a job's start-up and uneven steps make
short waits in a collective normal. How long is learned per job and op
(waits.py): a rank counts once it has sat still in its collective for the
job's threshold, or, still or not, for ``hang_threshold`` (the ceiling).

NCCL-shaped waits show no frame (shape.py). The live Flight Recorder turns
ranks that read compute into waiters of a collective a peer never enqueued,
and names that peer by sequence numbers. Where no frame says anything, the
job's shape does, after the ceiling: ranks at work while every other rank
has sat still give a provisional collective_hang; every rank still and the
Flight Recorder naming the peer gives a confirmed one. Nothing at all: silent.

GPU ranks sit still through every step (issue 26), so the shape is read
against each rank's own normal: every rank equally still is a long step, not
a hang; a rank counts as still only past its own normal still periods
(``shape.past_normal``); and a rank at work on the frames the still ones sit
on (rank 0 logging inside the step) is in the step, not missing from it.
A rank counts only once it has shown that it steps (``shape.stepped``: 10
rounds of progress over 20 s): one fed through shared memory or an mmap is
still from its start-up on, healthy, and its stillness says nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from ncclwatch import gpuactivity, syscalls
from ncclwatch.daemon import progress
from ncclwatch.daemon.detect import Blocked, DetectConfig, Finding, blocked, culprit_of
from ncclwatch.daemon.detect.shape import (
    elsewhere,
    fr_note,
    fr_waiting,
    live_ranks,
    movers,
    past_normal,
    still_peers,
    still_since,
    stepped,
)
from ncclwatch.daemon.waits import CEILING, LEARNED
from ncclwatch.daemon.records import Job, RankRecord
from ncclwatch.daemon.table import JobTable
from ncclwatch.model import (
    CHECKPOINT_STATES,
    CollectiveOp,
    RankState,
    StallKind,
    QUIET_CPU,
    WaitEvidence,
    rank_ranges,
)


#: Culprits whose process is described in a collective_hang's summary.
MAX_DOING = 4
#: Waiters inside a full state-dict gather (FSDP's state_dict(),
#: get_model_state_dict): every rank enters it at the same point of its step,
#: a checkpoint, so a rank still elsewhere after the checkpoint stall threshold
#: (``stall_threshold``, as the checkpoint detector uses) is late, steps seen
#: or not; the finding's basis says so. A rank-dependent pause just before the
#: gather (rank 0 evaluating first) is named by this rule too: it holds every
#: rank's checkpoint.
IN_GATHER = RankState.GATHERING_STATE_DICT
GATHER = "checkpoint"


def hung(job: Job, now: float, cfg: DetectConfig):
    """The per-rank test: still in its collective past the job's learned threshold.

    A rank with progress readings counts only while it sits still with a
    stack taken during the stillness (``still_at``): a stack from before it
    went still may be stale (the rank stepped on, then sat down elsewhere).
    Without readings (an older agent): in the collective past the ceiling.
    Returns a selector over the waiting ranks: one comprehension, the
    thresholds looked up once per op (100k waiting ranks are a tick's bulk).
    """
    policy = cfg.waits
    ceiling_at = now - cfg.hang_threshold

    gather_at = now - cfg.stall_threshold

    def select(waiting: list[RankRecord]) -> list[RankRecord]:
        stills = [rec for rec in waiting if rec.still_at is not None]
        ops = {rec.still_op for rec in stills}
        warm = waiters_warm(stills)
        still_at = {op: now - job.waits.threshold(op, policy, now, warm) for op in ops}
        return [rec for rec in waiting
                if ((rec.still_at is not None
                     and rec.still_at <= (max(still_at[rec.still_op], gather_at)
                                          if rec.state is IN_GATHER else still_at[rec.still_op]))
                    if rec.progress_known else
                    rec.since <= (gather_at if rec.state is IN_GATHER else ceiling_at))]
    return select


def waiters_warm(recs: list[RankRecord]):
    """waits.WaitersWarm for ``recs``: each one made progress in its own rounds
    over its own warm-up (stillness.StillHistory.warm), so the job's rounds of
    progress were theirs too, not only a busy late rank's. Asked only when the
    step-collective rule did not already decide (lazy: 100k waiters)."""
    return lambda: all(rec.history.warm for rec in recs)


def undecided_idle(rec: RankRecord) -> bool:
    """A rank that sits still with no CPU of its own and a stack that says
    nothing (shown idle), with no native dump of this still period yet.

    A rank blocked in a C++ wait (``work.wait()``, NCCL-shaped) looks exactly
    so until its native dump names the wait, and so does a culprit asleep.
    Its peers' dumps may land a round before its own: naming it then blames a
    waiter (nccl-shaped-hang in CI named rank 0, which waited, beside rank 1,
    asleep). It is left out of the culprits while a peer is decided, and while
    none is, the finding waits for a native verdict, up to the hang ceiling.
    A rank whose thread sleeps on a timer (``syscalls.asleep``, read from
    /proc each still round) is decided: asleep, in no wait.
    """
    return (rec.state is RankState.IDLE and rec.still_since is not None
            and not rec.native_no_wait and rec.evidence is WaitEvidence.NONE
            and not syscalls.asleep(rec.blocked_in))


def decided(job: Job, absent: list[int], waiting, early: bool) -> list[int]:
    """The absent ranks to name: the undecided ones left out while a peer is
    decided; none yet (``early``, before the hang ceiling) when all are.

    Only where the job's waits show no Python frame (a waiter is known by its
    native frame): where they do (a c10d frame), a waiter would show it too,
    and a still idle rank is not one."""
    if not any(job.ranks[r].evidence is WaitEvidence.NATIVE_FRAME for r in waiting
               if r in job.ranks):
        return absent
    undecided = {r for r in absent if undecided_idle(job.ranks[r])}
    if len(undecided) < len(absent):
        return [r for r in absent if r not in undecided]
    return [] if early else absent


def threshold_of(job: Job, b: Blocked, now: float, cfg: DetectConfig) -> tuple[float, str]:
    """The threshold that made ``b``'s ranks count, and its basis: the tightest
    over the ops they sit still in (``hung``), the ceiling for ranks without
    progress readings. A finding says which, so its reader knows whether the
    job's own steps set it or the fixed ceiling did (before the first steps)."""
    policy, ranks = cfg.waits, job.ranks
    ops = {rec.still_op for r in b.ranks if (rec := ranks.get(r)) is not None
           and rec.progress_known and rec.still_at is not None}
    if b.ranks and all((rec := ranks.get(r)) is not None and rec.state is IN_GATHER
                       for r in b.ranks):
        return cfg.stall_threshold, GATHER
    if not ops:
        return cfg.hang_threshold, CEILING
    warm = waiters_warm([rec for r in b.ranks if (rec := ranks.get(r)) is not None])
    seconds, basis = min((job.waits.threshold(op, policy, now, warm),
                          job.waits.basis(op, policy, now, warm)) for op in ops)
    # A learned threshold capped at the ceiling is the ceiling.
    return seconds, CEILING if seconds >= cfg.hang_threshold else basis


def threshold_note(seconds: float, basis: str, stepping: bool) -> str:
    """The summary's clause on the threshold: learned, or the ceiling and why."""
    if basis == LEARNED:
        return f"; past {seconds:.0f}s, several times the job's normal wait (learned)"
    if basis == GATHER:
        return (f"; past {seconds:.0f}s inside a full state-dict gather, which every rank "
                "enters at the same point of its step (the checkpoint stall threshold)")
    if not stepping:
        return f"; before the job's first step: the fixed {seconds:.0f}s ceiling"
    return f"; the fixed {seconds:.0f}s ceiling (no shorter normal wait learned for it)"


def blocked_words(rec: RankRecord) -> str:
    """What a still rank's thread is blocked in, in words ("" when not still
    or unknown): its agent reads it every round the rank sits still, so a
    still rank's reading is of this still period; a moving rank's is not said."""
    if not rec.progress_known or rec.still_since is None:
        return ""
    return syscalls.words(rec.blocked_in)


def doing(rec: RankRecord, now: float) -> str:
    """What a culprit's process does, in words, from what its agent measured:
    CPU busy or quiet, making progress (read/write calls, switches) or still,
    and then the call its thread is blocked in ("running": it spins)."""
    cpu = max(rec.cpu_util, rec.cpu_recent)
    blocked = blocked_words(rec)
    busy = (f"CPU busy ({cpu:.0%} of a core)" if cpu >= QUIET_CPU
            else "no CPU" if blocked else "no CPU (asleep or blocked in a call)")
    if not rec.progress_known:
        return busy
    if rec.still_since is None:
        return busy + ", making progress (reads/writes or switches)"
    return busy + f", no progress for {now - rec.still_since:.0f}s" + (
        f", {blocked}" if blocked else "")


def gpu_note(records: list[RankRecord]) -> str:
    """The GPUs' utilisation and power, where the ranks carry readings
    (gpuactivity.summary: "" without them)."""
    words = gpuactivity.summary(records)
    return f"; {words}" if words else ""


def all_stuck(job: Job, table: JobTable, now: float, cfg: DetectConfig, b: Blocked,
              threshold: float) -> Finding | None:
    """Every live rank in the same collective past the threshold, none elsewhere,
    none making progress: a collective_hang with no culprit rank.

    What holds the collective is outside the ranks' Python code: a peer outside
    the job, the network, a device. Every rank must report fresh and sit still
    past its own normal (a GPU job still through each long step is within it),
    with progress readings (no reading says no progress),
    in one named collective: a frame's op, or the Flight Recorder's pending
    collective (a device_wait alone names none)."""
    live = live_ranks(job, table, now)
    if live is None or set(b.ranks) != set(live):
        return None
    policy = cfg.waits
    for rec in live.values():
        if rec.native_no_wait or not rec.progress_known:
            return None  # "no progress" needs readings of it
        # A rank's first long still period may be its first long step: each
        # rank must have stepped and be past its own normal, else the ceiling.
        need = (past_normal(rec, threshold, policy) if stepped(rec, policy)
                else cfg.hang_threshold)
        if rec.still_since is None or rec.still_since > now - need:
            return None
    a = progress.analysis(job, b.started_at) if job.flight_recorder else None
    stuck = next((st for st in (a.stuck if a is not None else ())
                  if not st.missing_ranks), None)
    ops = {rec.op for rec in live.values()}
    if stuck is not None:
        try:
            op = CollectiveOp(stuck.op)
        except ValueError:
            op = CollectiveOp.WAIT
        what = f"{stuck.op} #{stuck.seq} of group {stuck.pg_desc or stuck.pg_name}"
        evidence = WaitEvidence.FLIGHT_RECORDER
    elif len(ops) == 1 and (op := next(iter(ops))) not in (CollectiveOp.NONE,
                                                            CollectiveOp.WAIT):
        what, evidence = op.value, None
    else:
        return None
    summary = (f"every rank waits in {what} for {now - b.started_at:.0f}s; no rank is "
               f"elsewhere: no culprit rank (a peer outside the job, the network, or a "
               f"device){gpu_note(list(live.values()))}")
    ev = b.evidence if evidence is None else tuple((r, evidence) for r in b.ranks)
    return Finding(kind=StallKind.COLLECTIVE_HANG, job_id=job.job_id, culprits=(),
                   waiting=b.ranks, waiting_ops=(op,), started_at=b.started_at,
                   summary=summary, evidence=ev)


def by_shape(job: Job, table: JobTable, now: float, cfg: DetectConfig) -> list[Finding]:
    """No rank's frames say it waits: what stillness and the Flight Recorder say.

    Ranks count once still for the ceiling (``hang_threshold``): their state
    is a guess until then. Checkpoint work is the checkpoint detector's.
    """
    counts = table.state_counts(job)
    if counts is not None and counts.checkpoint:
        # Checkpoint work is the checkpoint detector's (the job's counts say):
        # asked first, as it needs no walk (a checkpoint stall's still ranks
        # are all its waiters, 100k of them every tick it stays open).
        return []
    still = {r for r in still_since(job, now - cfg.hang_threshold)
             if not job.ranks[r].native_no_wait}
    if not still:  # the common case, without a walk over the job's ranks
        return []
    live = live_ranks(job, table, now)
    if live is None or any(rec.state in CHECKPOINT_STATES for rec in live.values()):
        return []
    fr, missing = fr_waiting(job, None, min(live[r].still_since for r in still))
    fr = {r: v for r, v in fr.items() if r in still}
    culprits = sorted(missing & live.keys() - fr.keys())
    if fr and culprits:
        waiting, evidence = tuple(sorted(fr)), WaitEvidence.FLIGHT_RECORDER
        ops = tuple(sorted({v[0] for v in fr.values()}, key=lambda o: o.value))
        how = "wait in " + "/".join(o.value for o in ops)
        what = "never enqueued"
    else:
        workers = movers(job, table, now)
        peers = (still_peers(job, table, now, cfg.hang_threshold, workers, cfg.waits)
                 if workers else None)
        # Ranks at work where the still ones sit are in the same step, not missing.
        workers = elsewhere(job, workers, set(peers)) if peers else workers
        if peers is None or not workers:
            return []
        culprits, waiting, evidence, ops = sorted(workers), peers, WaitEvidence.STILLNESS, (
            CollectiveOp.WAIT,)
        how = "sit still (provisional: no frame says where they wait)"
        what = "never joined"
    started = min(live[r].still_since for r in waiting)
    states = sorted({live[r].state.value for r in culprits})
    summary = (f"{len(waiting)} rank(s) {how} for {now - started:.0f}s: rank(s) "
               f"{rank_ranges(culprits)} {what} ({', '.join(states)}){fr_note(fr)}")
    return [Finding(kind=StallKind.COLLECTIVE_HANG, job_id=job.job_id,
                    culprits=tuple(culprit_of(job, r, now) for r in culprits),
                    waiting=waiting, waiting_ops=ops, started_at=started, summary=summary,
                    evidence=tuple((r, evidence) for r in waiting),
                    provisional=evidence is WaitEvidence.STILLNESS)]


def detect(job: Job, table: JobTable, now: float, cfg: DetectConfig) -> list[Finding]:
    b = (blocked(job, table, now, cfg.hang_threshold, hung(job, now, cfg))
         if job.waiting else None)
    if b is None:
        return by_shape(job, table, now, cfg)
    waiting, ops, evidence = b.ranks, b.ops, b.evidence
    agents = table.fresh_agents(now)
    live = [r for r, rec in job.ranks.items() if rec.gone_at is None and rec.agent_id in agents]
    waiting_now = job.waiting
    absent = [r for r in live if r not in waiting_now]
    # Absent ranks the Flight Recorder shows in a collective a peer never
    # enqueued wait too (their frames read compute: NCCL-shaped).
    fr, _ = fr_waiting(job, None, b.started_at)
    absent_set = set(absent)
    fr = {r: v for r, v in fr.items() if r in absent_set}
    if fr:
        absent = [r for r in absent if r not in fr]
        waiting = tuple(sorted((*waiting, *fr)))
        ops = tuple(sorted(set(ops) | {v[0] for v in fr.values()}, key=lambda o: o.value))
        evidence = tuple(sorted((*evidence,
                                 *((r, WaitEvidence.FLIGHT_RECORDER) for r in fr))))
    # Rank numbers nobody reports; each live member with an unknown rank is
    # one of them, so they are lost only when there are more than those.
    unknown = sorted(set(range(job.world_size)) - set(live))
    if len(unknown) <= job.unidentified:
        unknown = []

    def finding(kind: StallKind, culprits: list[int], summary: str, **extra) -> Finding:
        return Finding(kind=kind, job_id=job.job_id,
                       culprits=tuple(culprit_of(job, r, now) for r in sorted(culprits)),
                       waiting=waiting, waiting_ops=ops, started_at=b.started_at,
                       summary=summary + fr_note(fr), evidence=evidence, **extra)

    threshold, basis = threshold_of(job, b, now, cfg)
    note = threshold_note(threshold, basis, job.waits.stepping(
        cfg.waits, now, waiters_warm([job.ranks[r] for r in b.ranks if r in job.ranks])))
    out: list[Finding] = []
    if not absent and not unknown and not fr:
        f = all_stuck(job, table, now, cfg, b, threshold)
        if f is not None:
            return [replace(f, summary=f.summary + note, threshold_basis=basis,
                            threshold_seconds=threshold)]
    if unknown:
        out.append(finding(
            StallKind.RANK_LOST, [],
            f"{len(waiting)} rank(s) wait in {'/'.join(o.value for o in ops)} while "
            f"rank(s) {rank_ranges(unknown)} are gone or not reporting", unknown=tuple(unknown)))
    elsewhere = [r for r in absent if job.ranks[r].state not in CHECKPOINT_STATES]
    # Absent ranks in checkpoint work are the checkpoint detector's.
    named = (decided(job, elsewhere, waiting, early=now - b.started_at < cfg.hang_threshold)
             if elsewhere and len(elsewhere) == len(absent) else [])
    if named:
        elsewhere = named
        states = Counter(job.ranks[r].state.value for r in elsewhere)
        # The culprits are found by what their peers do, whatever they run:
        # what each one's process does is said from its agent's readings.
        what = "; ".join(f"rank {r}: {doing(job.ranks[r], now)}"
                         for r in sorted(elsewhere)[:MAX_DOING])
        out.append(finding(
            StallKind.COLLECTIVE_HANG, elsewhere,
            f"{len(waiting)} rank(s) wait in {'/'.join(o.value for o in ops)} that rank(s) "
            f"{rank_ranges(elsewhere)} never joined ({', '.join(sorted(states))}); "
            f"{what}{note}", threshold_basis=basis, threshold_seconds=threshold))
    if not absent and len({job.ranks[r].op for r in waiting if r in job.in_collective}) > 1:
        # device_wait ranks (op unknown) never make a desync on their own.
        groups = Counter(job.ranks[r].op for r in waiting if r in job.in_collective)
        major = max(groups.items(), key=lambda kv: (kv[1], kv[0].value))[0]
        minority = [r for r in waiting if r in job.in_collective and job.ranks[r].op is not major]
        out.append(finding(
            StallKind.DESYNC, minority,
            "ranks wait in different collectives: " + "; ".join(
                f"{o.value}: {rank_ranges([r for r in waiting if job.ranks[r].op is o])}"
                for o in ops)))
    return out

