"""A job's own facts (its environment, timeouts, packages, Flight Recorder)
and who may state them.

Job-level facts come from the nodes that own ranked members: a ranked sample
here is its owner's (ownership.py set the others aside). A member without a
rank proves no place in the job: it may fill in facts nobody ranked gave, or
speak for a node that owns a ranked member, never replace them otherwise.
A timeout sets the job's budget; a change of a known one is logged and kept.
"""

from __future__ import annotations

import logging
from typing import Any

from ncclwatch.daemon.records import MAX_PACKAGES, Job
from ncclwatch.envlint import lint
from ncclwatch.flightrec import is_default_group

log = logging.getLogger(__name__)

_TIMEOUT_FIELD = {"flight_recorder": "fr_timeout", "job": "declared_timeout"}


def _set_timeout(job: Job, what: str, value: float, recv: float, node: str, rank: int) -> None:
    """A timeout that sets the job's budget; a change of a known one is logged
    and kept (Job.timeout_changes): the budget moves with it."""
    attr = _TIMEOUT_FIELD[what]
    old = getattr(job, attr)
    if value == old:
        return
    setattr(job, attr, value)
    if old and value and not any(c[1] == what and c[3] == value for c in job.timeout_changes):
        job.timeout_changes.append((recv, what, old, value, node, rank))
        log.warning("job %r: %s timeout changed from %gs to %gs (node %r, rank %d)",
                    job.job_id, what, old, value, node, rank)


def _owns_ranked(job: Job, node: str) -> bool:
    return any(k >= 0 and r.node == node and r.gone_at is None for k, r in job.ranks.items())


def may_state_facts(job: Job, ranked: bool, node: str) -> bool:
    """A sample of this node (``ranked``: with a rank) may set the job's facts."""
    return ranked or not job.facts_ranked or _owns_ranked(job, node)


def take_facts(job: Job, s: Any, rank: int, recv: float, node: str) -> bool:
    """A RankSample's Flight Recorder and job facts; False: refused (a member
    without a rank where ranked members gave them)."""
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
        env = dict(info.env)
        if env != job.env:
            job.env = env
            job.warnings = lint(job.env)
        _set_timeout(job, "job", info.watchdog_timeout_seconds, recv, node, ident.rank)
        if info.packages and not job.packages.issuperset(info.packages):
            job.packages = frozenset(sorted(job.packages.union(info.packages))[:MAX_PACKAGES])
        if info.HasField("scheduler_job"):
            sj = info.scheduler_job
            job.scheduler_job = {"scheduler": sj.scheduler, "job_id": sj.job_id,
                                 "job_name": sj.job_name, "user": sj.user,
                                 "source": sj.source}
    return True
