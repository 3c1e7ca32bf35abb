"""A job's own facts (its environment, timeouts, packages, Flight Recorder)
and who may state them.

Job-level facts come from the nodes that own ranked members: a ranked sample
here is its owner's (ownership.py set the others aside). A member without a
rank proves no place in the job: it may fill in facts nobody ranked gave, or
speak for a node that owns a ranked member, never replace them otherwise.
A timeout sets the job's budget; a change of a known one is logged and kept.

Timeouts, each with its source (what the API shows as ``timeout_source``):
the Flight Recorder's, per process group (``group_timeout``: the group the
longest-blocked waiter's pending collective is in), what the job states
(``JobInfo.watchdog_timeout_source``), and what an earlier incarnation of
the same job id showed (``PastTimeouts``; ``observed_kill``).
"""

from __future__ import annotations

import collections
import logging
from typing import TYPE_CHECKING, Any

from ncclwatch.daemon.records import MAX_PACKAGES, Job, TimeoutNote
from ncclwatch.envlint import lint
from ncclwatch.flightrec import is_default_group

if TYPE_CHECKING:
    from ncclwatch.daemon.jobinfo import JobInfos

log = logging.getLogger(__name__)

_TIMEOUT_FIELD = {"flight_recorder": "fr_timeout", "job": "declared_timeout"}
#: Budget sources (budget.timeout_for): the Flight Recorder's default group,
#: another group's prefix, a job that states its timeout without saying where
#: (an older agent), an earlier incarnation's prefix, a measured kill.
FLIGHT_RECORDER, GROUP, STATED, PREVIOUS, OBSERVED_KILL = (
    "flight_recorder", "flight_recorder:group ", "job", "previous_run:", "observed_kill")
#: A group's name in a source is cut to this many characters.
MAX_GROUP_NAME = 64
#: What an earlier incarnation showed is used for this long (seconds) after it
#: last showed it, for at most this many job ids (the oldest forgotten first).
PAST_KEEP = 24 * 3600.0
PAST_JOBS = 10_000


def _set_timeout(job: Job, what: str, value: float, recv: float, node: str, rank: int,
                 source: str = "") -> None:
    """A timeout that sets the job's budget; a change of a known one is logged
    and kept (Job.timeout_changes): the budget moves with it."""
    attr = _TIMEOUT_FIELD[what]
    old = getattr(job, attr)
    if value:
        _note(job, value, source or (FLIGHT_RECORDER if what == "flight_recorder" else STATED),
              recv, flight_recorder=what == "flight_recorder")
    if what == "job":
        job.declared_timeout_source = source if value else ""
    if value == old:
        return
    setattr(job, attr, value)
    if old and value and not any(c[1] == what and c[3] == value for c in job.timeout_changes):
        job.timeout_changes.append((recv, what, old, value, node, rank))
        log.warning("job %r: %s timeout changed from %gs to %gs (node %r, rank %d)",
                    job.job_id, what, old, value, node, rank)


def _note(job: Job, seconds: float, source: str, at: float, flight_recorder: bool = False
          ) -> None:
    """What a later incarnation starts from: this incarnation's Flight Recorder
    over its own statement, either over what it inherited or a measured kill."""
    n = job.timeout_note
    if flight_recorder or n.source != FLIGHT_RECORDER or n.at < job.first_seen:
        n.seconds, n.source, n.at = seconds, source, at


def observed_kill(job: Job, waited: float, now: float) -> None:
    """The hook for an incident's outcome: all the waiters of a stall went after
    waiting ``waited`` seconds (the watchdog fired), which measures the job's
    timeout. Kept for the job's next incarnation (``observed_kill``) only when
    nothing exact was shown; a restart quick enough to find this record still
    held (launchers restart in seconds, within --gone-job-ttl) starts from it too."""
    if waited > 0 and job.timeout_note.source in ("", OBSERVED_KILL):
        n = job.timeout_note
        n.seconds, n.source, n.at = waited, OBSERVED_KILL, now
        job.previous_timeout = (waited, OBSERVED_KILL)


