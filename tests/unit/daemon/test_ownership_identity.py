"""A valid node certificate cannot tamper with another node's job (issue 20).

Real daemon, real gRPC over mTLS on loopback, two node certificates from the
real ``ncclwatch certs``. Reproductions: ``exited`` entries for another
node's ranks cleared a stall; a rank-less member (rank -1) replaced the job's
watchdog timeout (120 s -> 31,622,400 s), env and Slurm names; DumpStacks
for another node's job was accepted.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from ncclwatch.model import RankState, StallKind
from ncclwatch.v1 import collector_pb2 as pb
from ncclwatch.v1 import collector_pb2_grpc as pb_grpc
from tests.harness.credentials import client
from tests.harness.daemons import Harness
from tests.harness.monitor import metrics_at
from tests.harness.reports import checkpoint_job, report, sample

YEAR_AND_A_DAY = 31_622_400.0


def _run(coro):
    return asyncio.run(coro)


def _node_a_job(seq: int = 1) -> pb.ReportRequest:
    """job-1 on node-a: rank 0 saving for 20 s, ranks 1-3 in barrier; the job
    declares a 120 s watchdog, an env and its Slurm names."""
    req = checkpoint_job(node="node-a", agent="agent-a", seq=seq, timeout=120.0)
    for s in req.report.samples:
        s.job.env["NCCL_DEBUG"] = "WARN"
        s.job.scheduler_job.CopyFrom(pb.SchedulerJob(scheduler="slurm", job_id="4242",
                                                     job_name="train", user="alice"))
    return req


async def _stall(h: Harness, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while ("job-1", StallKind.CHECKPOINT_GATHER) not in h.daemon.incidents.active:
        assert time.monotonic() < deadline, "no stall opened for node-a's job"
        await asyncio.sleep(0.1)


def _refusals(h: Harness) -> dict[str, float]:
    m = metrics_at(h.server.http_port, "/metrics")
    return {dict(lab)["what"]: v for (n, lab), v in m.items()
            if n == "ncclwatch_daemon_identity_refusals_total"}


def test_a_node_cannot_mark_another_nodes_ranks_exited(pki) -> None:
    async def go():
        async with Harness(pki) as h:
            await h.send_over(h.secure(client(pki, "node-a")), _node_a_job())
            await _stall(h)
            forged = report([], node="node-b", agent="agent-b")
            forged.report.exited.extend(pb.RankIdentity(job_id="job-1", rank=r, pid=1000 + r)
                                        for r in range(4))
            (resp,) = await h.send_over(h.secure(client(pki, "node-b")), forged)
            assert resp.ack_seq == 1  # the report itself is fine; its forged exits are not
            job = h.daemon.table.jobs["job-1"]
            assert all(rec.gone_at is None for rec in job.ranks.values())
            assert job.ranks[1].state is RankState.COLLECTIVE
            await asyncio.sleep(1.0)  # ticks pass: the stall stays open
            assert ("job-1", StallKind.CHECKPOINT_GATHER) in h.daemon.incidents.active
            assert (await asyncio.to_thread(_refusals, h))["exited"] == 4
            # The owner may say its ranks exited.
            own = report([], node="node-a", agent="agent-a", seq=2, full=False)
            own.report.exited.append(pb.RankIdentity(job_id="job-1", rank=3, pid=1003))
            await h.send_over(h.secure(client(pki, "node-a")), own)
            assert job.ranks[3].gone_at is not None
    _run(go())


def test_a_rankless_member_cannot_replace_the_jobs_facts(pki) -> None:
    async def go():
        async with Harness(pki) as h:
            await h.send_over(h.secure(client(pki, "node-a")), _node_a_job())
            m = sample("job-1", -1, 4, RankState.COMPUTE, pid=666, timeout=YEAR_AND_A_DAY)
            m.job.env["NCCL_DEBUG"] = "mallory"
            m.job.scheduler_job.CopyFrom(pb.SchedulerJob(scheduler="slurm", job_id="4242",
                                                         job_name="evil", user="mallory"))
            m.flight_recorder.CopyFrom(pb.FlightRecorderSummary(version="2.4", groups=[
                pb.ProcessGroupProgress(pg_id="0", pg_name="0", pg_desc="default_pg",
                                       ranks=[0, 1, 2, 3], pending_seq=1,
                                       pending_timeout_ms=int(YEAR_AND_A_DAY * 1000))]))
            (resp,) = await h.send_over(h.secure(client(pki, "node-b")),
                                   report([m], node="node-b", agent="agent-b"))
            assert not resp.rejected_jobs  # the member itself is welcome...
            job = h.daemon.table.jobs["job-1"]
            assert any(k < 0 for k in job.ranks)
            # ... its job-level facts are not: the ranked members set them.
            assert job.declared_timeout == 120.0 and job.fr_timeout == 0.0
            assert job.env == {"NCCL_DEBUG": "WARN"}
            assert job.scheduler_job["user"] == "alice"
            assert job.scheduler_job["job_name"] == "train"
            assert not any(k < 0 for k in job.flight_recorder)
            assert h.daemon.budget_of("job-1", time.monotonic()).timeout == 120.0
            assert (await asyncio.to_thread(_refusals, h))["rankless_job_facts"] == 1
    _run(go())


def test_a_job_of_rankless_members_only_still_gets_its_facts(pki) -> None:
    """Launchers that give no rank (PMIx before it is read): the members' own
    facts are all the job has, and they are taken."""
    async def go():
        async with Harness(pki) as h:
            m = sample("job-r", -1, 2, RankState.COMPUTE, pid=77, timeout=300.0)
            await h.send_over(h.secure(client(pki, "node-b")),
                         report([m], node="node-b", agent="agent-b"))
            assert h.daemon.table.jobs["job-r"].declared_timeout == 300.0
    _run(go())


def _dump(h: Harness, tls, job: str):
    async def call():
        async with h.secure(tls) as ch:
            return await pb_grpc.CollectorServiceStub(ch).DumpStacks(
                pb.DumpStacksRequest(job_id=job, reason="test"))
    return call()


def test_dump_stacks_is_scoped_to_the_callers_jobs(pki) -> None:
    async def go():
        async with Harness(pki) as h:
            await h.send_over(h.secure(client(pki, "node-a")), _node_a_job())
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await _dump(h, client(pki, "node-b"), "job-1")
            assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert ei.value.details() == ("certificate for 'node-b' cannot ask for stacks of "
                                          "job 'job-1': none of its ranks runs on that node")
            # nobody was asked by it (the daemon's own tick may have asked for a
            # stall's stacks meanwhile: the job is a stall, and its reason is its own)
            asked = h.daemon.table.agents["agent-a"].commands
            assert not [c for c in asked if c.dump_stacks.reason == "test"], asked
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await _dump(h, client(pki, "node-b"), "no-such-job")
            assert ei.value.code() == grpc.StatusCode.NOT_FOUND
            resp = await _dump(h, client(pki, "node-a"), "job-1")
            assert resp.agents == 1
            assert (await asyncio.to_thread(_refusals, h))["dump_stacks"] == 1
    _run(go())


def test_dump_stacks_through_ingest_workers_is_scoped_too(pki) -> None:
    """With ingest workers the worker serves the call and forwards the
    caller's certificate names to the core, which decides."""
    async def go():
        async with Harness(pki, ingest_workers=1) as h:
            await h.send_over(h.secure(client(pki, "node-a")), _node_a_job())
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await _dump(h, client(pki, "node-b"), "job-1")
            assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "none of its ranks runs on that node" in ei.value.details()
            assert (await _dump(h, client(pki, "node-a"), "job-1")).agents == 1
    _run(go())
