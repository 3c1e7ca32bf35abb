"""The Slurm job name and user of a rank: from its environment, else scontrol, cached.

scontrol's answers here are the real text of ``scontrol show job --oneliner``
from the test cluster (tests/harness/slurm.py); the e2e tests (tests/e2e/test_slurm.py)
run the real client against the real controller.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from ncclwatch import status
from ncclwatch.agent.agent import Agent, AgentConfig
from ncclwatch.agent.gpu import NvmlGpuReader
from ncclwatch.agent.scheduler import SchedulerJob, SchedulerLookup
from ncclwatch.daemon import api, page
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.server import DaemonServer
from ncclwatch.model import RankState
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.reports import report, sample

SCONTROL = ("JobId=7 JobName=llm pretrain UserId=ana(1000) GroupId=ana(1000) MCS_label=N/A "
            "Priority=4294901759 Nice=0 Account=(null) QOS=(null) JobState=RUNNING "
            "Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 "
            "NodeList=ncclwatch1 BatchHost=ncclwatch1 NumNodes=1 NumCPUs=3 NumTasks=3\n")


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Runner:
    """Stands in for subprocess.run; records every argv it was asked to run."""

    def __init__(self, stdout: str = SCONTROL, rc: int = 0, exc: Exception | None = None) -> None:
        self.calls: list[list[str]] = []
        self.stdout, self.rc, self.exc = stdout, rc, exc

    def __call__(self, argv, **kw) -> subprocess.CompletedProcess:
        self.calls.append(argv)
        assert kw["timeout"] > 0  # always bounded
        if self.exc:
            raise self.exc
        return subprocess.CompletedProcess(argv, self.rc, self.stdout, "")


def _lookup(run: Runner, *, which=lambda c: "/usr/bin/" + c, clock=None) -> SchedulerLookup:
    return SchedulerLookup(run=run, which=which, clock=clock or FakeClock(), retry_after=60.0)


def test_name_and_user_from_the_environment_need_no_query() -> None:
    run = Runner()
    job = _lookup(run).job({"SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "llm",
                            "SLURM_JOB_USER": "ana", "SLURM_PROCID": "0"})
    assert job == SchedulerJob("slurm", "7", "llm", "ana", "env")
    assert run.calls == []


def test_missing_names_are_asked_once_per_job() -> None:
    run = Runner()
    lookup = _lookup(run)
    for procid in range(3):
        job = lookup.job({"SLURM_JOB_ID": "7", "SLURM_PROCID": str(procid)})
        assert job == SchedulerJob("slurm", "7", "llm pretrain", "ana", "scontrol")
    assert run.calls == [["scontrol", "show", "job", "7", "--oneliner"]]
    # What the environment says wins over the query.
    job = lookup.job({"SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "mine"})
    assert (job.name, job.user, job.source) == ("mine", "ana", "scontrol")


def test_no_scontrol_or_no_answer_fails_soft_and_retries_later() -> None:
    env = {"SLURM_JOB_ID": "8"}
    assert _lookup(Runner(), which=lambda c: None).job(env) == SchedulerJob("slurm", "8")
    clock = FakeClock()
    for run in (Runner(exc=subprocess.TimeoutExpired(["scontrol"], 2.0)),
                Runner(stdout="", rc=1), Runner(stdout="slurm_load_jobs error: Invalid job id\n")):
        lookup = _lookup(run, clock=clock)
        assert lookup.job(env) == SchedulerJob("slurm", "8")
        assert lookup.job(env) == SchedulerJob("slurm", "8")
        assert len(run.calls) == 1 and lookup.failures_total == 1  # not again at once
        clock.t += 61
        lookup.job(env)
        assert len(run.calls) == 2                                  # but after retry_after


def test_odd_job_ids_are_never_passed_to_a_command() -> None:
    run = Runner()
    job = _lookup(run).job({"SLURM_JOB_ID": "--help"})
    assert job == SchedulerJob("slurm", "--help") and run.calls == []


def test_not_under_a_scheduler() -> None:
    assert _lookup(Runner()).job({"RANK": "0", "WORLD_SIZE": "2"}) is None


def test_names_are_redacted_and_bounded() -> None:
    token = "ghp_" + "A1b2C3d4" * 5
    run = Runner(stdout=SCONTROL.replace("JobName=llm pretrain", f"JobName=run-{token}"))
    job = _lookup(run).job({"SLURM_JOB_ID": "7", "SLURM_JOB_USER": "x" * 500})
    assert token not in job.name and "<redacted>" in job.name
    assert len(job.user) == 128


def test_cache_is_bounded() -> None:
    run = Runner()
    lookup = SchedulerLookup(run=run, which=lambda c: "/x", max_jobs=4)
    for i in range(10):
        lookup.job({"SLURM_JOB_ID": str(i)})
    lookup.job({"SLURM_JOB_ID": "9"})
    lookup.job({"SLURM_JOB_ID": "0"})  # evicted: asked again
    assert len(lookup._cache) == 4 and len(run.calls) == 11


def test_daemon_shows_the_scheduler_job_in_api_status_and_page() -> None:
    d = Daemon(DaemonConfig())
    s = sample("slurm:7.0", 0, 2, RankState.COMPUTE)
    s.job.CopyFrom(pb.JobInfo(source="slurm", scheduler_job=pb.SchedulerJob(
        scheduler="slurm", job_id="7", job_name="llm <pretrain>", user="ana", source="env")))
    d.ingest(report([s, sample("slurm:7.0", 1, 2, RankState.COMPUTE)]), now=10.0)
    d.tick(now=10.0, wall=10.0)
    view = api.jobs_view(d, now=10.0)
    assert view["jobs"][0]["scheduler_job"] == {
        "scheduler": "slurm", "job_id": "7", "job_name": "llm <pretrain>", "user": "ana",
        "source": "env"}
    assert "slurm 7 'llm <pretrain>' by ana" in status.render(view)
    html = page.render(view)
    assert "<p class='scheduler-job'>slurm 7 &#x27;llm &lt;pretrain&gt;&#x27; by ana</p>" in html
    # A later job info without it (an older agent) does not erase it.
    d.ingest(report([sample("slurm:7.0", 0, 2, RankState.COMPUTE, timeout=60.0)], seq=2),
             now=11.0)
    assert api.jobs_view(d, now=11.0)["jobs"][0]["scheduler_job"]["user"] == "ana"



def test_agent_sends_the_name_it_asked_for_with_the_job() -> None:
    """Real rank processes without SLURM_JOB_NAME/USER: the agent asks (here a
    recorded scontrol), once for the job, and the daemon shows the answer."""
    env = {**os.environ, "SLURM_JOB_ID": "424242", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2"}
    code = "import torch.distributed, time\nwhile True: time.sleep(1)"
    procs = [subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                              env={**env, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)})
             for r in range(2)]
    run = Runner()

    async def go():
        daemon = Daemon(DaemonConfig(grpc="127.0.0.1:0", http="127.0.0.1:0"))
        server = DaemonServer(daemon)
        await server.start()
        agent = Agent(AgentConfig(collector=f"127.0.0.1:{server.grpc_port}", interval=0.2),
                      gpu=NvmlGpuReader(), scheduler=_lookup(run))
        task = asyncio.create_task(agent.run())
        try:
            for _ in range(150):
                job = daemon.table.jobs.get("slurm:424242.0")
                if job and len(job.ranks) == 2 and job.scheduler_job:
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail(f"no named job slurm:424242.0: {daemon.table.jobs}")
            assert job.scheduler_job == {"scheduler": "slurm", "job_id": "424242",
                                         "job_name": "llm pretrain", "user": "ana",
                                         "source": "scontrol"}
        finally:
            agent.stop()
            await task
            await server.stop(grace=0.1)
    try:
        asyncio.run(go())
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert run.calls == [["scontrol", "show", "job", "424242", "--oneliner"]]
