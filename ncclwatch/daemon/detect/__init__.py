"""Stall detectors: pure functions over one job's rank table.

Each detector takes the job, the table (for freshness) and ``now`` and
returns findings; the registry below is the list the daemon runs. A finding
is a kind, the culprit ranks, who waits and since when: the decision, kept
apart from the metrics computed from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ncclwatch.daemon.table import Job, JobTable
from ncclwatch.model import CollectiveOp, RankState, StallKind


@dataclass(frozen=True)
class DetectConfig:
    #: A rank counts as blocked after this long in a collective.
    stall_threshold: float = 5.0
    #: Waits with no checkpoint to explain them count after this long.
    hang_threshold: float = 30.0


@dataclass(frozen=True)
class Culprit:
    rank: int
    node: str
    pid: int
    state: RankState
    op: CollectiveOp
    stack_id: str
    for_seconds: float


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


Detector = Callable[[Job, JobTable, float, DetectConfig], list[Finding]]


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
