"""Which daemons get which part of a node's report, when daemons shard jobs.

Daemons are given as shards (``ncclwatch.shard``), each one daemon or an HA
pair (an ``Uplinks``: every report to each of its daemons). A node may run
ranks of jobs owned by different shards, so each round's report is split:
each shard gets the samples and exits of the jobs it owns (by job id, the
same ``shard()`` on every agent), and the node's own health (agent counters,
NVML, ranks watched) goes to every shard, so each daemon knows every node is
alive. A shard with no job on the node still gets the node's report (no
samples): its daemon exports the node's health and can tell a silent agent
from an idle node.

Each part is a whole report for its shard: ``full_round`` still means "every
rank of this stream", since a daemon only ever sees the ranks routed to it.
Streams, acknowledgements, timed acks, briefs and resyncs stay per daemon
(``Uplink``), and commands from any daemon (DumpStacks, Flight Recorder) go
to the one agent handler: a daemon only asks for jobs it owns.
"""

from __future__ import annotations

import asyncio

from ncclwatch.agent.uplink import Uplinks
from ncclwatch.shard import shard, shard_list
from ncclwatch.v1 import collector_pb2 as pb

#: NodeReport fields that are the node's, not a job's: every shard's part has them.
_NODE_FIELDS = ("node", "agent_id", "seq", "agent_monotonic_seconds", "agent_wall_seconds",
                "full_round", "interval_seconds")


def split(report: pb.NodeReport, n: int) -> list[pb.NodeReport]:
    """The report's part for each of ``n`` shards: its jobs' samples and exits,
    and the node's header and health in each."""
    if n == 1:
        return [report]
    parts = [pb.NodeReport(**{f: getattr(report, f) for f in _NODE_FIELDS}) for _ in range(n)]
    for p in parts:
        p.health.CopyFrom(report.health)
    for s in report.samples:
        parts[shard(s.identity.job_id, n)].samples.append(s)
    for e in report.exited:
        parts[shard(e.job_id, n)].exited.append(e)
    return parts


class Router:
    """One ``Uplinks`` per shard; each report split by job owner (``split``).

    Looks like ``Uplinks`` to the agent (submit, run, stop, health), summed
    over every daemon of every shard."""

    def __init__(self, targets: str, stacks: dict[str, pb.Stack], **kw) -> None:
        self.shards = [Uplinks(list(g), stacks, **kw) for g in shard_list(targets)]

    @property
    def links(self):
        return [u for s in self.shards for u in s.links]

    @property
    def target(self) -> str:
        return ";".join(s.target for s in self.shards)

    @property
    def connected(self) -> bool:
        """Some daemon of every shard is connected."""
        return all(s.connected for s in self.shards)

    @property
    def last_error(self) -> str:
        return "; ".join(e for e in (s.last_error for s in self.shards) if e)

    @property
    def queue_length(self) -> int:
        return max(s.queue_length for s in self.shards)

    @property
    def dropped_total(self) -> int:
        return sum(s.dropped_total for s in self.shards)

    @property
    def sent_total(self) -> int:
        return sum(s.sent_total for s in self.shards)

    @property
    def refused_total(self) -> int:
        return sum(s.refused_total for s in self.shards)

    def submit(self, report: pb.NodeReport) -> None:
        for uplinks, part in zip(self.shards, split(report, len(self.shards))):
            uplinks.submit(part)

    def stop(self) -> None:
        for s in self.shards:
            s.stop()

    async def run(self) -> None:
        await asyncio.gather(*(s.run() for s in self.shards))

    def status(self) -> str:
        """As ``Uplinks.status``, one clause per shard when there are several."""
        if len(self.shards) == 1:
            return self.shards[0].status()
        return "; ".join(f"shard {i}: {s.status()}" for i, s in enumerate(self.shards))