class PastTimeouts:
    """The timeout each job id's incarnations showed, so that a restart (a
    torchelastic restart, a Slurm requeue: the same job id) starts from its
    previous run's until it states its own. Holds each job's small
    ``TimeoutNote``, not the job; bounded (PAST_JOBS, PAST_KEEP)."""

    def __init__(self, keep: float = PAST_KEEP, limit: int = PAST_JOBS) -> None:
        self.keep, self.limit = keep, limit
        self._notes: collections.OrderedDict[str, TimeoutNote] = collections.OrderedDict()

    def carry(self, job: Job, now: float) -> None:
        """A new record for ``job``'s id: what the last incarnation showed becomes
        its ``previous_timeout``; its own note is kept from now on."""
        old = self._notes.pop(job.job_id, None)
        if old is not None and old is not job.timeout_note and old.seconds > 0 \
                and now - old.at <= self.keep:
            base = old.source.removeprefix(PREVIOUS)
            job.previous_timeout = (old.seconds, base if base == OBSERVED_KILL
                                    else PREVIOUS + base)
            # Until the new incarnation states its own, it is what it inherits.
            job.timeout_note.seconds, job.timeout_note.source, job.timeout_note.at = (
                old.seconds, old.source, old.at)
        self._notes[job.job_id] = job.timeout_note
        while len(self._notes) > self.limit:
            self._notes.popitem(last=False)


def group_timeout(job: Job, rank: int | None, since: float) -> tuple[float, str]:
    """(seconds, source) of the process group ``rank`` waits in, by its own
    Flight Recorder dump written during this wait (at or after ``since``):
    of its pending collectives, the one whose watchdog fires first. (0, ""):
    not known (no such dump, nothing pending, no timeout in it)."""
    got = job.flight_recorder.get(rank) if rank is not None else None
    if got is None or got[0] < since:
        return 0.0, ""
    best = None
    for g in got[1].groups:
        if not (g.pending_op and g.pending_timeout_ms):
            continue
        left = g.pending_timeout_ms / 1000.0 - g.pending_seconds
        if best is None or left < best[0]:
            best = (left, g)
    if best is None:
        return 0.0, ""
    g = best[1]
    if is_default_group(g.pg_name, g.pg_desc):
        return g.pending_timeout_ms / 1000.0, FLIGHT_RECORDER
    return g.pending_timeout_ms / 1000.0, GROUP + (g.pg_desc or g.pg_name)[:MAX_GROUP_NAME]


def _owns_ranked(job: Job, node: str) -> bool:
    return any(k >= 0 and r.node == node and r.gone_at is None for k, r in job.ranks.items())


def may_state_facts(job: Job, ranked: bool, node: str) -> bool:
    """A sample of this node (``ranked``: with a rank) may set the job's facts."""
    return ranked or not job.facts_ranked or _owns_ranked(job, node)


def take_facts(job: Job, s: Any, rank: int, recv: float, node: str,
               infos: JobInfos | None = None) -> bool:
    """A RankSample's Flight Recorder and job facts; False: refused (a member
    without a rank where ranked members gave them). ``infos``: where a
    JobInfo's environment is read once for every rank that sends it."""
    ident = s.identity
    if not may_state_facts(job, ident.rank >= 0, node):
        return False
    if s.HasField("flight_recorder"):
        job.facts_ranked |= ident.rank >= 0
        fr = s.flight_recorder
        job.flight_recorder[rank] = (recv - fr.dump_age_seconds, fr)
        for g in fr.groups:
            # The default group's timeout is the job's; another group's only
            # while none is known.
            if g.pending_timeout_ms and (is_default_group(g.pg_name, g.pg_desc)
                                         or not job.fr_timeout):
                _set_timeout(job, "flight_recorder", g.pending_timeout_ms / 1000.0,
                             recv, node, ident.rank)
    if s.HasField("job"):
        info = s.job
        job.facts_ranked |= ident.rank >= 0
        job.source = info.source
        env = infos.facts(info).env if infos is not None else dict(info.env)
        if env is not job.env and env != job.env:
            job.env = env
            job.warnings = lint(job.env)
        _set_timeout(job, "job", info.watchdog_timeout_seconds, recv, node, ident.rank,
                     info.watchdog_timeout_source if info.watchdog_timeout_seconds else "")
        if info.packages and not job.packages.issuperset(info.packages):
            job.packages = frozenset(sorted(job.packages.union(info.packages))[:MAX_PACKAGES])
        if info.HasField("scheduler_job"):
            sj = info.scheduler_job
            job.scheduler_job = {"scheduler": sj.scheduler, "job_id": sj.job_id,
                                 "job_name": sj.job_name, "user": sj.user,
                                 "source": sj.source}
    return True
