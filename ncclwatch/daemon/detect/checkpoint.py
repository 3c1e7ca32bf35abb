"""checkpoint_gather / checkpoint_restore: one rank works on a checkpoint
while others are blocked in a collective.

The culprit is a rank in checkpoint work that is *not* itself inside a
collective: a rank gathering a state dict inside ``all_gather`` is a
participant waiting like the others (signatures.py keeps both facts).
"""

from __future__ import annotations

from ncclwatch.daemon.detect import Culprit, DetectConfig, Finding
from ncclwatch.daemon.table import Job, JobTable
from ncclwatch.model import RankState, StallKind

#: Culprit state -> the stall it causes.
KIND_BY_STATE: dict[RankState, StallKind] = {
    RankState.SAVING: StallKind.CHECKPOINT_GATHER,
    RankState.GATHERING_STATE_DICT: StallKind.CHECKPOINT_GATHER,
    RankState.LOADING: StallKind.CHECKPOINT_RESTORE,
}


def detect(job: Job, table: JobTable, now: float, cfg: DetectConfig) -> list[Finding]:
    if not job.in_collective:
        return []
    waiting, ops, started = [], set(), now
    for r in job.in_collective:
        rec = job.ranks[r]
        if table.fresh(rec, now) and now - rec.since >= cfg.stall_threshold:
            waiting.append(r)
            ops.add(rec.op)
            started = min(started, rec.since)
    if not waiting:
        return []
    by_kind: dict[StallKind, list[Culprit]] = {}
    for state, kind in KIND_BY_STATE.items():
        for r in job.by_state[state]:
            rec = job.ranks[r]
            if r in job.in_collective or not table.fresh(rec, now):
                continue
            by_kind.setdefault(kind, []).append(Culprit(
                rank=r, node=rec.node, pid=rec.pid, state=rec.state, op=rec.op,
                stack_id=rec.stack_id, for_seconds=now - rec.since))
    findings = []
    waiting.sort()
    for kind, culprits in by_kind.items():
        culprits.sort(key=lambda c: c.rank)
        lead = culprits[0]
        summary = (f"rank {lead.rank} on {lead.node} is {lead.state.value.replace('_', ' ')} "
                   f"for {lead.for_seconds:.0f}s while {len(waiting)} rank(s) wait in "
                   f"{'/'.join(sorted(o.value for o in ops))} for {now - started:.0f}s")
        findings.append(Finding(kind=kind, job_id=job.job_id, culprits=tuple(culprits),
                                waiting=tuple(waiting),
                                waiting_ops=tuple(sorted(ops, key=lambda o: o.value)),
                                started_at=started, summary=summary))
    return findings
