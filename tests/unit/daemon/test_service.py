"""The daemon's gRPC entry points, over real gRPC on loopback."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import grpc
import pytest

from ncclwatch.agent.uplink import Uplink
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.server import DaemonServer
from ncclwatch.model import CollectiveOp, RankState, StallKind
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.daemons import Harness
from tests.harness.reports import BARRIER, checkpoint_job, report, sample, stack_pb


def _run(coro):
    return asyncio.run(coro)


def _err(excinfo) -> grpc.StatusCode:
    return excinfo.value.code()


def test_report_is_applied_and_acked() -> None:
    async def go():
        async with Harness() as h:
            resps = await h.send(checkpoint_job(seq=7))
            assert [r.ack_seq for r in resps] == [7]
            job = h.daemon.table.jobs["job-1"]
            assert job.ranks[0].state is RankState.SAVING
            assert job.ranks[2].op is CollectiveOp.BARRIER
    _run(go())


#: The node's own faults: the whole report is refused.
BAD = [
    ("bad protobuf", None, grpc.StatusCode.INVALID_ARGUMENT),
    ("unknown protocol", pb.ReportRequest(protocol_version=99, report=pb.NodeReport(
        node="n", agent_id="a")), grpc.StatusCode.FAILED_PRECONDITION),
    ("no node name", pb.ReportRequest(protocol_version=1, report=pb.NodeReport(
        agent_id="a", samples=[sample("job-x", 0, 1, RankState.COMPUTE)])),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("NaN interval", report([sample("job-x", 0, 1, RankState.COMPUTE)],
                            interval=float("nan")), grpc.StatusCode.INVALID_ARGUMENT),
]

#: One rank's faults: its sample is dropped alone, the report applied.
BAD_SAMPLES = [
    ("rank out of range", sample("job-x", 9, 4, RankState.COMPUTE), "rank_out_of_range"),
    ("negative rank", sample("job-x", -2, 4, RankState.COMPUTE), "rank_out_of_range"),
    ("NaN duration", sample("job-x", 0, 1, RankState.COMPUTE, seconds=float("nan")),
     "not_finite"),
    ("unknown state", pb.RankSample(identity=pb.RankIdentity(
        job_id="job-x", rank=0, world_size=1, pid=5), state=77), "bad_state"),
    ("world over the limit", sample("job-x", 0, 1 << 30, RankState.COMPUTE),
     "world_size_over_limit"),
    ("no pid", pb.RankSample(identity=pb.RankIdentity(job_id="job-x", rank=0, world_size=1)),
     "bad_pid"),
]


@pytest.mark.parametrize("name,bad,reason", BAD_SAMPLES, ids=[b[0] for b in BAD_SAMPLES])
def test_a_bad_sample_is_dropped_alone_and_the_report_applies(name, bad, reason) -> None:
    async def go():
        async with Harness() as h:
            await h.send(checkpoint_job())
            h.daemon.tick()
            req = report([bad, sample("job-ok", 0, 1, RankState.COMPUTE)], seq=2)
            req.report.agent_monotonic_seconds = 101.0
            (resp,) = await h.send(req)               # the stream is not aborted
            assert [(p.what, p.job_id, p.reason.split(":")[0]) for p in resp.dropped_parts] \
                == [("rank_sample", "job-x", reason)]
            assert "samples[0]: " in resp.dropped_parts[0].reason
            assert "job-x" not in h.daemon.table.jobs
            assert h.daemon.table.jobs["job-ok"].ranks[0].state is RankState.COMPUTE
            assert not h.daemon.rejected_total
            assert h.daemon.node_faults["node-a"] == {reason: 1}
            assert h.daemon.dropped_parts_total == {("rank_sample", reason): 1}
    _run(go())


@pytest.mark.parametrize("name,req,code", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_rejected_and_other_jobs_untouched(name, req, code) -> None:
    async def go():
        async with Harness() as h:
            await h.send(checkpoint_job())
            h.daemon.tick()
            before = {r: (rec.state, rec.op, rec.since) for r, rec in
                      h.daemon.table.jobs["job-1"].ranks.items()}
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                if req is None:
                    await h.send_raw(b"\xff\xff\xff\x00garbage")
                else:
                    await h.send(req)
            assert _err(ei) == code, ei.value.details()
            assert ei.value.details()  # says what is wrong
            after = {r: (rec.state, rec.op, rec.since) for r, rec in
                     h.daemon.table.jobs["job-1"].ranks.items()}
            assert after == before
            assert "job-x" not in h.daemon.table.jobs
            assert h.daemon.rejected_total[code.name] == 1
            # The daemon keeps serving: the healthy job's next report applies.
            await h.send(checkpoint_job(seq=2))
            h.daemon.tick()
            assert ("job-1", StallKind.CHECKPOINT_GATHER) in h.daemon.incidents.active
    _run(go())


#: A bad stack is left out of the report (dropped_parts), never the report.
BAD_STACKS = [
    ("stack id not its frames", pb.Stack(id="0000", frames=[
        pb.Frame(name="x", filename="y", line=1)]), ""),
    ("huge stack", pb.Stack(id="x", frames=[pb.Frame(name="f")] * 5000), "stack_frames"),
]


@pytest.mark.parametrize("name, stack, bound", BAD_STACKS, ids=[b[0] for b in BAD_STACKS])
def test_a_bad_stack_is_left_out_not_the_report(name, stack, bound) -> None:
    async def go():
        async with Harness() as h:
            (resp,) = await h.send(report([sample("job-x", 0, 1, RankState.COMPUTE)],
                                          stacks=[stack]))
            assert [(p.what, p.stack_id, p.bound) for p in resp.dropped_parts] == \
                [("stack", stack.id, bound)]
            assert "job-x" in h.daemon.table.jobs and not h.daemon.rejected_total
    _run(go())


#: Well-formed reports of which one job contradicts what the daemon knows of it.
CONFLICTS = [
    ("world size changes", lambda: report(
        [sample("job-1", 1, 8, RankState.COMPUTE), sample("job-ok", 0, 1, RankState.COMPUTE)],
        seq=2), "has world size 4, report says 8"),
]


@pytest.mark.parametrize("name,make,why", CONFLICTS, ids=[c[0] for c in CONFLICTS])
def test_a_conflicting_job_is_left_out_and_the_rest_of_the_report_applies(name, make, why) -> None:
    """One confused job (another helper's srun job, a spoofed rank) must not blind the
    daemon to the node: its samples are dropped and named, the others apply."""
    async def go():
        async with Harness() as h:
            await h.send(checkpoint_job())
            h.daemon.tick()
            before = {r: (rec.state, rec.op, rec.since, rec.node) for r, rec in
                      h.daemon.table.jobs["job-1"].ranks.items()}
            req = make()
            # Milliseconds after the first on the daemon's clock: so on the agent's
            # (a clock a second ahead would re-date the ranks: JobTable._reanchor).
            req.report.agent_monotonic_seconds = 101.0
            (resp,) = await h.send(req)               # the stream is not aborted
            assert [(j.job_id, j.code) for j in resp.rejected_jobs] == \
                [("job-1", "FAILED_PRECONDITION")]
            assert why in resp.rejected_jobs[0].reason
            after = {r: (rec.state, rec.op, rec.since, rec.node) for r, rec in
                     h.daemon.table.jobs["job-1"].ranks.items()}
            assert after == before
            assert h.daemon.table.jobs["job-ok"].ranks[0].state is RankState.COMPUTE
            assert h.daemon.rejected_jobs_total["FAILED_PRECONDITION"] == 1
            assert not h.daemon.rejected_total                      # no report refused
            h.daemon.tick()
            assert ("job-1", StallKind.CHECKPOINT_GATHER) in h.daemon.incidents.active
    _run(go())


def test_dump_stacks_for_unknown_job_is_not_found() -> None:
    async def go():
        async with Harness() as h:
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await h.stub.DumpStacks(pb.DumpStacksRequest(job_id="nope"))
            assert _err(ei) == grpc.StatusCode.NOT_FOUND
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await h.stub.DumpStacks(pb.DumpStacksRequest())
            assert _err(ei) == grpc.StatusCode.INVALID_ARGUMENT
            await h.send(checkpoint_job())
            resp = await h.stub.DumpStacks(pb.DumpStacksRequest(job_id="job-1"))
            assert resp.agents == 1
    _run(go())


def test_oversized_message_is_resource_exhausted() -> None:
    async def go():
        async with Harness() as h:
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await h.send_raw(b"\x0a" + b"\xff" * (17 * 1024 * 1024))
            assert _err(ei) == grpc.StatusCode.RESOURCE_EXHAUSTED
    _run(go())


def test_http_endpoints_serve_the_stall() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    async def go():
        async with Harness() as h:
            await h.send(checkpoint_job(timeout=90))
            h.daemon.tick()
            base = f"http://127.0.0.1:{h.server.http_port}"

            def get(path):
                with urllib.request.urlopen(base + path, timeout=5) as r:
                    return r.read().decode()

            metrics, jobs, page = await asyncio.gather(
                asyncio.to_thread(get, "/metrics"), asyncio.to_thread(get, "/api/v1/jobs"),
                asyncio.to_thread(get, "/"))
            samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                       for fam in text_string_to_metric_families(metrics) for s in fam.samples}
            assert samples[("ncclwatch_stall_active",
                            (("job_id", "job-1"), ("kind", "checkpoint_gather")))] == 1
            assert samples[("ncclwatch_stall_culprit_info",
                            (("host", "node-a"), ("job_id", "job-1"), ("kind", "checkpoint_gather"),
                             ("node", "node-a"), ("rank", "0"), ("rank_namespace", ""),
                             ("rank_pod", ""),
                             ("state", "saving")))] == 1
            assert samples[("ncclwatch_watchdog_timeout_seconds", (("job_id", "job-1"),))] == 90
            assert samples[("ncclwatch_ranks", (("job_id", "job-1"), ("state", "collective")))] == 3
            view = json.loads(jobs)
            stall = view["jobs"][0]["stalls"][0]
            assert stall["culprits"][0]["rank"] == 0
            assert stall["culprits"][0]["stack"]["frames"][0]["name"] == "write"
            assert stall["waiting"]["stacks"][0]["ranks"] == [1, 2, 3]
            assert "rank 0" in page and "checkpoint_gather" in page
    _run(go())


def test_uplink_resends_stacks_to_a_restarted_daemon() -> None:
    """After a daemon restart the agent's new stream carries every stack again."""
    async def go():
        stacks = {stack_pb(BARRIER).id: stack_pb(BARRIER)}
        h1 = Harness()
        async with h1:
            port = h1.server.grpc_port
            up = Uplink(f"127.0.0.1:{port}", stacks)
            task = asyncio.create_task(up.run())
            up.submit(report([sample("j", 0, 1, RankState.COLLECTIVE, CollectiveOp.BARRIER,
                                     stack=stack_pb(BARRIER).id)]).report)
            for _ in range(100):
                if "j" in h1.daemon.table.jobs:
                    break
                await asyncio.sleep(0.05)
            assert len(h1.daemon.table.stacks) == 1
        h2 = Harness()
        h2.daemon.config.grpc = f"127.0.0.1:{port}"
        async with h2:
            # The agent goes on submitting a report per round, as it would.
            for seq in range(2, 200):
                if len(h2.daemon.table.stacks) == 1:
                    break
                up.submit(report([sample("j", 0, 1, RankState.COLLECTIVE, CollectiveOp.BARRIER,
                                         stack=stack_pb(BARRIER).id)], seq=seq).report)
                await asyncio.sleep(0.1)
            assert stack_pb(BARRIER).id in h2.daemon.table.stacks
            up.stop()
            await task
    _run(go())


def test_rejections_are_logged_sampled_but_all_counted(caplog) -> None:
    """A flood of bad reports: every one counted, one log line per code per 10 s."""
    from ncclwatch.daemon.ingest import RejectionLog
    t = [0.0]
    rl = RejectionLog(every=10.0, clock=lambda: t[0])
    with caplog.at_level("WARNING", logger="ncclwatch.daemon.ingest"):
        logged = [rl("peer", "INVALID_ARGUMENT", "bad") for _ in range(1000)]
        logged.append(rl("peer", "RESOURCE_EXHAUSTED", "big"))
        t[0] = 10.5
        logged.append(rl("peer", "INVALID_ARGUMENT", "bad"))
    assert logged.count(True) == 3
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "and 999 more INVALID_ARGUMENT" in lines[-1]

    async def go():
        async with Harness() as h:
            for _ in range(50):
                with pytest.raises(grpc.aio.AioRpcError):
                    await h.send_raw(b"\xff\xff")
            assert h.daemon.rejected_total["INVALID_ARGUMENT"] == 50
    _run(go())


def test_a_rank_claimed_by_another_node_is_set_aside_and_the_rest_applies() -> None:
    """Issue 29: a claim of another live node's rank is no longer refused
    (FAILED_PRECONDITION blinded the node that ran it when a squatter came
    first); without evidence of a newer process it is set aside as a contender."""
    async def go():
        async with Harness() as h:
            await h.send(checkpoint_job())
            before = {r: (rec.state, rec.op, rec.since, rec.node) for r, rec in
                      h.daemon.table.jobs["job-1"].ranks.items()}
            (resp,) = await h.send(report(
                [*checkpoint_job(node="node-evil", agent="agent-evil").report.samples,
                 sample("job-ok", 0, 1, RankState.COMPUTE)], node="node-evil",
                agent="agent-evil"))
            assert not resp.rejected_jobs
            after = {r: (rec.state, rec.op, rec.since, rec.node) for r, rec in
                     h.daemon.table.jobs["job-1"].ranks.items()}
            assert after == before
            assert h.daemon.table.jobs["job-ok"].ranks[0].node == "node-evil"
            assert [c.node for c in h.daemon.ownership.of("job-1", 0)] == ["node-evil"]
            h.daemon.tick()
            assert ("job-1", StallKind.CHECKPOINT_GATHER) in h.daemon.incidents.active
    _run(go())
