"""Unbounded work from small inputs, bounded (issue 20, item 4, the daemon's part).

Each reproduction goes over real gRPC to a real daemon: 40 valid reports
that made 163,840 jobs, 9 MB stacks, 1 MB paths and env values, an interval
of 1e300 that kept a dead agent fresh, ages of centuries. Every bound is a
setting (flag, environment, TOML; the last test runs the real CLI with
them) and every hit is counted in ncclwatch_daemon_bound_hits_total.
"""

from __future__ import annotations

import asyncio
import os
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ncclwatch.contract.bounds import BOUND_LABELS, Bounds
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.server import DaemonServer
from ncclwatch.model import RankState
from ncclwatch.stacks import Frame, stack_id
from ncclwatch.v1 import collector_pb2 as pb
from ncclwatch.v1 import collector_pb2_grpc as pb_grpc
from tests.harness.procs import Proc, free_port
from tests.harness.reports import report, sample
from tests.harness.tools import need

MB = 1 << 20


def _run(coro):
    return asyncio.run(coro)


class Harness:
    def __init__(self, **bounds) -> None:
        self.daemon = Daemon(DaemonConfig(grpc="127.0.0.1:0", http="127.0.0.1:0",
                                          bounds=Bounds(**bounds)))
        self.server = DaemonServer(self.daemon)

    async def __aenter__(self) -> "Harness":
        await self.server.start()
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.server.grpc_port}",
                                                 options=[("grpc.max_send_message_length",
                                                           64 * MB)])
        self.stub = pb_grpc.CollectorServiceStub(self.channel)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.channel.close()
        await self.server.stop(grace=0.1)

    async def send(self, *reqs: pb.ReportRequest) -> list[pb.ReportResponse]:
        return [r async for r in self.stub.Report(iter(reqs))]

    async def refused(self, req: pb.ReportRequest) -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await self.send(req)
        return ei.value

    def hits(self) -> dict[str, float]:
        return _hits(self.server.http_port)


