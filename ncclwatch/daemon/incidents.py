"""Incidents: one stall from first sight to end, with its evidence.

Findings come fresh from the detectors each tick; an incident ties them
together, remembers when it was first detected, how the budget and the
culprit's write progressed, and keeps the grouped stacks for the page/API.
An ended incident carries its outcome (outcome.py) and is kept for a day,
also after its job left the table.
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field
from typing import Callable

from ncclwatch.daemon import jobfacts
from ncclwatch.daemon.budget import Budget
from ncclwatch.daemon.detect import Finding
from ncclwatch.daemon.diagnosis import StallDiagnosis
from ncclwatch.daemon.outcome import EndFacts, Forecast, Outcome, Score, decide, score
from ncclwatch.daemon.records import Job, RankRecord
from ncclwatch.model import StallKind
from ncclwatch.remediation import RootCause

MAX_ENDED = 200
#: Ended incidents are kept this long (seconds), with their outcome.
KEEP_ENDED = 24 * 3600.0
#: Seconds after its end an incident's outcome is decided: the exits of its
#: ranks show on their agents' next rounds.
SETTLE = 5.0
#: Bounds of ncclwatch_forecast_error_seconds (seconds).
ERROR_BUCKETS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
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
    #: Ranks seen waiting, culprit and unknown over the incident's life (the
    #: last finding alone misses a waiter the watchdog took first).
    waiters: set[int] = field(default_factory=set)
    others: set[int] = field(default_factory=set)
    #: The first save forecast (what the on-call saw), scored at the end.
    forecast: Forecast | None = None
    outcome: Outcome | None = None
    score: Score | None = None

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
        #: Ended incidents by (kind, outcome); forecasts scored by (verdict, right).
        self.outcomes_total: collections.Counter[tuple[str, str]] = collections.Counter()
        self.verdicts_total: collections.Counter[tuple[str, bool]] = collections.Counter()
        #: |predicted - actual| end of completed saves: bucket counts, sum, count.
        self.error_buckets = [0] * len(ERROR_BUCKETS)
        self.error_sum, self.error_count = 0.0, 0
        #: Ended, their outcome not decided yet (settle).
        self.settling: list[Incident] = []
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
            if f.waiting != inc.finding.waiting or inc.finding is f:
                inc.waiters.update(f.waiting)
            inc.others.update(f.unknown)
            inc.others.update(c.rank for c in f.culprits)
            if inc.forecast is None and dx.checkpoint_eta is not None:
                inc.forecast = Forecast(now, now + dx.checkpoint_eta, now + budget.remaining)
            inc.finding = f
            inc.budget = budget
            inc.diagnosis = dx
            if not inc.root_causes or inc.root_causes[-1] != dx.root_cause.id:
                inc.root_causes.append(dx.root_cause.id)
            if dx.at_risk and inc.at_risk_since is None:
                inc.at_risk_since = now
            if f.started_at < inc.started_at:
                # The waits dated earlier (a better clock offset: a restarted
                # daemon's first reports had waited in the agent's queue): the
                # start's wall time moves with it, or every wall time read off
                # the pair (clock.view, at_risk_since) is that much late.
                inc.started_wall -= inc.started_at - f.started_at
                inc.started_at = f.started_at
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
        self.settling.append(inc)

    def settle(self, now: float, job_of: Callable[[str], Job | None],
               fresh: Callable[[RankRecord, float], bool], job_id: str | None = None
               ) -> list[str]:
        """Decide the outcome of incidents ended SETTLE seconds ago (those of
        ``job_id`` at once: it is leaving the table).

        A stall's finding goes away on the tick a waiter leaves its wait; its
        exit shows on the agent's next round, so the decision waits for it.
        Returns the jobs whose timeout a kill measured (their budget changed)."""
        keep, measured = [], []
        for inc in self.settling:
            if inc.job_id != job_id and now - (inc.ended_at or now) < SETTLE:
                keep.append(inc)
                continue
            end = inc.ended_at if inc.ended_at is not None else now
            job = job_of(inc.job_id)
            inc.outcome = decide(end_facts(inc, job, fresh, end))
            if job is not None and inc.outcome.outcome == "killed_by_watchdog" \
                    and inc.outcome.waited_seconds:
                # The waiters' measured wait is the job's timeout: its restart's budget.
                jobfacts.observed_kill(job, inc.outcome.waited_seconds, end)
                measured.append(inc.job_id)
            inc.score = score(inc.forecast, inc.outcome, end)
            self._count(inc)
        self.settling = keep
        return measured

    def _count(self, inc: Incident) -> None:
        assert inc.outcome is not None
        self.outcomes_total[(inc.kind.value, inc.outcome.outcome)] += 1
        sc = inc.score
        if sc is None:
            return
        self.verdicts_total[(sc.verdict, sc.right)] += 1
        if sc.error_seconds is not None:
            err = abs(sc.error_seconds)
            self.error_sum += err
            self.error_count += 1
            for i, le in enumerate(ERROR_BUCKETS):  # per bucket; exported cumulative
                if err <= le:
                    self.error_buckets[i] += 1
                    break

    def prune(self, now: float) -> None:
        """Forget ended incidents older than KEEP_ENDED."""
        ended = self.ended
        while ended and now - (ended[0].ended_at or now) > KEEP_ENDED:
            ended.popleft()

    def recent(self, job_id: str) -> list[Incident]:
        """The job's ended incidents still kept, newest first."""
        return [i for i in reversed(self.ended) if i.job_id == job_id]

    def for_job(self, job_id: str) -> list[Incident]:
        return [i for (jid, _), i in self.active.items() if jid == job_id]


def end_facts(inc: Incident, job: Job | None,
              fresh: Callable[[RankRecord, float], bool] | None, now: float) -> EndFacts:
    """What the table knows of the incident's ranks at its end (``now``): a rank
    gone after it counts only as a waiter that went in its wait."""
    b = inc.budget
    if job is None:
        return EndFacts(inc.started_at, now, b.timeout, b.source, len(inc.waiters), (), None,
                        0, job_known=False)
    ranks = job.ranks
    deaths, silent, first = [], 0, None
    waiters = inc.waiters | {r for r in inc.others
                             if (rec := ranks.get(r)) is not None and rec.gone_waiting}
    for r in waiters:
        rec = ranks.get(r)
        if rec is None:
            continue
        if rec.gone_at is not None:
            # Gone in its wait, or while the stall was on; a rank that left its
            # wait and exited after (a job's last save, then its end) was not killed.
            if rec.gone_at >= inc.started_at and (rec.gone_waiting or rec.gone_at <= now):
                deaths.append(rec.gone_at)
        elif fresh is not None and not fresh(rec, now):
            silent += 1
    for r in inc.others - waiters:
        rec = ranks.get(r)
        if rec is None:
            continue
        if rec.gone_at is not None:
            if rec.gone_at <= now and (first is None or rec.gone_at < first[3]):
                state = next((c.state.value for c in inc.finding.culprits if c.rank == r),
                             "unknown")
                first = (r, rec.node, state, rec.gone_at)
        elif fresh is not None and not fresh(rec, now):
            silent += 1
    return EndFacts(inc.started_at, now, b.timeout, b.source, len(waiters), tuple(sorted(deaths)),
                    first, silent)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)
