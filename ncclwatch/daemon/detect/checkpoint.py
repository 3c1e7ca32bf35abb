"""checkpoint_gather / checkpoint_restore: one rank works on a checkpoint
while others are blocked in a collective.

The culprit is a rank in checkpoint work that is *not* itself inside a
collective: a rank gathering a state dict inside ``all_gather`` is a
participant waiting like the others (signatures.py keeps both facts).

Where a peer's stack shows no wait (NCCL-shaped waits live in C++ and the
agent's native dump has not spoken yet, or could not), the job's shape is
evidence too (issue 18): every other live rank has sat still for the stall
threshold while the culprit works. Those ranks wait by *stillness*; a finding
whose every waiting rank is such is *provisional*, and native frames or the
Flight Recorder confirm it within seconds. A rank whose native dump found no
wait is "still, reason unknown" and withdraws the shape: never invented.

The live Flight Recorder (dumps the daemon asks for during a stall) confirms
by sequence numbers: a rank with collective N of a group enqueued and not
completed, that a culprit never enqueued, waits on that culprit
(``fr_waiting``); its evidence becomes flight_recorder, its op the dump's.
"""

from __future__ import annotations

from ncclwatch.daemon import clock
from ncclwatch.daemon.detect import Culprit, DetectConfig, Finding, blocked, culprit_of
from ncclwatch.daemon.detect.shape import fr_note, fr_waiting, still_peers
from ncclwatch.daemon.records import Job
from ncclwatch.daemon.table import JobTable
from ncclwatch.model import CollectiveOp, RankState, StallKind, WaitEvidence, rank_name

#: Culprit state -> the stall it causes.
KIND_BY_STATE: dict[RankState, StallKind] = {
    RankState.SAVING: StallKind.CHECKPOINT_GATHER,
    RankState.GATHERING_STATE_DICT: StallKind.CHECKPOINT_GATHER,
    RankState.LOADING: StallKind.CHECKPOINT_RESTORE,
}


def detect(job: Job, table: JobTable, now: float, cfg: DetectConfig) -> list[Finding]:
    by_state = job.by_state
    if not job.waiting and not any(by_state[s] for s in KIND_BY_STATE):
        return []
    by_kind: dict[StallKind, list[Culprit]] = {}
    waiting = job.waiting
    for state, kind in KIND_BY_STATE.items():
        for r in sorted(by_state[state]):
            if r in waiting or not table.fresh(job.ranks[r], now):
                continue
            by_kind.setdefault(kind, []).append(culprit_of(job, r, now))
    if not by_kind:
        return []
    b = blocked(job, table, now, cfg.stall_threshold) if waiting else None
    workers = {c.rank for cs in by_kind.values() for c in cs}
    working_for = min(c.for_seconds for cs in by_kind.values() for c in cs)
    still = (still_peers(job, table, now, cfg.stall_threshold, workers)
             if working_for >= cfg.stall_threshold else None)
    if b is None and still is None:
        return []
    ranks, ops = (b.ranks, b.ops) if b else ((), ())
    evidence = b.evidence if b else ()
    started = b.started_at if b else now
    note = ""
    if still:
        work_since = min(job.ranks[r].since for r in workers)
        fr, _ = fr_waiting(job, workers, work_since)
        still_ops = {fr[r][0] if r in fr else CollectiveOp.WAIT for r in still}
        ranks = tuple(sorted((*ranks, *still)))
        ops = tuple(sorted(set(ops) | still_ops, key=lambda o: o.value))
        evidence = tuple(sorted((*evidence, *(
            (r, WaitEvidence.FLIGHT_RECORDER if r in fr else WaitEvidence.STILLNESS)
            for r in still))))
        started = min(started, min(job.ranks[r].still_since for r in still))
        note = fr_note(fr)
    provisional = all(ev is WaitEvidence.STILLNESS for _, ev in evidence)
    findings = []
    for kind, culprits in by_kind.items():
        culprits.sort(key=lambda c: c.rank)
        lead = culprits[0]
        who = rank_name(lead.rank) + (f" (pid {lead.pid})" if lead.rank < 0 else "")
        how = ("/".join(o.value for o in ops) if not provisional
               else "stillness (provisional: no frame says where yet)")
        summary = (f"{who} on {lead.node} is {lead.state.value.replace('_', ' ')} "
                   f"for {clock.span(lead.seen_for, lead.for_seconds)} while {len(ranks)} "
                   "rank(s) wait in "
                   f"{how} for {now - started:.0f}s{note}")
        findings.append(Finding(kind=kind, job_id=job.job_id, culprits=tuple(culprits),
                                waiting=ranks, waiting_ops=ops,
                                started_at=started, summary=summary,
                                evidence=evidence, provisional=provisional))
    return findings
