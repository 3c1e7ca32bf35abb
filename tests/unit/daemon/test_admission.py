"""Admission part by part: one process's bad reading costs its own part.

A node runs a real job beside any process a user starts: one that claims a
world size past the daemon's limit, or a member whose learned rank number
is one the environment gives another, must never blind the daemon to the
node. Each case sends a report through the real Daemon.ingest (and
admission.admit) and checks what is dropped, why, and that the rest applied.
"""

from __future__ import annotations

import grpc
import pytest

from ncclwatch.contract import checks
from ncclwatch.contract.bounds import Bounds
from ncclwatch.daemon.admission import admit
from ncclwatch.daemon.core import Daemon
from ncclwatch.daemon.settings import DaemonConfig
from ncclwatch.daemon.validate import ReportError
from ncclwatch.model import RankState
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.reports import checkpoint_job, report, sample


def _daemon(**bounds) -> Daemon:
    return Daemon(DaemonConfig(bounds=Bounds(**bounds)))


def test_a_world_past_the_limit_costs_its_sample_and_the_other_job_applies() -> None:
    d = _daemon(max_ranks_per_job=64)
    big = sample("huge", 3, 1_000_000, RankState.COMPUTE, pid=4242)
    resp = d.ingest(report([big, sample("good", 0, 2, RankState.COMPUTE),
                            sample("good", 1, 2, RankState.COMPUTE)]), now=10.0)
    assert [(p.what, p.job_id, p.rank, p.bound) for p in resp.dropped_parts] == \
        [("rank_sample", "huge", 3, "ranks_per_job")]
    assert resp.dropped_parts[0].reason.startswith("world_size_over_limit: samples[0]: ")
    assert set(d.table.jobs) == {"good"} and set(d.table.jobs["good"].ranks) == {0, 1}
    assert not d.rejected_total and not resp.rejected_jobs
    assert d.bound_hits_total["ranks_per_job"] == 1
    assert d.node_faults == {"node-a": {"world_size_over_limit": 1}}
    assert d.node_fault_at == {"node-a": 10.0}
    # every round: counted each time, the node still watched
    d.ingest(report([big, sample("good", 0, 2, RankState.SAVING),
                     sample("good", 1, 2, RankState.COMPUTE)], seq=2), now=11.0)
    assert d.node_faults["node-a"]["world_size_over_limit"] == 2
    assert d.table.jobs["good"].ranks[0].state is RankState.SAVING


def _member(rank: int, pid: int, source: str, age: float = 0.0) -> pb.RankSample:
    s = sample("job", rank, 2, RankState.COMPUTE, pid=pid)
    s.identity.rank_source = source
    s.identity.process_age_seconds = age
    return s


@pytest.mark.parametrize("env_first", [True, False])
def test_a_duplicate_rank_keeps_the_environments_process(env_first) -> None:
    """A learned number never takes the rank from the process whose
    environment gives it, whichever comes first and however old."""
    env, learned = _member(0, 100, "env:RANK", age=5.0), _member(0, 200, "flight_recorder",
                                                                  age=500.0)
    d = Daemon()
    pair = [env, learned] if env_first else [learned, env]
    resp = d.ingest(report([*pair, _member(1, 300, "env:RANK")]), now=1.0)
    assert [(p.what, p.job_id, p.rank, p.reason.split(":")[0])
            for p in resp.dropped_parts] == [("rank_sample", "job", 0, "duplicate_rank")]
    assert "kept pid 100 (env:RANK)" in resp.dropped_parts[0].reason
    ranks = d.table.jobs["job"].ranks
    assert ranks[0].pid == 100 and ranks[1].pid == 300
    assert not d.rejected_total
    assert d.node_faults["node-a"] == {"duplicate_rank": 1}


def test_of_two_learned_numbers_the_older_process_keeps_it() -> None:
    young, old = _member(0, 100, "ray_train_log", age=3.0), _member(0, 200, "flight_recorder",
                                                                     age=90.0)
    req = report([young, old])
    adm = admit(req)
    assert [(p.reason, p.rank) for p in adm.dropped] == [("duplicate_rank", 0)]
    assert [s.identity.pid for s in req.report.samples] == [200]

