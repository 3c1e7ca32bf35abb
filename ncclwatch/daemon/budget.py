"""The watchdog budget: how long until the process-group timeout fires.

remaining = timeout - time the longest-blocked rank has been blocked. The
timeout comes from the most specific source (``timeout_for``): the job's own
Flight Recorder (the pending collective's timeout_ms, exact; that of the
group the longest-blocked rank waits in when its dump shows it), what the
job states (its environment, command line, config file or set-up frame:
agent/timeouts.py), a per-job override in the daemon's config, what a
previous incarnation of the job id showed, then the daemon default (600 s,
torch's default: an assumed value, said so wherever shown).

The budget errs small, never large: a wait's start is the earliest moment
the evidence allows (the agent's tracker and the table's receive anchor both
take it so), and a budget read between ticks is aged to the moment it is
read (``Budget.at``), not shown as it stood at the last tick.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from ncclwatch import timeoutsource
from ncclwatch.daemon import jobfacts
from ncclwatch.daemon.records import Job
from ncclwatch.daemon.settings import NCCL_DEFAULT_TIMEOUT
from ncclwatch.daemon.table import JobTable


@dataclass(frozen=True)
class BudgetConfig:
    default_timeout: float = NCCL_DEFAULT_TIMEOUT
    #: job id glob -> timeout seconds, from the daemon config file.
    job_timeouts: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Budget:
    timeout: float
    source: str                 # where the timeout came from: timeout_for
    blocked_rank: int | None    # the longest-blocked rank
    blocked_seconds: float
    remaining: float
    #: Daemon monotonic time the budget was computed at.
    at: float = 0.0

    @property
    def assumed(self) -> bool:
        """The timeout is the daemon's guess (timeoutsource): say so, advise safely."""
        return timeoutsource.assumed(self.source)

    def aged(self, now: float) -> "Budget":
        """The budget as it stands at ``now`` (>= ``at``): a blocked rank's wait
        goes on between ticks, so its remaining time keeps falling."""
        dt = now - self.at
        if self.blocked_rank is None or dt <= 0:
            return self
        return Budget(self.timeout, self.source, self.blocked_rank,
                      self.blocked_seconds + dt, self.remaining - dt, now)


def timeout_for(job: Job, cfg: BudgetConfig, waiter: int | None = None,
                since: float = 0.0) -> tuple[float, str]:
    """(seconds, source), most exact first: the Flight Recorder's timeout of the
    group ``waiter`` (the longest-blocked rank, waiting since ``since``) waits
    in, the Flight Recorder's default group, what the job states (its source:
    ``args:--distributed-timeout-minutes``, ...), the config's per-job
    timeout, what a previous incarnation showed, the daemon's default."""
    seconds, source = jobfacts.group_timeout(job, waiter, since)
    if seconds > 0:
        return seconds, source
    if job.fr_timeout > 0:
        return job.fr_timeout, jobfacts.FLIGHT_RECORDER
    if job.declared_timeout > 0:
        return job.declared_timeout, job.declared_timeout_source or jobfacts.STATED
    for pattern, seconds in cfg.job_timeouts.items():
        if fnmatchcase(job.job_id, pattern):
            return seconds, "config"
    if job.previous_timeout[0] > 0:
        return job.previous_timeout
    return cfg.default_timeout, "default"


_SINCE = operator.attrgetter("since")


def budget(job: Job, table: JobTable, now: float, cfg: BudgetConfig) -> Budget:
    worst, worst_for = None, 0.0
    live = job.live_waiting()
    if live:
        # The longest-blocked: the earliest start (a C loop over 100k waiters),
        # then the first rank in the waiting set's order that waited that long.
        longest = now - min(live, key=_SINCE).since
        if longest > 0:
            worst_for = longest
            worst = next(rec.rank for rec in live if now - rec.since == longest)
    timeout, source = timeout_for(job, cfg, worst, now - worst_for)
    return Budget(timeout, source, worst, worst_for, timeout - worst_for, now)
