"""Root cause by evidence: pick the remediation entry a finding's facts support.

A finding says *who* waits for *whom*; the diagnosis says *why*, from the
culprit's curves: its write rate against the expected checkpoint size, its
memory growth against the nearest limit, its CPU use. The rules are a table
(first match per kind wins); the sentences and fixes live in remediation.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from ncclwatch import timeoutsource
from ncclwatch.advice import Advice, advise
from ncclwatch.daemon import clock
from ncclwatch.daemon.budget import Budget
from ncclwatch.daemon.detect import Finding
from ncclwatch.daemon.forecast import (
    MemoryForecast,
    WriteForecast,
    memory_forecasts,
    write_forecast,
)
from ncclwatch.daemon.records import Job
from ncclwatch.daemon.smooth import Smoother
from ncclwatch.daemon.table import JobTable
from ncclwatch.model import SIZE_SOURCES, RankState, StallKind, rank_label, rank_ranges
from ncclwatch.remediation import BY_ID, RootCause
from ncclwatch.savefit import Fit, seconds, size  # noqa: F401 - the shared words

#: Without a forecast that says otherwise, a stall is at risk once this
#: share of the watchdog budget is used up. "Otherwise" is a write forecast
#: on the file's own size (forecast.EXACT_SOURCES) that ends within budget:
#: a guessed size (previous checkpoint, gathered memory) does not overrule it.
RISK_FRACTION = 0.5
#: A rank using less than this share of a core is not computing, whatever
#: its Python stack says (it sleeps or blocks in C code).
IDLE_CPU = 0.05


@dataclass(frozen=True)
class StallEvidence:
    finding: Finding
    budget: Budget
    write: WriteForecast | None
    memory: tuple[MemoryForecast, ...]      # culprits' bounds, nearest first
    culprit_states: tuple[str, ...]
    waiter_states: frozenset[RankState]
    exited: tuple[int, ...]                 # unknown ranks whose exit was seen
    silent: tuple[int, ...]                 # unknown ranks nobody reports

    @property
    def overrun(self) -> float | None:
        """Seconds the save is forecast to outlast the budget (>0: too late)."""
        if self.write is None or self.write.eta_seconds is None:
            return None
        return self.write.eta_seconds - self.budget.remaining

    @property
    def fits_budget(self) -> bool:
        """The file's own size and its rate say the save ends in time."""
        return (self.write is not None and self.write.exact and self.overrun is not None
                and self.overrun <= 0)

    def memory_applies(self, m: MemoryForecast) -> bool:
        """A memory forecast that matters to this stall: the bound is reached before
        the watchdog fires and before the write ends (a host-memory ETA during a
        write-bound save that ends first is not shown)."""
        if m.eta_seconds is None or m.eta_seconds >= max(self.budget.remaining, 0):
            return False
        w = self.write
        return w is None or w.eta_seconds is None or m.eta_seconds < w.eta_seconds

    @property
    def memory_runs_out(self) -> MemoryForecast | None:
        m = self.memory[0] if self.memory else None
        if m and m.eta_seconds is not None and m.eta_seconds < max(self.budget.remaining, 0):
            return m
        return None


@dataclass(frozen=True)
class StallDiagnosis:
    root_cause: RootCause
    sentence: str
    at_risk: bool
    evidence: StallEvidence = field(repr=False)
    #: What to do with the running job now (advice.py).
    advice: Advice | None = None

    @property
    def checkpoint_eta(self) -> float | None:
        w = self.evidence.write
        return w.eta_seconds if w else None


Rule = tuple[str, Callable[[StallEvidence], bool]]

#: Per kind, (root cause id, predicate) in order; the last row always matches.
RULES: dict[StallKind, tuple[Rule, ...]] = {
    StallKind.CHECKPOINT_GATHER: (
        ("gather_out_of_memory", lambda e: e.memory_runs_out is not None),
        ("save_overruns_watchdog", lambda e: e.overrun is not None and e.overrun > 0),
        ("save_within_assumed_timeout", lambda e: e.overrun is not None and e.budget.assumed),
        ("save_within_budget", lambda e: e.overrun is not None),
        ("slow_state_dict_gather", lambda e: "gathering_state_dict" in e.culprit_states),
        ("slow_save", lambda e: True),
    ),
    StallKind.CHECKPOINT_RESTORE: (
        ("restore_out_of_memory", lambda e: e.memory_runs_out is not None),
        ("slow_restore", lambda e: True),
    ),
    StallKind.COLLECTIVE_HANG: (
        # Every rank waits in it and none is elsewhere: no culprit rank.
        ("all_ranks_in_collective", lambda e: not e.finding.culprits),
        ("late_for_state_dict_gather",
         lambda e: RankState.GATHERING_STATE_DICT in e.waiter_states),
        ("rank_in_dataloader", lambda e: "dataloader" in e.culprit_states),
        ("rank_waiting_on_device", lambda e: "device_wait" in e.culprit_states),
        ("rank_computing", lambda e: "compute" in e.culprit_states),
        ("rank_idle", lambda e: True),
    ),
    StallKind.DESYNC: (
        ("collective_order_mismatch", lambda e: True),
    ),
    StallKind.RANK_LOST: (
        ("rank_exited", lambda e: bool(e.exited)),
        ("agent_silent", lambda e: True),
    ),
}


