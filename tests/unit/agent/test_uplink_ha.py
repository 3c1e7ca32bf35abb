"""An agent reporting to a highly available pair of daemons (real gRPC on loopback).

Each daemon gets its own stream, queue, backoff and stack interning: a daemon
that accepts TCP but never answers (a wedged host) or one that is gone must
not delay, drop or starve the reports of the other.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from ncclwatch.agent.uplink import Uplinks, collector_list
from ncclwatch.config import ConfigError, hostports
from ncclwatch.model import CollectiveOp, RankState
from tests.harness.daemons import Harness
from tests.harness.reports import BARRIER, sample, stack_pb

N_REPORTS = 40


def _node_report(seq: int):
    from tests.harness.reports import report
    return report([sample("ha", r, 2, RankState.COLLECTIVE, CollectiveOp.BARRIER,
                          stack=stack_pb(BARRIER).id) for r in range(2)], seq=seq).report


def test_collectors_parse_from_flag_env_and_toml_list() -> None:
    assert collector_list("a:7470, b:7470") == ("a:7470", "b:7470")
    assert collector_list(["a:7470", "b:7470"]) == ("a:7470", "b:7470")
    assert hostports(["a:1", "b:2"]) == "a:1,b:2" and hostports("a:1") == "a:1"
    for bad in ("", "a:1,a:1", "a:1,b"):
        with pytest.raises(ValueError):
            hostports(bad)
    from ncclwatch.cli import main
    with pytest.raises(SystemExit) as e:  # argparse names the flag and exits 2
        main(["agent", "--collector", "a:1,nohost"])
    assert e.value.code == 2


def test_collectors_from_the_environment_and_a_toml_list(tmp_path) -> None:
    import argparse

    from ncclwatch.cli import AGENT_OPTIONS
    from ncclwatch.config import load_file, resolve
    args = argparse.Namespace(collector=None)
    env = {"NCCLWATCH_COLLECTOR": "a:7470,b:7470"}
    assert resolve(AGENT_OPTIONS, args, {}, env)["collector"] == "a:7470,b:7470"
    toml = tmp_path / "agent.toml"
    toml.write_text('collector = ["a:7470", "b:7470"]\n')
    assert resolve(AGENT_OPTIONS, args, load_file(str(toml), None), {})["collector"] == \
        "a:7470,b:7470"
    toml.write_text('collector = ["a:7470", "a:7470"]\n')
    with pytest.raises(ConfigError, match="given twice"):
        resolve(AGENT_OPTIONS, args, load_file(str(toml), None), {})


@pytest.mark.parametrize("other", ["wedged", "dead"])
def test_a_wedged_or_dead_daemon_never_stalls_the_other(other) -> None:
    """Every report reaches the live daemon, in order, with its stacks; the
    other link only queues (bounded) and counts what it drops."""
    async def go():
        stacks = {stack_pb(BARRIER).id: stack_pb(BARRIER)}
        hole = socket.socket()  # accepts connections (backlog), never speaks HTTP/2
        hole.bind(("127.0.0.1", 0))
        if other == "wedged":
            hole.listen(16)
        bad = f"127.0.0.1:{hole.getsockname()[1]}"
        async with Harness() as live:
            up = Uplinks([bad, live.target], stacks, max_queue=8)
            task = asyncio.create_task(up.run())
            try:
                for seq in range(1, N_REPORTS + 1):
                    up.submit(_node_report(seq))
                    await asyncio.sleep(0.02)
                rec = None
                for _ in range(200):
                    rec = live.daemon.table.agents.get("agent-a")
                    if rec and rec.last_seq == N_REPORTS:
                        break
                    await asyncio.sleep(0.05)
                assert rec is not None and rec.last_seq == N_REPORTS, rec
                assert rec.gaps_total == 0 and rec.reports_total == N_REPORTS
                assert stack_pb(BARRIER).id in live.daemon.table.stacks
                # The live link's own health: nothing dropped on its way.
                assert rec.health.reports_dropped_total == 0
                dead_link, live_link = up.links
                assert not dead_link.connected and live_link.connected
                assert dead_link.queue_length <= 8
                assert dead_link.dropped_total + dead_link.queue_length >= N_REPORTS - 8
                assert up.status().startswith(f"collectors {bad} ")
                assert f"{live.target} connected" in up.status()
            finally:
                up.stop()
                await asyncio.wait_for(task, 10)
                hole.close()
    asyncio.run(go())


def test_each_daemon_of_a_pair_gets_every_report_and_its_own_stacks() -> None:
    """Stack interning is per stream: the second daemon gets the frames too,
    and after one daemon restarts only its new stream resends them."""
    async def go():
        stacks = {stack_pb(BARRIER).id: stack_pb(BARRIER)}
        async with Harness() as a, Harness() as b:
            up = Uplinks(f"{a.target},{b.target}", stacks)
            task = asyncio.create_task(up.run())
            try:
                for seq in range(1, 11):
                    up.submit(_node_report(seq))
                    await asyncio.sleep(0.02)
                for _ in range(200):
                    recs = [h.daemon.table.agents.get("agent-a") for h in (a, b)]
                    if all(r and r.last_seq == 10 for r in recs):
                        break
                    await asyncio.sleep(0.05)
                for h in (a, b):
                    rec = h.daemon.table.agents["agent-a"]
                    assert rec.last_seq == 10 and rec.gaps_total == 0
                    assert stack_pb(BARRIER).id in h.daemon.table.stacks
                    job = h.daemon.table.jobs["ha"]
                    assert job.ranks[0].stack_id == stack_pb(BARRIER).id
            finally:
                up.stop()
                await asyncio.wait_for(task, 10)
    asyncio.run(go())


def test_a_job_the_daemon_leaves_out_is_logged_once_and_the_stream_goes_on(caplog) -> None:
    """World sizes disagree for one job (a confused srun step beside a real job):
    the daemon drops that job from each report, the agent logs it once a minute
    and keeps streaming; every report of the good job is applied."""
    from ncclwatch.agent.uplink import Uplink
    from tests.harness.reports import report

    def node_report(seq: int):
        world = 3 if seq == 1 else 1          # the job's first report says 3, later ones 1
        return report([sample("confused", 0, world, RankState.COMPUTE),
                       sample("good", 0, 2, RankState.COLLECTIVE, CollectiveOp.BARRIER)],
                      seq=seq).report

    async def go():
        async with Harness() as h:
            up = Uplink(h.target, {})
            task = asyncio.create_task(up.run())
            try:
                for seq in range(1, 8):
                    up.submit(node_report(seq))
                for _ in range(200):
                    rec = h.daemon.table.agents.get("agent-a")
                    if rec and rec.last_seq == 7 and up.rejected_jobs_total == 6:
                        break
                    await asyncio.sleep(0.05)
                assert h.daemon.table.agents["agent-a"].last_seq == 7
                assert up.rejected_jobs_total == 6 and up.connected
                assert h.daemon.table.jobs["good"].ranks[0].op is CollectiveOp.BARRIER
                assert h.daemon.table.jobs["confused"].world_size == 3
            finally:
                up.stop()
                await asyncio.wait_for(task, 10)

    with caplog.at_level("WARNING", logger="ncclwatch.agent.uplink"):
        asyncio.run(go())
    lines = [r.getMessage() for r in caplog.records if "left job confused" in r.getMessage()]
    assert len(lines) == 1 and "has world size 3, report says 1" in lines[0]
