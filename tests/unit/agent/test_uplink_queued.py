"""A report that waited in the agent's queue says how long (real gRPC on loopback).

The daemon shares this host's monotonic clock here, so the truth is known: a
rank in its wait for 5 s when a report was built 3 s before it was sent began
8 s before the send. Without the queue's seconds the daemon dates it at the
receipt less 5 s: 3 s late (a restarted daemon's first reports waited out
the agent's reconnect backoff so).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from ncclwatch.agent.uplink import Uplinks
from ncclwatch.model import CollectiveOp, RankState
from tests.harness.daemons import Harness
from tests.harness.reports import BARRIER, report, sample, stack_pb

QUEUED, WAITED = 3.0, 5.0


def test_a_queued_report_dates_its_waits_from_when_it_was_built() -> None:
    async def go():
        stacks = {stack_pb(BARRIER).id: stack_pb(BARRIER)}
        async with Harness() as h:
            up = Uplinks(h.target, stacks)
            built = time.monotonic() - QUEUED
            r = report([sample("q", rank, 2, RankState.COLLECTIVE, CollectiveOp.BARRIER,
                               seconds=WAITED, stack=stack_pb(BARRIER).id)
                        for rank in range(2)], seq=1).report
            r.agent_monotonic_seconds = built
            up.submit(r)
            task = asyncio.create_task(up.run())
            try:
                for _ in range(200):
                    if "q" in h.daemon.table.jobs:
                        break
                    await asyncio.sleep(0.02)
                since = h.daemon.table.jobs["q"].ranks[1].since
                assert since == pytest.approx(built - WAITED, abs=0.5), (since - built)
            finally:
                up.stop()
                await asyncio.wait_for(task, 10)
    asyncio.run(go())
