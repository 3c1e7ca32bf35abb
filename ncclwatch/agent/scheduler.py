"""The batch scheduler's view of a rank's job: its name and the user who submitted it.

People know their jobs by the scheduler's job name, not by ncclwatch's job id.
The rank's environment says it where the scheduler put it there (Slurm sets
SLURM_JOB_NAME and SLURM_JOB_USER for every task); where a launcher or a
container dropped them, the agent asks the scheduler's client on its node,
once per job id, within a time bound, and carries on without when the client
is absent or does not answer. The client runs with the agent's own
configuration, never with a path from the rank's environment: a user's
SLURM_CONF could load plugins into a root process.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Mapping

from ncclwatch.sanitize import clean, gate

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SchedulerJob:
    scheduler: str       # "slurm"
    job_id: str
    name: str = ""
    user: str = ""
    source: str = ""     # "env", "scontrol" (where name/user came from), "" (unknown)

    @property
    def complete(self) -> bool:
        return bool(self.name and self.user)


@dataclass(frozen=True, slots=True)
class Scheduler:
    """One scheduler's variables and client query (a row of SCHEDULERS)."""

    name: str
    job_id_var: str
    name_var: str
    user_var: str
    client: str                              # the command the query needs
    query: Callable[[str], list[str]]        # job id -> argv
    parse: Callable[[str], tuple[str, str]]  # output -> (job name, user)


_SCONTROL_JOB = re.compile(r"\bJobName=(.*?) UserId=([^\s(]+)")


def _parse_scontrol(out: str) -> tuple[str, str]:
    m = _SCONTROL_JOB.search(out)
    return (m.group(1), m.group(2)) if m else ("", "")


SCHEDULERS: tuple[Scheduler, ...] = (
    Scheduler("slurm", "SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_JOB_USER", "scontrol",
              lambda job: ["scontrol", "show", "job", job, "--oneliner"], _parse_scontrol),
)

#: A job id passed to a client must look like one (Slurm: digits, array ids N_M).
_JOB_ID = re.compile(r"^[0-9][0-9_]{0,30}$")


class SchedulerLookup:
    """``job(env)``: the scheduler job of a rank, queries cached per job id."""

    def __init__(self, *, timeout: float = 2.0, retry_after: float = 60.0,
                 max_jobs: int = 256, run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
                 which: Callable[[str], str | None] = shutil.which,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout, self.retry_after, self.max_jobs = timeout, retry_after, max_jobs
        self._run, self._which, self._clock = run, which, clock
        # (scheduler, job id) -> (when asked, (name, user) or None when it failed)
        self._cache: OrderedDict[tuple[str, str], tuple[float, tuple[str, str] | None]] = \
            OrderedDict()
        self._warned: set[str] = set()
        self.queries_total = 0
        self.failures_total = 0

    def job(self, env: Mapping[str, str]) -> SchedulerJob | None:
        for s in SCHEDULERS:
            job_id = env.get(s.job_id_var, "")
            if not job_id:
                continue
            name, user = env.get(s.name_var, ""), env.get(s.user_var, "")
            source = "env" if name or user else ""
            if not (name and user) and _JOB_ID.match(job_id):
                asked = self._ask(s, job_id)
                if asked is not None:
                    name, user, source = name or asked[0], user or asked[1], s.client
            return SchedulerJob(s.name, _clip(job_id), _clip(name), _clip(user), source)
        return None

    def _ask(self, s: Scheduler, job_id: str) -> tuple[str, str] | None:
        key, now = (s.name, job_id), self._clock()
        hit = self._cache.get(key)
        if hit is not None and (hit[1] is not None or now - hit[0] < self.retry_after):
            self._cache.move_to_end(key)
            return hit[1]
        answer = self._query(s, job_id)
        self._cache[key] = (now, answer)
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_jobs:
            self._cache.popitem(last=False)
        return answer

    def _query(self, s: Scheduler, job_id: str) -> tuple[str, str] | None:
        if self._which(s.client) is None:
            if s.client not in self._warned:
                self._warned.add(s.client)
                log.info("%s not found: %s job names and users come from the ranks' "
                         "environment only", s.client, s.name)
            return None
        self.queries_total += 1
        try:
            # A job name is any bytes the user gave sbatch: undecodable ones
            # are kept as surrogate escapes for the sanitiser, never an error.
            r = self._run(s.query(job_id), capture_output=True, text=True,
                          errors="surrogateescape", timeout=self.timeout,
                          stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as e:
            self.failures_total += 1
            log.debug("%s for job %s failed: %s", s.client, job_id, e)
            return None
        name, user = s.parse(r.stdout) if r.returncode == 0 else ("", "")
        if not (name or user):
            self.failures_total += 1
            log.debug("%s for job %s: no answer (%d) %s", s.client, job_id, r.returncode,
                      clean(r.stderr.strip(), 200, count=False))
            return None
        return (name, user)


def _clip(value: str) -> str:
    """Names are the user's text: through the gate as the report field they
    fill (redacted like any value that leaves the node, escaped, bounded)."""
    return gate("SchedulerJob.job_name", value.strip())