def _hits(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {s.labels["bound"]: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "ncclwatch_daemon_bound_hits_total"}


def _one_job_per_sample(n: int, tag: str) -> list[pb.RankSample]:
    return [sample(f"{tag}-{i}", 0, 1, RankState.COMPUTE) for i in range(n)]


def test_forty_valid_reports_no_longer_make_163840_jobs() -> None:
    async def go():
        async with Harness() as h:
            b = h.daemon.config.bounds
            # One agent, 40 reports of 4,096 one-rank jobs each (the reproduction).
            resps = await h.send(*[report(_one_job_per_sample(4096, f"r{k}"), seq=k + 1)
                                   for k in range(40)])
            assert len(h.daemon.table.jobs) == b.max_jobs_per_agent == 256
            first = resps[0].rejected_jobs
            assert len(first) == 4096 - 256 and {j.code for j in first} == {"RESOURCE_EXHAUSTED"}
            assert "max_jobs_per_agent 256" in first[0].reason
            hits = await asyncio.to_thread(h.hits)
            assert hits["jobs_per_agent"] == 40 * 4096 - 256
            assert set(hits) == set(BOUND_LABELS.values())  # every bound exported, 0 or not
    _run(go())


def test_many_agents_stop_at_the_daemons_job_bound() -> None:
    async def go():
        async with Harness(max_jobs=1000) as h:
            for a in range(8):
                await h.send(report(_one_job_per_sample(200, f"a{a}"), agent=f"agent-{a}",
                                    node=f"node-{a}"))
            assert len(h.daemon.table.jobs) == 1000
            # Jobs already tracked keep reporting; a newcomer is what is refused.
            (resp,) = await h.send(report(_one_job_per_sample(200, "a0"), agent="agent-0",
                                          node="node-0", seq=2))
            assert not resp.rejected_jobs
            assert (await asyncio.to_thread(h.hits))["jobs"] == 600
    _run(go())


def test_ranks_per_job_bound_counts_rankless_members_too() -> None:
    async def go():
        async with Harness(max_ranks_per_job=8) as h:
            members = [sample("big", -1, 0, RankState.COMPUTE, pid=100 + i) for i in range(12)]
            (resp,) = await h.send(report(members))
            assert [(j.job_id, j.code) for j in resp.rejected_jobs] == \
                [("big", "RESOURCE_EXHAUSTED")]
            assert "max_ranks_per_job" in resp.rejected_jobs[0].reason
            assert "big" not in h.daemon.table.jobs
            # A world past the bound costs its sample, not the report.
            (resp,) = await h.send(report([sample("wide", 0, 9, RankState.COMPUTE),
                                           sample("ok", 0, 2, RankState.COMPUTE)], seq=2))
            (part,) = resp.dropped_parts
            assert (part.what, part.job_id, part.bound) == ("rank_sample", "wide", "ranks_per_job")
            assert part.reason.startswith("world_size_over_limit: ") and \
                "max_ranks_per_job" in part.reason
            assert "wide" not in h.daemon.table.jobs and "ok" in h.daemon.table.jobs
            assert (await asyncio.to_thread(h.hits))["ranks_per_job"] == 2
    _run(go())


def _big_stack(frames: int, name_len: int, tag: str = "") -> pb.Stack:
    fr = [Frame(f"{tag}{i}" + "f" * name_len, "/x/" + "p" * name_len, i) for i in range(frames)]
    return pb.Stack(id=stack_id(fr), thread_name="MainThread",
                    frames=[pb.Frame(name=f.name, filename=f.filename, line=f.line) for f in fr])


def test_stacks_are_bounded_by_bytes_not_only_count() -> None:
    async def go():
        async with Harness(max_stored_stack_bytes=2 * MB) as h:
            # 9 MB of text in one stack (1,100 frames of 4,090-character names),
            # then 8 MB in 1,000 frames: each stack is left out, not the report.
            (resp,) = await h.send(report([], stacks=[_big_stack(1100, 4090)]))
            assert [(p.what, p.bound) for p in resp.dropped_parts] == [("stack", "stack_frames")]
            (resp,) = await h.send(report([], stacks=[_big_stack(1000, 4000)], seq=2))
            assert "max_stack_bytes 262144" in resp.dropped_parts[0].reason
            # Under the per-stack bound, over the per-report one (8 MiB): the
            # stacks past it are left out, the first ones kept.
            many = [_big_stack(60, 2000, f"s{k}") for k in range(40)]
            (resp,) = await h.send(report([], stacks=many, seq=3))
            assert {p.bound for p in resp.dropped_parts} == {"report_stack_bytes"}
            n = len(resp.dropped_parts)
            assert 0 < n < 40 and [p.stack_id for p in resp.dropped_parts] == \
                [st.id for st in many[40 - n:]]
            # 30 reports of distinct 240 KB stacks: the store keeps 2 MiB, not 7 MB.
            for k in range(30):
                await h.send(report([], stacks=[_big_stack(60, 2000, f"t{k}")], seq=k + 1,
                                    agent=f"st-{k}"))
            store = h.daemon.table.stacks
            assert store.bytes <= 2 * MB and len(store) >= 8
            hits = await asyncio.to_thread(h.hits)
            assert hits["stack_frames"] == 1 and hits["stack_bytes"] == 1
            assert hits["report_stack_bytes"] == len(resp.dropped_parts)
            assert hits["stored_stack_bytes"] > 0
    _run(go())


def test_megabyte_paths_and_env_values_cost_their_sample() -> None:
    async def go():
        async with Harness() as h:
            s = sample("j", 0, 1, RankState.SAVING)
            s.process.files_writing.append(pb.OpenFile(path="/ckpt/" + "a" * MB, size_bytes=1))
            (resp,) = await h.send(report([s, sample("ok", 0, 1, RankState.COMPUTE)]))
            (part,) = resp.dropped_parts
            assert (part.what, part.job_id, part.rank) == ("rank_sample", "j", 0)
            assert "over 4096 characters (max_path)" in part.reason
            s = sample("j", 0, 1, RankState.SAVING, timeout=60.0)
            s.job.env["NCCL_DEBUG_FILE"] = "x" * MB
            (resp,) = await h.send(report([s], seq=2))
            assert "'NCCL_DEBUG_FILE'" in resp.dropped_parts[0].reason
            assert "max_env_value" in resp.dropped_parts[0].reason
            assert set(h.daemon.table.jobs) == {"ok"}
            assert h.daemon.node_faults["node-a"] == {"path_too_long": 1, "env_too_long": 1}
            hits = await asyncio.to_thread(h.hits)
            assert hits["path_length"] == 1 and hits["env_length"] == 1
    _run(go())


def test_an_absurd_interval_cannot_keep_a_dead_agent_fresh() -> None:
    async def go():
        async with Harness() as h:
            err = await h.refused(report([sample("j", 0, 1, RankState.COMPUTE)],
                                         interval=1e300))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "max_interval_seconds" in err.details()
            assert "j" not in h.daemon.table.jobs
            # An honest agent, then silence: its rank goes stale on time.
            await h.send(report([sample("j", 0, 1, RankState.COMPUTE)], interval=1.0))
            agent = h.daemon.table.agents["agent-a"]
            assert agent.interval == 1.0
            assert agent.stale(agent.last_recv + 11.0, h.daemon.table.staleness)
            assert (await asyncio.to_thread(h.hits))["interval"] == 1
    _run(go())


@pytest.mark.parametrize("field", ["state_seconds", "stack_age_seconds"])
def test_ages_of_centuries_cost_their_sample(field) -> None:
    async def go():
        async with Harness() as h:
            s = sample("j", 0, 2, RankState.COMPUTE)
            setattr(s, field, 3e9)
            (resp,) = await h.send(report([s, sample("j", 1, 2, RankState.COMPUTE)]))
            (part,) = resp.dropped_parts
            assert part.reason.startswith("age_over_limit: ") and \
                f"{field} must be finite and in [0, 3.16224e+07] (max_age_seconds)" \
                in part.reason
            assert set(h.daemon.table.jobs["j"].ranks) == {1}
            assert (await asyncio.to_thread(h.hits))["age"] == 1
    _run(go())


def test_flight_recorder_summaries_are_bounded() -> None:
    async def go():
        async with Harness(max_flight_recorder_ranks=8, max_flight_recorder_groups=4) as h:
            s = sample("j", 0, 4, RankState.COMPUTE)
            s.flight_recorder.groups.extend(pb.ProcessGroupProgress(
                pg_id=str(i), pg_name=str(i), ranks=[0, 1, 2, 3]) for i in range(3))
            (resp,) = await h.send(report([s]))
            (part,) = resp.dropped_parts
            assert (part.what, part.job_id, part.rank) == ("flight_recorder", "j", 0)
            assert "its groups list 12 ranks (max_flight_recorder_ranks 8)" in part.reason
            assert 0 in h.daemon.table.jobs["j"].ranks   # the sample itself applied
            s.flight_recorder.groups.extend(pb.ProcessGroupProgress(pg_id=str(i), pg_name=str(i))
                                            for i in range(3, 6))
            (resp,) = await h.send(report([s], seq=2))
            assert "max_flight_recorder_groups 4" in resp.dropped_parts[0].reason
            hits = await asyncio.to_thread(h.hits)
            assert hits["flight_recorder_ranks"] == 1 and hits["flight_recorder_groups"] == 1
    _run(go())


def test_bounds_come_from_flags_environment_and_toml(tmp_path) -> None:
    """The real ``ncclwatch daemon``: a flag, an environment variable and a TOML
    key each set one bound, and the daemon applies them."""
    cfg = tmp_path / "daemon.toml"
    cfg.write_text("max_path = 64\n")
    grpc_port, http_port = free_port(), free_port()
    env = {**os.environ, "NCCLWATCH_MAX_ENV_VALUE": "16"}
    proc = Proc([need("ncclwatch"), "daemon", "--config", str(cfg), "--grpc",
                 f"127.0.0.1:{grpc_port}", "--http", f"127.0.0.1:{http_port}",
                 "--max-jobs-per-agent", "2"], env=env)
    try:
        async def go():
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
                await asyncio.wait_for(ch.channel_ready(), 30)
                stub = pb_grpc.CollectorServiceStub(ch)
                (resp,) = [r async for r in stub.Report(iter([
                    report(_one_job_per_sample(3, "cli"))]))]
                assert [j.job_id for j in resp.rejected_jobs] == ["cli-2"]
                s = sample("p", 0, 1, RankState.SAVING)
                s.process.files_writing.append(pb.OpenFile(path="/" + "a" * 64))
                (resp,) = [r async for r in stub.Report(iter([report([s], agent="b")]))]
                assert "over 64 characters (max_path)" in resp.dropped_parts[0].reason
                s = sample("e", 0, 1, RankState.SAVING, timeout=5.0)
                s.job.env["NCCL_DEBUG"] = "x" * 17
                (resp,) = [r async for r in stub.Report(iter([report([s], agent="c")]))]
                assert "value over 16 characters (max_env_value)" in \
                    resp.dropped_parts[0].reason
        _run(go())
        hits = _hits(http_port)
        assert (hits["jobs_per_agent"], hits["path_length"], hits["env_length"]) == (1, 1, 1)
    finally:
        proc.stop()


def test_an_agent_clock_that_is_no_monotonic_clock_is_refused() -> None:
    """The daemon anchors ages on the agent's clock: 1e300 would put a wait's
    start at 0 (float cancellation) and age every rank of the agent."""
    async def go():
        async with Harness() as h:
            req = report([sample("j", 0, 1, RankState.COMPUTE)])
            req.report.agent_monotonic_seconds = 1e300
            err = await h.refused(req)
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "is not a monotonic clock" in err.details()
            assert (await asyncio.to_thread(h.hits))["age"] == 1
    _run(go())
