"""The agent applies the daemon's rules to what it is about to send, after
the ranks' numbers are learned: one process's reading costs its own part
(left out, counted by reason), and one process per (job, rank) goes out
numbered, the other unnumbered with ``rank_conflict``."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ncclwatch.agent.agent import Agent, AgentConfig
from ncclwatch.agent.discover import RankProcess
from ncclwatch.agent.gpu import EMPTY, RecordedGpuReader
from ncclwatch.agent.ranklearn import RankLearner
from ncclwatch.agent.report import PART_REASONS, PARTS, PartCounts, admit
from ncclwatch.agent.tracker import RankTracker
from ncclwatch.jobid import UNKNOWN_RANK, UNKNOWN_SOURCE, RankIdentity
from ncclwatch.v1 import collector_pb2 as pb

JOB = "master:10.7.7.7:29777/2"


def _agent() -> Agent:
    return Agent(AgentConfig(collector="127.0.0.1:1", node="test-node"),
                 gpu=RecordedGpuReader([]))


def _proc(pid: int, started: float, rank: int, world: int = 2, source: str = "env:RANK",
          env: dict[str, str] | None = None, job: str = JOB) -> RankProcess:
    ident = RankIdentity(job_id=job, job_source="master", rank=rank, local_rank=-1,
                         world_size=world, rank_source=source)
    return RankProcess(pid, started, ident, env or {})


@pytest.fixture
def pipe_holder(tmp_path: Path):
    """A real process holding its Flight Recorder pipe of rank 0 open (torch
    names the pipe by the rank's number)."""
    stem = str(tmp_path / "nccl_pipe_")
    os.mkfifo(stem + "0.pipe")
    p = subprocess.Popen([sys.executable, "-c",
                          "import os,sys,time; os.open(sys.argv[1], os.O_RDONLY | "
                          "os.O_NONBLOCK); print('ready', flush=True); time.sleep(60)",
                          stem + "0.pipe"], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    yield p, stem
    p.kill()
    p.wait()


def _numbers(report: pb.NodeReport) -> dict[int, tuple[int, str, str]]:
    return {s.identity.pid: (s.identity.rank, s.identity.rank_source, s.identity.rank_conflict)
            for s in report.samples}


def test_a_learned_duplicate_of_an_env_rank_goes_unnumbered_with_its_conflict(
        pipe_holder) -> None:
    holder, stem = pipe_holder
    # The member with no RANK is the older process: the environment's number
    # wins anyway. Its number comes from ranklearn's real path (the pipe's name).
    env_member = _proc(os.getpid(), started=2000.0, rank=0)
    learned_member = _proc(holder.pid, started=1000.0, rank=UNKNOWN_RANK,
                           source=UNKNOWN_SOURCE,
                           env={"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": stem})
    procs = RankLearner().apply([env_member, learned_member], time.monotonic())
    assert {p.pid: (p.identity.rank, p.identity.rank_source) for p in procs} == {
        os.getpid(): (0, "env:RANK"), holder.pid: (0, "flight_recorder")}

    agent = _agent()
    now = time.monotonic()
    agent.trackers = {p.pid: RankTracker(p, now) for p in procs}
    before = PARTS.counts["duplicate_rank"]
    report = agent._build(EMPTY)
    got = _numbers(report)
    assert got[os.getpid()] == (0, "env:RANK", "")
    assert got[holder.pid] == (UNKNOWN_RANK, UNKNOWN_SOURCE,
                               f"flight_recorder:0 held by pid {os.getpid()} (env:RANK)")
    assert [s.identity.rank for s in report.samples].count(0) == 1
    assert PARTS.counts["duplicate_rank"] == before + 1
    health = dict(zip(PART_REASONS, report.health.parts_left_out))
    assert health["duplicate_rank"] == before + 1


def test_without_an_env_number_the_older_process_keeps_the_rank() -> None:
    parts = PartCounts()
    old, young = pb.RankSample(), pb.RankSample()
    for s, pid, src, age in ((old, 20, "flight_recorder", 400.0),
                             (young, 10, "ray_train_log", 5.0)):
        s.identity.CopyFrom(pb.RankIdentity(job_id=JOB, rank=1, world_size=2, pid=pid,
                                            rank_source=src, process_age_seconds=age))
    other_job = pb.RankSample(identity=pb.RankIdentity(job_id="other", rank=1, world_size=2,
                                                       pid=30, rank_source="env:RANK"))
    kept = admit([young, old, other_job], parts)
    assert len(kept) == 3          # never merged, never dropped
    assert (old.identity.rank, young.identity.rank, other_job.identity.rank) == (1, -1, 1)
    assert young.identity.rank_conflict == "ray_train_log:1 held by pid 20 (flight_recorder)"
    assert parts.counts == {"duplicate_rank": 1}


def test_a_world_far_over_the_bound_costs_its_own_sample_only() -> None:
    agent = _agent()
    now = time.monotonic()
    good = _proc(os.getpid(), 1000.0, rank=0)
    bad = _proc(os.getppid(), 900.0, rank=3, world=10**7, job="huge")
    agent.trackers = {p.pid: RankTracker(p, now) for p in (good, bad)}
    before = PARTS.counts["world_size_over_limit"]
    report = agent._build(EMPTY)
    assert [(s.identity.job_id, s.identity.pid) for s in report.samples] == [(JOB, os.getpid())]
    assert PARTS.counts["world_size_over_limit"] == before + 1
    health = dict(zip(PART_REASONS, report.health.parts_left_out))
    assert health["world_size_over_limit"] == before + 1
    # Every round it is still there, it is left out again (counted), and only it.
    report = agent._build(EMPTY)
    assert [s.identity.pid for s in report.samples] == [os.getpid()]
    assert PARTS.counts["world_size_over_limit"] == before + 2


@pytest.mark.parametrize("reason, breaks", [
    ("world_size_over_limit", lambda s: setattr(s.identity, "world_size", 10**7)),
    ("bad_world_size", lambda s: setattr(s.identity, "world_size", -1)),
    ("rank_out_of_range", lambda s: setattr(s.identity, "rank", 2)),
    ("rank_out_of_range", lambda s: setattr(s.identity, "rank", -7)),
    ("not_finite", lambda s: setattr(s, "state_seconds", math.inf)),
    ("not_finite", lambda s: setattr(s, "stack_age_seconds", math.nan)),
    ("age_over_limit", lambda s: setattr(s, "state_seconds", 400 * 86400.0)),
])
def test_each_sample_rule_leaves_that_sample_out(reason, breaks) -> None:
    parts = PartCounts()
    ok, bad = (pb.RankSample(identity=pb.RankIdentity(job_id=JOB, rank=r, world_size=2,
                                                      pid=10 + r, rank_source="env:RANK"))
               for r in (0, 1))
    breaks(bad)
    assert admit([ok, bad], parts) == [ok]
    assert parts.counts == {reason: 1}


def test_readings_that_are_not_finite_are_cleared_and_the_rank_still_sent() -> None:
    parts = PartCounts()
    s = pb.RankSample(identity=pb.RankIdentity(job_id=JOB, rank=0, world_size=2, pid=10),
                      state=pb.RANK_STATE_COLLECTIVE, state_seconds=5.0, still_seconds=math.nan,
                      process=pb.ProcessStats(cpu_utilization=math.inf, rss_bytes=7),
                      job=pb.JobInfo(watchdog_timeout_seconds=-math.inf))
    assert admit([s], parts) == [s]
    assert not s.HasField("still_seconds") and not s.HasField("process")
    assert not s.HasField("job")
    assert (s.state, s.state_seconds) == (pb.RANK_STATE_COLLECTIVE, 5.0)
    assert parts.counts == {"not_finite": 1}
    fine = pb.RankSample(identity=pb.RankIdentity(job_id=JOB, rank=1, world_size=2, pid=11),
                         still_seconds=3.0, process=pb.ProcessStats(cpu_utilization=0.5))
    assert admit([fine], parts) == [fine] and fine.HasField("process")
    assert parts.counts == {"not_finite": 1}


def test_a_rank_sample_the_daemon_dropped_is_said_once_and_never_resyncs(caplog) -> None:
    from ncclwatch.agent import delta
    from ncclwatch.agent.uplink import Uplink

    connects: list[int] = []
    u = Uplink("127.0.0.1:1", {}, on_connect=lambda: connects.append(1))
    u._deltas = delta.StreamDeltas(phase=0)
    s = pb.RankSample(identity=pb.RankIdentity(job_id=JOB, rank=0, world_size=2, pid=10),
                      state=pb.RANK_STATE_COMPUTE, still_seconds=1.0,
                      process=pb.ProcessStats(cpu_utilization=0.1))
    first = pb.NodeReport(agent_monotonic_seconds=1.0, full_round=True, samples=[s])
    u._deltas.convert(first, pb.NodeReport())
    part = pb.DroppedPart(what="rank_sample", job_id=JOB, rank=0, bound="ranks_per_job",
                          reason="world size over max_ranks_per_job")
    sent: set[str] = set()
    caplog.set_level("WARNING", logger="ncclwatch.agent.uplink")
    for _ in range(3):
        u._on_reply(pb.ReportResponse(ack_seq=1, dropped_parts=[part]), sent, True)
    assert u.parts_dropped_total == 3
    assert len([r for r in caplog.records if "rank_sample" in r.getMessage()]) == 1
    assert not connects and u.resyncs_total == 0 and not sent
    # The stream goes on from what it sent (a brief, not everything again in full).
    s.state_seconds = s.stack_age_seconds = 1.0   # one second on, nothing else moved
    out = pb.NodeReport()
    u._deltas.convert(pb.NodeReport(agent_monotonic_seconds=2.0, full_round=True, samples=[s]),
                      out)
    assert not out.slots_reset and list(out.briefs.slot) == [1] and not out.samples
