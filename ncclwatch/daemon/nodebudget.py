"""What one node's certificate may hold in the daemon, and all nodes together.

Per-agent bounds alone let one certificate fill the daemon: agent ids are the
agent's to choose, so a node could invent a thousand of them and hold a
thousand agents' worth of jobs. These budgets count per node identity: the
node a client certificate is bound to (its names; under mTLS a report's node
must be one of them), and without TLS the report's node. Jobs, agent ids and
bytes held are bounded per identity and in total (bounds.py); a hit refuses
the newcomer (a new agent id, a job of a report), never what other nodes hold.

Bytes are an estimate of what the daemon keeps: per rank a fixed cost for its
record and curve plus the wire size of its sample (paths, container names,
native frame, Flight Recorder summary), per job the size of its facts
(environment, packages, scheduler names), each counted against the identity
that sent it last.
"""

from __future__ import annotations

import collections
from typing import Any

from ncclwatch import sanitize

#: Bytes a rank's record costs beyond its text: the record, its indexes, its
#: evidence curve (a few points of machine numbers).
RANK_COST = 2048


def identity_of(node: str, cert_names: frozenset[str] | None) -> str:
    """The identity a report counts against: its certificate's (one budget
    however many names it holds), else the node it names; escaped as the
    report's node is stored (sanitize.stored), since it keys the budgets, the
    faults and the per-node /metrics labels: a control or bidi character in a
    certificate name or an unauthenticated node never reaches a label."""
    return sanitize.stored("NodeReport.node", min(cert_names) if cert_names else node)


def rank_cost(s: Any, held_fr: Any = None) -> int:
    """The bytes a rank keeps after a full RankSample ``s`` (its job facts
    apart); ``held_fr``: the Flight Recorder summary kept for the rank when
    the sample carries none."""
    n = RANK_COST + s.ByteSize()
    if s.HasField("job"):
        n -= s.job.ByteSize()
    if held_fr is not None and not s.HasField("flight_recorder"):
        n += held_fr.ByteSize()
    return n


class Held:
    """Bytes held per identity and in total; each record knows its payer."""

    def __init__(self) -> None:
        self.by_node: collections.Counter[str] = collections.Counter()
        self.total = 0

    def _move(self, old_payer: str, old: int, payer: str, cost: int) -> None:
        if old_payer:
            left = self.by_node[old_payer] - old
            if left > 0:
                self.by_node[old_payer] = left
            else:
                del self.by_node[old_payer]
        if payer:
            self.by_node[payer] += cost
        self.total += (cost if payer else 0) - (old if old_payer else 0)

    def rank(self, rec: Any, payer: str, cost: int) -> None:
        self._move(rec.payer, rec.cost, payer, cost)
        rec.payer, rec.cost = payer, cost

    def facts(self, job: Any, payer: str, cost: int) -> None:
        self._move(job.facts_payer, job.facts_cost, payer, cost)
        job.facts_payer, job.facts_cost = payer, cost

    def release_job(self, job: Any) -> None:
        for rec in job.ranks.values():
            self.rank(rec, "", 0)
        self.facts(job, "", 0)

    def of(self, identity: str) -> int:
        return self.by_node.get(identity, 0)