def test_the_process_the_daemon_holds_keeps_its_rank_against_a_newcomer() -> None:
    """Found by the property test: a process that starts claiming a live rank from
    its environment, older and first in the report, never pushes out the
    process the daemon already holds for it."""
    d = Daemon(DaemonConfig())
    held = sample("job-1", 1, 2, RankState.COLLECTIVE, pid=1101)
    held.identity.rank_source, held.identity.process_age_seconds = "env:RANK", 50.0
    d.ingest(report([held], seq=1), now=100.0)
    newcomer = sample("job-1", 1, 2, RankState.COMPUTE, pid=1100)
    newcomer.identity.rank_source, newcomer.identity.process_age_seconds = "env:RANK", 900.0
    resp = d.ingest(report([newcomer, held], seq=2), now=101.0)
    assert d.table.jobs["job-1"].ranks[1].pid == 1101
    assert [(p.what, p.rank) for p in resp.dropped_parts] == [("rank_sample", 1)]
    assert "kept pid 1101" in resp.dropped_parts[0].reason



@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_a_non_finite_state_seconds_costs_its_sample(value) -> None:
    d = Daemon()
    d.ingest(checkpoint_job(), now=1.0)
    bad = sample("job-1", 2, 4, RankState.COMPUTE, seconds=value)
    req = checkpoint_job(seq=2)
    req.report.samples[2].CopyFrom(bad)
    resp = d.ingest(req, now=2.0)
    (part,) = resp.dropped_parts
    assert (part.what, part.job_id, part.rank, part.bound) == ("rank_sample", "job-1", 2, "")
    assert part.reason.startswith("not_finite: samples[2]: state_seconds must be finite")
    job = d.table.jobs["job-1"]
    assert job.ranks[0].state is RankState.SAVING and job.ranks[3].state is RankState.COLLECTIVE
    assert not d.rejected_total


def test_a_dropped_sample_leaves_its_slot_out_of_later_briefs() -> None:
    s = sample("j", 0, 1, RankState.COMPUTE, seconds=float("nan"))
    s.slot = 7
    req = report([s, sample("k", 0, 1, RankState.COMPUTE)])
    assert admit(req).slots == [7]


@pytest.mark.parametrize("mutate,reason", [
    (lambda r: setattr(r, "node", ""), "bad_node"),
    (lambda r: setattr(r, "agent_id", "a" * 65), "bad_agent_id"),
    (lambda r: setattr(r, "interval_seconds", float("nan")), "bad_clock"),
])
def test_a_node_level_fault_still_refuses_the_report_whole(mutate, reason) -> None:
    d = Daemon()
    req = report([sample("good", 0, 1, RankState.COMPUTE)])
    mutate(req.report)
    with pytest.raises(ReportError) as e:
        d.ingest(req, now=3.0)
    assert e.value.code is grpc.StatusCode.INVALID_ARGUMENT and e.value.reason == reason
    assert not d.table.jobs and d.rejected_total["INVALID_ARGUMENT"] == 1
    who = req.report.node[:255]
    assert d.node_faults[who] == {reason: 1} and d.node_fault_at[who] == 3.0


def test_node_faults_are_bounded_and_forget_the_least_recent() -> None:
    d = _daemon(max_agents=2)
    for i, node in enumerate(["n1", "n2", "n3"]):
        d.record_fault(node, "bad_pid", float(i))
    assert set(d.node_faults) == {"n2", "n3"} and set(d.node_fault_at) == {"n2", "n3"}


def test_every_fault_names_a_part_and_a_reason_of_the_contract() -> None:
    with pytest.raises(AssertionError):
        checks.Fault("rank_sample", "no_such_reason", "x")
    with pytest.raises(AssertionError):
        checks.Fault("no_such_part", "bad_pid", "x")
    assert all(r == r.lower() and " " not in r for r in checks.REASONS)


def test_an_exited_entry_with_a_bad_rank_is_dropped_alone() -> None:
    req = report([sample("j", 0, 1, RankState.COMPUTE)])
    req.report.exited.add(job_id="j", rank=-5)
    req.report.exited.add(job_id="j", rank=0)
    adm = admit(req)
    assert [(p.what, p.reason) for p in adm.dropped] == [("exited", "rank_out_of_range")]
    assert [e.rank for e in req.report.exited] == [0] and len(req.report.samples) == 1
