"""checkpoint_gather / checkpoint_restore: one rank works on a checkpoint
while others are blocked in a collective.

The culprit is a rank in checkpoint work that is *not* itself inside a
collective: a rank gathering a state dict inside ``all_gather`` is a
participant waiting like the others (signatures.py keeps both facts).
"""

from __future__ import annotations

from ncclwatch.daemon.detect import Culprit, DetectConfig, Finding, blocked, culprit_of
from ncclwatch.daemon.table import Job, JobTable
from ncclwatch.model import RankState, StallKind, rank_name

#: Culprit state -> the stall it causes.
KIND_BY_STATE: dict[RankState, StallKind] = {
    RankState.SAVING: StallKind.CHECKPOINT_GATHER,
    RankState.GATHERING_STATE_DICT: StallKind.CHECKPOINT_GATHER,
    RankState.LOADING: StallKind.CHECKPOINT_RESTORE,
}


def detect(job: Job, table: JobTable, now: float, cfg: DetectConfig) -> list[Finding]:
    if not job.waiting:
        return []
    b = blocked(job, table, now, cfg.stall_threshold)
    if b is None:
        return []
    by_kind: dict[StallKind, list[Culprit]] = {}
    waiting = job.waiting
    for state, kind in KIND_BY_STATE.items():
        for r in sorted(job.by_state[state]):
            if r in waiting or not table.fresh(job.ranks[r], now):
                continue
            by_kind.setdefault(kind, []).append(culprit_of(job, r, now))
    findings = []
    for kind, culprits in by_kind.items():
        culprits.sort(key=lambda c: c.rank)
        lead = culprits[0]
        who = rank_name(lead.rank) + (f" (pid {lead.pid})" if lead.rank < 0 else "")
        summary = (f"{who} on {lead.node} is {lead.state.value.replace('_', ' ')} "
                   f"for {lead.for_seconds:.0f}s while {len(b.ranks)} rank(s) wait in "
                   f"{'/'.join(o.value for o in b.ops)} for {now - b.started_at:.0f}s")
        findings.append(Finding(kind=kind, job_id=job.job_id, culprits=tuple(culprits),
                                waiting=b.ranks, waiting_ops=b.ops,
                                started_at=b.started_at, summary=summary))
    return findings
