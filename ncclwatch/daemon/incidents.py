"""Incidents: one stall from first sight to end, with its evidence.

Findings come fresh from the detectors each tick; an incident ties them
together, remembers when it was first detected, how the budget and the
culprit's write progressed, and keeps the grouped stacks for the page/API.
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field

from ncclwatch.daemon.budget import Budget
from ncclwatch.daemon.detect import Finding
from ncclwatch.daemon.diagnosis import StallDiagnosis
from ncclwatch.daemon.records import Job
from ncclwatch.model import StallKind
from ncclwatch.remediation import RootCause

MAX_ENDED = 200
MAX_TRACE = 240  # evidence points kept per incident (one per tick)
#: What each trace point holds, in order (the API names them).
TRACE_FIELDS = ("t_seconds", "watchdog_remaining_seconds", "culprit_rss_bytes",
                "culprit_written_bytes", "culprit_file_bytes", "checkpoint_eta_seconds",
                "memory_eta_seconds")


@dataclass
class Incident:
    id: str
    job_id: str
    kind: StallKind
    started_at: float          # daemon monotonic
    detected_at: float
    started_wall: float
    detected_wall: float
    finding: Finding
    budget_at_detection: Budget
    budget: Budget
    min_remaining: float
    diagnosis: StallDiagnosis
    ended_at: float | None = None
    ended_wall: float | None = None
    #: First time the incident was judged at risk (daemon monotonic), if ever.
    at_risk_since: float | None = None
    #: Root causes seen, in order (a save can turn from "in time" to "too late").
    root_causes: list[str] = field(default_factory=list)
    # TRACE_FIELDS per tick
    trace: collections.deque = field(default_factory=lambda: collections.deque(maxlen=MAX_TRACE))

    @property
    def active(self) -> bool:
        return self.ended_at is None

    @property
    def remedy(self) -> RootCause:
        return self.diagnosis.root_cause

    @property
    def at_risk(self) -> bool:
        return self.active and self.diagnosis.at_risk


class Incidents:
    def __init__(self) -> None:
        self.active: dict[tuple[str, StallKind], Incident] = {}
        self.ended: collections.deque[Incident] = collections.deque(maxlen=MAX_ENDED)
        self.opened_total: collections.Counter[StallKind] = collections.Counter()
        self._ids = itertools.count(1)

    def update(self, job: Job, findings: list[tuple[Finding, StallDiagnosis]], budget: Budget,
               now: float, wall: float) -> list[Incident]:
        """Fold this tick's findings for ``job`` in; return newly opened incidents."""
        opened = []
        current = {f.kind: (f, dx) for f, dx in findings}
        for kind, (f, dx) in current.items():
            inc = self.active.get((job.job_id, kind))
            if inc is None:
                inc = Incident(
                    id=f"{next(self._ids)}", job_id=job.job_id, kind=kind,
                    started_at=f.started_at, detected_at=now,
                    started_wall=wall - (now - f.started_at), detected_wall=wall,
                    finding=f, budget_at_detection=budget, budget=budget,
                    min_remaining=budget.remaining, diagnosis=dx)
                self.active[(job.job_id, kind)] = inc
                self.opened_total[kind] += 1
                opened.append(inc)
            inc.finding = f
            inc.budget = budget
            inc.diagnosis = dx
            if not inc.root_causes or inc.root_causes[-1] != dx.root_cause.id:
                inc.root_causes.append(dx.root_cause.id)
            if dx.at_risk and inc.at_risk_since is None:
                inc.at_risk_since = now
            inc.started_at = min(inc.started_at, f.started_at)
            inc.min_remaining = min(inc.min_remaining, budget.remaining)
            lead = job.ranks.get(f.culprits[0].rank) if f.culprits else None
            ev = dx.evidence
            mem = ev.memory[0].eta_seconds if ev.memory else None
            inc.trace.append((round(now - inc.detected_at, 1), round(budget.remaining, 1),
                              lead.rss_bytes if lead else 0,
                              lead.io_write_bytes if lead else 0,
                              ev.write.written_bytes if ev.write else 0,
                              _round(dx.checkpoint_eta), _round(mem)))
        for (job_id, kind), inc in list(self.active.items()):
            if job_id == job.job_id and kind not in current:
                self._end(inc, now, wall)
        return opened

    def end_job(self, job_id: str, now: float, wall: float) -> None:
        for (jid, _), inc in list(self.active.items()):
            if jid == job_id:
                self._end(inc, now, wall)

    def _end(self, inc: Incident, now: float, wall: float) -> None:
        inc.ended_at, inc.ended_wall = now, wall
        del self.active[(inc.job_id, inc.kind)]
        self.ended.append(inc)

    def for_job(self, job_id: str) -> list[Incident]:
        return [i for (jid, _), i in self.active.items() if jid == job_id]


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)
