"""Who owns a rank when two nodes report it: the evidence, never the first claim.

A node's certificate proves which node speaks, not which ranks run there, and
job ids are guessable (``slurm:<job>.<step>``, ``master:<host>:<port>/<world>``):
any node can report rank N of any job. So a claim never blocks another
node's reports (no FAILED_PRECONDITION): when two nodes' agents report the
same rank, the daemon weighs the evidence (``RULES``, first match decides)
and the loser's samples of that rank are set aside, not refused: it stays
the rank's contender (shown in the API and ``ncclwatch status``, counted in
``ncclwatch_daemon_rank_claims_total``).

A rank changes owner only on evidence the claimant cannot make up alone:
the owner's silence (its agent stale, or the rank gone), or the scheduler's
node list as the job's other nodes state it (schednodes.corroborates: at
least two live nodes besides the claimant, and most of those that state
one, state a list that names the claimant's node and not the owner's). A
list the claimant states, with its claim or through a rank nobody reported
that it took first, is its own word and counts for nothing. A process start the claimant reports
is its own word: a younger process alone never moves a rank
(``uncorroborated``), and a node that held a rank cannot take it back within
``TAKEOVER_WINDOW``. A job's world size follows the same rules. The daemon
cannot tell two certificate holders' words apart beyond that: the conflict
is always visible, never silent.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from ncclwatch.daemon.schednodes import corroborates

log = logging.getLogger(__name__)

#: Process starts this close (seconds, daemon clock; report transit included)
#: are the same age: no evidence either way.
START_SLACK = 2.0
#: A node that held a rank (or sized a job) cannot take it back within this long.
TAKEOVER_WINDOW = 600.0
#: Contending claims kept (the oldest forgotten first): a bound, not a policy.
MAX_CLAIMS = 10_000


@dataclass
class Claim:
    """What one node last showed of a rank it does not own."""

    node: str
    agent_id: str
    pid: int
    start: float | None      # daemon clock; None: not known
    seen: float              # daemon clock


@dataclass(frozen=True)
class Contest:
    """One claim against an owner, as the rules see it."""

    owner_fresh: bool        # the owner's agent reports, and the rank is not gone
    owner_start: float | None
    start: float | None      # the challenger's process start
    held_lately: bool        # the challenger owned this rank within the window
    #: The scheduler's node list, as the job's other nodes agree on it, names
    #: the challenger's node and not the owner's (schednodes.corroborates).
    corroborated: bool = False


def _later(c: Contest) -> bool:
    """The challenger shows a process start, and the owner showed none or an
    earlier one. A claim with no start (``process_age_seconds`` 0, as any
    certificate holder may send) is no evidence: it never outweighs a node
    that shows its process's start, so a squatter cannot keep a rank by
    hiding its age."""
    return c.start is not None and (c.owner_start is None
                                    or c.start > c.owner_start + START_SLACK)


#: (outcome, whether the challenger takes the rank, when): first match decides.
#: A later process start is recorded (``uncorroborated``) but moves nothing.
RULES: tuple[tuple[str, bool, Callable[[Contest], bool]], ...] = (
    ("owner_silent", True, lambda c: not c.owner_fresh),
    ("corroborated", True, lambda c: c.corroborated and not c.held_lately),
    ("retake_refused", False, lambda c: c.corroborated and c.held_lately),
    ("uncorroborated", False, _later),
    ("kept", False, lambda c: True),
)
#: Every outcome, for the metric (all exported, 0 or not).
OUTCOMES = tuple(name for name, _, _ in RULES)


def decide(c: Contest) -> tuple[str, bool]:
    for name, takes, when in RULES:
        if when(c):
            return name, takes
    raise AssertionError("the last rule matches everything")


class Ownership:
    """Contending claims per (job, rank), and the counts of every decision."""

    def __init__(self) -> None:
        #: job_id -> rank -> node -> the claim of a node that does not own it.
        self.contenders: dict[str, dict[int, dict[str, Claim]]] = {}
        self._n = 0
        self._held: dict[tuple[str, int, str], float] = {}
        #: job_id -> node -> the node list its owned ranked members last stated.
        self._stated: dict[str, dict[str, frozenset[str] | None]] = {}
        #: Decisions by outcome: counted once per new claim (a new node or a
        #: new process of it) and once per change of owner.
        self.claims_total: collections.Counter[str] = collections.Counter()

    def judge(self, table: Any, report: Any, now: float,
              left_out: Collection[str] = ()) -> set[int]:
        """The indexes of ``report``'s samples to set aside: ranks another node
        owns, by the rules. Takes a rank over (the old owner becomes the
        contender) where the challenger wins. Jobs in ``left_out`` (rejected
        from this report) are not judged."""
        aside: set[int] = set()
        node = report.node
        listed: dict[tuple[str, str], bool] = {}   # (job, owner node) -> corroborated
        for i, s in enumerate(report.samples):
            ident = s.identity
            if ident.rank < 0 or ident.job_id in left_out:
                continue                  # keyed by (node, pid): nobody else's
            job = table.jobs.get(ident.job_id)
            rec = job.ranks.get(ident.rank) if job is not None else None
            if rec is None or not rec.node or rec.node == node:
                if rec is not None and ident.job_id in self.contenders:
                    self._drop(ident.job_id, ident.rank, node)   # the owner is no rival
                self._state(ident.job_id, node, s, table)
                continue
            age = ident.process_age_seconds
            start = now - age if age > 0 else None
            held = self._held.get((ident.job_id, ident.rank, node))
            if (ok := listed.get((ident.job_id, rec.node))) is None:
                ok = listed[(ident.job_id, rec.node)] = corroborates(
                    self._witnesses(table, ident.job_id, now), node, (rec.node,))
            contest = Contest(owner_fresh=table.fresh(rec, now), owner_start=rec.start,
                              start=start,
                              held_lately=held is not None and now - held < TAKEOVER_WINDOW,
                              corroborated=ok)
            outcome, takes = decide(contest)
            rivals = self.contenders.setdefault(ident.job_id, {}).setdefault(ident.rank, {})
            prev = rivals.get(node)
            new_claim = prev is None or prev.pid != ident.pid or (
                start is not None and prev.start is not None
                and abs(start - prev.start) > START_SLACK)
            if takes:
                self.claims_total[outcome] += 1
                self._n -= rivals.pop(node, None) is not None
                self._n += rec.node not in rivals
                rivals[rec.node] = Claim(rec.node, rec.agent_id, rec.pid, rec.start, rec.seen)
                # Both held it now: neither may take it back by a newer start.
                self._held[(ident.job_id, ident.rank, node)] = now
                self._held[(ident.job_id, ident.rank, rec.node)] = now
                log.warning("rank %d of job %r: node %r takes it over from node %r (%s)",
                            ident.rank, ident.job_id, node, rec.node, outcome)
                self._state(ident.job_id, node, s, table)
                continue
            if new_claim:
                self.claims_total[outcome] += 1
                log.warning("rank %d of job %r is reported by node %r (pid %d) and owned by "
                            "node %r (pid %d): %s", ident.rank, ident.job_id, node, ident.pid,
                            rec.node, rec.pid, outcome)
            self._n += prev is None
            rivals[node] = Claim(node, report.agent_id, ident.pid, start, now)
            aside.add(i)
        self._bound(now)
        return aside

    def resize(self, table: Any, report: Any, job_id: str, world: int, now: float) -> bool:
        """``report`` has ``job_id`` with another world size than the daemon's:
        True when the evidence says the job runs at that size now, by the same
        rules as a rank: the members of the old size are all silent or gone
        (owner_silent), or the job's scheduler node list names the reporting
        node and none of the live members' (corroborated), once per node per
        window; or every live member is the reporting node's own and its
        processes all started later (a restart on that node). Another node's
        process starts decide nothing: it cannot shrink a live node's job by
        showing younger processes. The table is resized by the caller."""
        job = table.jobs.get(job_id)
        if job is None:
            return False
        node = report.node
        live = [r for k, r in job.ranks.items() if k >= 0 and table.fresh(r, now)]
        owners = {r.node for r in live}
        ages = [s.identity.process_age_seconds for s in report.samples
                if s.identity.job_id == job_id]
        starts = [r.start for r in live if r.start is not None]
        later = bool(ages) and all(a > 0 for a in ages) and all(
            now - a > s + START_SLACK for a in ages for s in starts)
        if owners and owners <= {node} and later:
            # Every live member is the node's own: its word on its own ranks.
            log.info("job %r: node %r restarted its own job at %d ranks (was %d)", job_id,
                     node, world, job.world_size)
            return True
        held = self._held.get((job_id, -1, node))
        # Another node's younger processes are recorded (uncorroborated), never decide.
        outcome, takes = decide(Contest(
            owner_fresh=bool(live), owner_start=max(starts) if starts and later else None,
            start=now if later else None,
            held_lately=held is not None and now - held < TAKEOVER_WINDOW,
            corroborated=bool(live) and corroborates(self._witnesses(table, job_id, now),
                                                      node, owners)))
        if not takes:
            if outcome != "kept":
                self.claims_total[outcome] += 1
            return False
        self.claims_total[outcome] += 1
        for n in {node} | owners:
            self._held[(job_id, -1, n)] = now      # -1: the job's world size
        log.warning("job %r: node %r resizes it from %d to %d ranks (%s)", job_id, node,
                    job.world_size, world, outcome)
        return True

    def of(self, job_id: str, rank: int, now: float | None = None) -> list[Claim]:
        """The contending claims of a rank, newest first (the API, status); with
        ``now``, only those made within the last TAKEOVER_WINDOW."""
        rivals = self.contenders.get(job_id, {}).get(rank, {})
        return sorted((c for c in rivals.values()
                       if now is None or now - c.seen < TAKEOVER_WINDOW), key=lambda c: -c.seen)

    def ranks_of(self, job_id: str) -> list[int]:
        return sorted(r for r, rivals in self.contenders.get(job_id, {}).items() if rivals)

    def _state(self, job_id: str, node: str, s: Any, table: Any) -> None:
        """What a ranked sample ``node`` owns says of the job's node list."""
        if s.HasField("job"):
            self._stated.setdefault(job_id, {})[node] = table.infos.facts(s.job).nodes

    def _witnesses(self, table: Any, job_id: str, now: float
                   ) -> dict[str, frozenset[str] | None]:
        """The node lists stated by nodes that own a live ranked member now."""
        job = table.jobs.get(job_id)
        stated = self._stated.get(job_id)
        if job is None or not stated:
            return {}
        live = {r.node for k, r in job.ranks.items() if k >= 0 and table.fresh(r, now)}
        return {n: nodes for n, nodes in stated.items() if n in live}

    def forget(self, job_id: str) -> None:
        self._stated.pop(job_id, None)
        ranks = self.contenders.pop(job_id, {})
        self._n -= sum(map(len, ranks.values()))

    def _drop(self, job_id: str, rank: int, node: str) -> None:
        rivals = self.contenders[job_id].get(rank)
        if rivals is not None and rivals.pop(node, None) is not None:
            self._n -= 1

    def _bound(self, now: float) -> None:
        if len(self._held) > MAX_CLAIMS:
            for k in [k for k, t in self._held.items() if now - t >= TAKEOVER_WINDOW]:
                del self._held[k]
        while self._n > MAX_CLAIMS and self.contenders:
            self.forget(next(iter(self.contenders)))
