"""An agent's reports split across shards of daemons (real gRPC on loopback).

Shard 0 is a highly available pair, shard 1 one daemon. A node runs ranks of
a job each shard owns: each daemon holds only its shard's job, every daemon
hears the node's health, exits reach the owner, and a DumpStacks command
from either shard reaches the agent.
"""

from __future__ import annotations

import asyncio

from ncclwatch.agent.route import Router, split
from ncclwatch.model import CollectiveOp, RankState
from tests.harness.daemons import Harness
from tests.harness.reports import BARRIER, report, sample, stack_pb
from tests.harness.shards import jobs_on


def _node_report(seq: int, jobs: list[str], *, exited: bool = False):
    r = report([sample(j, rank, 2, RankState.COLLECTIVE, CollectiveOp.BARRIER,
                       stack=stack_pb(BARRIER).id, pid=100 * k + rank + 1)
                for k, j in enumerate(jobs) for rank in range(2)], seq=seq).report
    r.health.ranks_watched = 2 * len(jobs)
    if exited:
        del r.samples[-1]
        r.exited.append(sample(jobs[-1], 1, 2, RankState.COMPUTE, pid=102).identity)
    return r


def test_split_gives_each_shard_its_jobs_and_every_shard_the_node() -> None:
    a, b = jobs_on(2)
    r = _node_report(7, [a, b], exited=True)
    member = sample(b, -1, 0, RankState.COMPUTE, pid=300)  # rank unknown: by its job id
    r.samples.append(member)
    p0, p1 = split(r, 2)
    assert p1.samples[-1] == member
    assert {s.identity.job_id for s in p0.samples} == {a} and len(p0.samples) == 2
    assert {s.identity.job_id for s in p1.samples} == {b} and len(p1.samples) == 2
    assert [e.job_id for e in p1.exited] == [b] and not p0.exited
    for p in (p0, p1):
        assert (p.node, p.agent_id, p.seq, p.full_round) == (r.node, r.agent_id, 7, True)
        assert p.health.ranks_watched == 4
    assert split(r, 1) == [r]


def test_each_shard_holds_only_its_jobs_and_hears_the_node() -> None:
    a, b = jobs_on(2)
    commands = []

    async def go():
        stacks = {stack_pb(BARRIER).id: stack_pb(BARRIER)}
        async with Harness() as h0a, Harness() as h0b, Harness() as h1:
            up = Router(f"{h0a.target},{h0b.target};{h1.target}", stacks,
                        on_command=commands.append)
            assert len(up.shards) == 2 and len(up.links) == 3
            task = asyncio.create_task(up.run())
            try:
                for seq in range(1, 6):
                    up.submit(_node_report(seq, [a, b]))
                    await asyncio.sleep(0.02)
                daemons = (h0a, h0b, h1)
                for _ in range(200):
                    recs = [h.daemon.table.agents.get("agent-a") for h in daemons]
                    if all(r and r.last_seq == 5 for r in recs):
                        break
                    await asyncio.sleep(0.05)
                for h, mine in ((h0a, a), (h0b, a), (h1, b)):
                    rec = h.daemon.table.agents["agent-a"]
                    assert rec.last_seq == 5 and rec.gaps_total == 0
                    assert rec.health.ranks_watched == 4  # the node's health, everywhere
                    assert set(h.daemon.table.jobs) == {mine}
                    assert len(h.daemon.table.jobs[mine].ranks) == 2
                    assert stack_pb(BARRIER).id in h.daemon.table.stacks
                assert up.connected and "shard 1: collector " in up.status()
                # Rank 1 of b exits: only b's owner hears it; a's ranks stay live.
                up.submit(_node_report(6, [a, b], exited=True))
                for _ in range(200):
                    if h1.daemon.table.jobs[b].ranks[1].gone_at is not None:
                        break
                    await asyncio.sleep(0.05)
                assert h1.daemon.table.jobs[b].ranks[1].gone_at is not None
                assert h1.daemon.table.jobs[b].ranks[0].gone_at is None
                assert all(r.gone_at is None for r in h0a.daemon.table.jobs[a].ranks.values())
                # A command from each shard's daemon reaches the one agent handler.
                assert h1.daemon.request_stacks(b, "test") == 1
                assert h0b.daemon.request_stacks(a, "test") == 1
                for seq in range(7, 40):
                    up.submit(_node_report(seq, [a, b]))
                    await asyncio.sleep(0.05)
                    if len(commands) >= 2:
                        break
                assert sorted(c.dump_stacks.job_id for c in commands) == sorted([a, b])
            finally:
                up.stop()
                await asyncio.wait_for(task, 10)
    asyncio.run(go())
