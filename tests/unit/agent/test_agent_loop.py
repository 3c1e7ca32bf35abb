"""The whole agent round against real processes and an in-process daemon."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from ncclwatch.agent.agent import Agent, AgentConfig
from ncclwatch.agent.gpu import NvmlGpuReader
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.server import DaemonServer
from ncclwatch.model import RankState

JOB_ENV = {"WORLD_SIZE": "2", "MASTER_ADDR": "10.7.7.7", "MASTER_PORT": "29777",
           "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567"}
JOB = "master:10.7.7.7:29777/2"


@pytest.fixture
def two_ranks():
    procs = [subprocess.Popen([sys.executable, "-c", "import torch.distributed, time\nwhile True: time.sleep(1)"],
                              env={**os.environ, **JOB_ENV, "RANK": str(r)},
                              start_new_session=True) for r in range(2)]
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_agent_reports_ranks_states_and_exits(two_ranks) -> None:
    async def go():
        daemon = Daemon(DaemonConfig(grpc="127.0.0.1:0", http="127.0.0.1:0"))
        server = DaemonServer(daemon)
        await server.start()
        agent = Agent(AgentConfig(collector=f"127.0.0.1:{server.grpc_port}", interval=0.2,
                                  node="test-node"), gpu=NvmlGpuReader())
        task = asyncio.create_task(agent.run())
        try:
            for _ in range(100):
                job = daemon.table.jobs.get(JOB)
                if job and len(job.ranks) == 2 and all(
                        r.stack_id and r.stack_id in daemon.table.stacks for r in job.ranks.values()):
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail(f"daemon never got both ranks with stacks: {daemon.table.jobs}")
            job = daemon.table.jobs[JOB]
            assert {r.pid for r in job.ranks.values()} == {p.pid for p in two_ranks}
            assert all(r.state is RankState.COMPUTE for r in job.ranks.values())
            assert "WANDB_API_KEY" not in job.env and job.env["MASTER_PORT"] == "29777"
            # Issue 29: what the rank imported (torch's extension mapped, under
            # site-packages) and when its process started, as the node sees them.
            for _ in range(50):
                if "torch" in job.packages:
                    break
                await asyncio.sleep(0.1)
            assert "torch" in job.packages, job.packages
            assert all(r.start is not None and r.start <= r.seen for r in job.ranks.values())
            assert daemon.table.agents[agent.agent_id].health.nvml_up is False
            two_ranks[1].kill()
            two_ranks[1].wait()
            for _ in range(50):
                if job.ranks[1].gone_at is not None:
                    break
                await asyncio.sleep(0.1)
            assert job.ranks[1].gone_at is not None and job.ranks[0].gone_at is None
        finally:
            agent.stop()
            await task
            await server.stop(grace=0.1)
    asyncio.run(go())


def test_agent_keeps_sampling_while_the_daemon_is_away(two_ranks) -> None:
    from tests.harness.procs import free_port

    async def go():
        agent = Agent(AgentConfig(collector=f"127.0.0.1:{free_port()}", interval=0.1,
                                  max_queue=4, node="n"), gpu=NvmlGpuReader())
        task = asyncio.create_task(agent.run())
        # 8 rounds of 0.1 s: 1.5 s idle; a loaded machine (6 rounds in 1.5 s once
        # beside the matrix) takes longer, and the rounds must still come
        for _ in range(200):
            await asyncio.sleep(0.1)
            if agent.rounds >= 8:
                break
        agent.stop()
        await task
        assert agent.rounds >= 8
        up = agent.uplink
        # Nothing acked, nothing lost silently: every report is queued or counted dropped.
        assert up.queue_length <= 4
        assert up.dropped_total + up.queue_length == agent.rounds, (
            up.dropped_total, up.queue_length, agent.rounds)
        assert not agent.uplink.connected
    asyncio.run(go())


def test_every_pyspy_call_of_the_agent_is_nonblocking(two_ranks, tmp_path) -> None:
    """A shim in front of the real py-spy logs each command line the agent
    runs, through many rounds, forced dumps (the daemon's ask) included:
    each one must carry --nonblocking and never --native (which pauses)."""
    from ncclwatch.agent.pyspy import PySpy, find_pyspy
    real = find_pyspy()
    assert real, "py-spy missing from the venv: run make test"
    log = tmp_path / "argv.log"
    shim = tmp_path / "py-spy"
    shim.write_text(f"#!/bin/sh\necho \"$*\" >> {log}\nexec {real} \"$@\"\n")
    shim.chmod(0o755)

    async def go():
        daemon = Daemon(DaemonConfig(grpc="127.0.0.1:0", http="127.0.0.1:0"))
        server = DaemonServer(daemon)
        await server.start()
        agent = Agent(AgentConfig(collector=f"127.0.0.1:{server.grpc_port}", interval=0.2,
                                  node="shim-node"),
                      gpu=NvmlGpuReader(), pyspy=PySpy(binary=str(shim)))
        task = asyncio.create_task(agent.run())
        try:
            for _ in range(100):
                if daemon.table.jobs.get(JOB) and len(daemon.table.jobs[JOB].ranks) == 2:
                    break
                await asyncio.sleep(0.1)
            daemon.request_stacks(JOB, "test")       # forced dumps on the next rounds
            await asyncio.sleep(2.0)
        finally:
            agent.stop()
            await task
            await server.stop(grace=0.1)
        return agent.pyspy.runs_total

    runs = asyncio.run(go())
    calls = log.read_text().splitlines()
    assert len(calls) == runs >= 4
    for argv in calls:
        assert argv.split()[:1] == ["dump"] and "--nonblocking" in argv.split(), argv
        assert "--native" not in argv and "record" not in argv, argv