def stall_evidence(job: Job, table: JobTable, f: Finding, b: Budget, now: float,
             smooth: Smoother | None = None) -> StallEvidence:
    write, memory, states = None, [], []
    for c in f.culprits:
        rec = job.ranks.get(c.rank)
        if rec is None:
            continue
        if write is None and rec.state is RankState.SAVING:
            write = write_forecast(rec, now)
        memory += memory_forecasts(rec, now)
        state = rec.state.value
        if rec.state is RankState.COMPUTE and max(rec.cpu_util, rec.cpu_recent) < IDLE_CPU:
            state = "idle"  # a Python frame with no CPU behind it: sleeping
        states.append(state)
    if smooth is not None:  # one countdown per forecast, not a new guess each tick
        key = (job.job_id, f.kind.value)
        # A write forecast only once its rate is a fit: the first seconds' estimates
        # (forecast.write_rate) are what calls an overrun early, taken as they are;
        # a new rate source starts a new countdown.
        if write is not None and write.rate_source == "fit":
            write = replace(write, eta_seconds=smooth.update(key + ("write", write.path),
                                                             write.eta_seconds, now))
        memory = [replace(m, eta_seconds=smooth.update(key + ("memory", m.rank, m.device),
                                                       m.eta_seconds, now)) for m in memory]
    memory.sort(key=lambda m: (m.eta_seconds is None, m.eta_seconds or 0.0))
    # The states the waiters are in, from the per-state indexes (C set operations
    # over 100k waiters, not a Python walk).
    waiting = set(f.waiting)
    waiters = frozenset(s for s, members in job.by_state.items()
                        if members and not members.isdisjoint(waiting))
    exited = tuple(r for r in f.unknown
                   if r in job.ranks and job.ranks[r].gone_at is not None)
    silent = tuple(r for r in f.unknown if r not in exited)
    return StallEvidence(f, b, write, tuple(memory), tuple(states), waiters, exited, silent)


def diagnose_stall(job: Job, table: JobTable, f: Finding, b: Budget, now: float,
             smooth: Smoother | None = None) -> StallDiagnosis:
    e = stall_evidence(job, table, f, b, now, smooth)
    rc = next(BY_ID[rid] for rid, applies in RULES[f.kind] if applies(e))
    at_risk = (rc.always_at_risk
               or (e.overrun is not None and e.overrun > 0)
               or e.memory_runs_out is not None
               or (b.remaining < RISK_FRACTION * b.timeout and not e.fits_budget))
    words = facts(e, now)
    return StallDiagnosis(rc, rc.cause.format_map(words), at_risk, e, advise(e, words))


def facts(e: StallEvidence, now: float) -> dict[str, str]:
    """The words a root-cause template may use, already formatted."""
    f, b = e.finding, e.budget
    lead = f.culprits[0] if f.culprits else None
    w, m = e.write, (e.memory_runs_out or (e.memory[0] if e.memory else None))
    return {
        "rank": rank_label(lead.rank) if lead else "?",
        "host": lead.node if lead else "?",
        "activity": (lead.state.value.replace("_", " ") if lead else "?"),
        "for_s": (clock.span(lead.seen_for, lead.for_seconds, seconds) if lead
                  else seconds(now - f.started_at)),
        "culprits": rank_ranges(c.rank for c in f.culprits) or "none",
        "culprit_states": ", ".join(sorted(set(e.culprit_states))) or "unknown",
        "waiting": rank_ranges(f.waiting),
        "waiting_n": str(len(f.waiting)),
        "ops": "/".join(o.value for o in f.waiting_ops) or "a collective",
        "groups": f.summary.partition(": ")[2] or f.summary,
        "unknown": rank_ranges(f.unknown) or "none",
        "remaining": timeoutsource.budget_words(seconds(b.remaining), b.timeout, b.source),
        "timeout": seconds(b.timeout),
        "timeout_note": timeoutsource.note(b.timeout, b.source) or "stated by the job",
        "written": size(w.written_bytes) if w else "?",
        "expected": size(w.expected_bytes) if w and w.expected_bytes else "an unknown size",
        "expected_source": SIZE_SOURCES.get(w.expected_source if w else "", "unknown"),
        "rate": size(w.rate_bytes_per_second) if w else "?",
        "eta": seconds(w.eta_seconds) if w and w.eta_seconds is not None else "?",
        "overrun": seconds(e.overrun) if e.overrun is not None else "?",
        "margin": seconds(-e.overrun) if e.overrun is not None else "?",
        # The same words as `ncclwatch preflight` (savefit.Fit).
        "fit": (Fit(w.eta_seconds, max(b.remaining, 0.0)).words()
                if w and w.eta_seconds is not None else "?"),
        "device": m.device.replace("_", " ") if m else "?",
        "mem_used": size(m.used_bytes) if m else "?",
        "mem_limit": size(m.limit_bytes) if m else "?",
        "mem_rate": size(m.rate_bytes_per_second) if m else "?",
        "mem_eta": seconds(m.eta_seconds) if m and m.eta_seconds is not None else "?",
    }
