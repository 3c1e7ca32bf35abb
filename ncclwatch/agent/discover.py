"""Find the training ranks on this node with a psutil process scan.

Environments never change after exec, so each pid is read once and the
verdict cached by (pid, create time); a round only looks at new pids.
Forked children of a rank (DataLoader workers, compile workers) inherit its
environment and are skipped: a rank is the oldest process of its (job, rank).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import psutil

from ncclwatch.envpolicy import filter_env
from ncclwatch.jobid import RankIdentity, identify

log = logging.getLogger(__name__)

#: A non-rank younger than this (seconds) is looked at again each round.
YOUNG = 5.0


@dataclass(frozen=True, slots=True)
class RankProcess:
    pid: int
    create_time: float
    identity: RankIdentity
    env: dict[str, str]  # allowlisted and redacted; nothing else is kept

    @property
    def key(self) -> tuple[str, int]:
        return (self.identity.job_id, self.identity.rank)


class Discovery:
    """Incremental scan: ``scan()`` returns the rank processes alive now."""

    def __init__(self, host: str, own_pid: int | None = None,
                 ranks: frozenset[int] | None = None) -> None:
        self._host = host
        # Only these global ranks (None: all): lets two agents split one job's
        # ranks, as two nodes would.
        self._ranks = ranks
        self._own = own_pid if own_pid is not None else psutil.Process().pid
        # pid -> (create_time, RankProcess | None); None caches "not a rank".
        self._seen: dict[int, tuple[float, RankProcess | None]] = {}
        # Young non-ranks, looked at again: a launcher's child is caught
        # between fork and exec with the launcher's environment (no RANK).
        self._young: set[int] = set()
        self.errors_total = 0

    def scan(self) -> list[RankProcess]:
        pids = set(psutil.pids())
        for gone in self._seen.keys() - pids:
            del self._seen[gone]
        for pid in pids:
            if pid == self._own:
                continue
            cached = self._seen.get(pid)
            # Re-check pid reuse only for ranks (cheap: few); a reused pid of a
            # non-rank is caught when it vanishes between two rounds.
            if cached is not None and pid not in self._young and (
                    cached[1] is None or not self._reused(pid, cached[0])):
                continue
            self._seen[pid] = verdict = self._inspect(pid)
            if verdict[1] is None and verdict[0] and time.time() - verdict[0] < YOUNG:
                self._young.add(pid)
            else:
                self._young.discard(pid)
        self._young &= pids
        candidates = [rp for _, rp in self._seen.values() if rp is not None
                      and (self._ranks is None or rp.identity.rank in self._ranks)]
        return _one_per_rank(candidates)

    def _reused(self, pid: int, create_time: float) -> bool:
        """Pid reused, or the rank died and is a zombie its parent has not reaped."""
        try:
            p = psutil.Process(pid)
            return p.create_time() != create_time or p.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    def _inspect(self, pid: int) -> tuple[float, RankProcess | None]:
        try:
            proc = psutil.Process(pid)
            create_time = proc.create_time()
            if proc.status() == psutil.STATUS_ZOMBIE:
                return (create_time, None)  # dead, not yet reaped by its parent
            env = proc.environ()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return (0.0, None)
        except (psutil.AccessDenied, OSError) as e:
            self.errors_total += 1
            log.debug("cannot read environment of pid %d: %s", pid, e)
            return (0.0, None)
        identity = identify(env, self._host)
        if identity is None:
            return (create_time, None)
        return (create_time, RankProcess(pid, create_time, identity, filter_env(env)))


def _one_per_rank(candidates: list[RankProcess]) -> list[RankProcess]:
    """Keep the oldest process per (job, rank); the others are its forks."""
    best: dict[tuple[str, int], RankProcess] = {}
    for rp in candidates:
        cur = best.get(rp.key)
        if cur is None or (rp.create_time, rp.pid) < (cur.create_time, cur.pid):
            best[rp.key] = rp
    return sorted(best.values(), key=lambda rp: rp.key)


def parse_ranks(text: str) -> frozenset[int] | None:
    """'0-3,7' -> {0, 1, 2, 3, 7}; '' -> None (every rank)."""
    text = text.strip()
    if not text:
        return None
    out: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad rank range {part!r} (expected e.g. 0-3,7)")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise ValueError(f"bad rank range {part!r}: end before start")
        out.update(range(a, b + 1))
    return frozenset(out)
