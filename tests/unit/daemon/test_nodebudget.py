"""What one node's certificate may make the daemon hold (nodebudget.py).

Before: ``max_jobs_per_agent`` counted per agent id, and agent ids are the
agent's to choose, so one certificate that invented agent ids filled the
daemon's job table and other nodes' new jobs were refused; bytes held had no
bound but the per-field ones. These drive the daemon's core as the gRPC
service does, with the names a client certificate proves.
"""

from __future__ import annotations

import grpc
import pytest

from ncclwatch.agent import uplink
from ncclwatch.contract.bounds import BOUND_LABELS, Bounds
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.export import build, capture
from ncclwatch.daemon.validate import ReportError
from ncclwatch.model import RankState
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.reports import report, sample

A, B, C = frozenset({"node-a"}), frozenset({"node-b"}), frozenset({"node-c"})


def _send(d: Daemon, req: pb.ReportRequest, names: frozenset[str], now: float = 10.0):
    try:
        return d.ingest(req, now, cert_names=names)
    except ReportError as e:
        return e


def test_a_certificate_inventing_1000_agent_ids_cannot_refuse_another_nodes_job() -> None:
    d = Daemon(DaemonConfig(bounds=Bounds(max_jobs=2000)))
    for i in range(1000):
        jobs = [sample(f"b{i}-{j}", 0, 1, RankState.COMPUTE) for j in range(20)]
        _send(d, report(jobs, node="node-b", agent=f"fake-{i}"), B)
    b = d.config.bounds
    assert len(d.table.node_agents["node-b"]) == b.max_agents_per_node
    assert len(d.node_jobs("node-b")) == b.max_jobs_per_node < 2000
    assert d.bound_hits_total["agents_per_node"] == 1000 - b.max_agents_per_node
    assert d.bound_hits_total["jobs_per_node"] > 0
    resp = _send(d, report([sample("real-job", 0, 1, RankState.COMPUTE)]), A)
    assert isinstance(resp, pb.ReportResponse) and not resp.rejected_jobs
    assert d.table.jobs["real-job"].ranks[0].node == "node-a"
    # Without TLS the report's node is the identity.
    e = _send(d, report([], node="node-b", agent="plain"), None)
    assert isinstance(e, ReportError) and e.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_agents_per_node" in e.message


def _fat(job: str, rank: int = 0, *, files: int = 8, tag: str = "x") -> pb.RankSample:
    s = sample(job, rank, 1, RankState.SAVING)
    for f in range(files):
        s.process.files_writing.add(path=f"/ckpt/{tag}{f}/" + "p" * 4000, size_bytes=1)
    return s


def test_a_nodes_bytes_are_bounded_and_other_nodes_keep_theirs() -> None:
    d = Daemon(DaemonConfig(bounds=Bounds(max_node_bytes=300_000)))
    _send(d, report([_fat("a-job")]), A)
    a_held = d.table.held.of("node-a")
    assert 32_000 < a_held < 300_000
    refused = []
    for i in range(20):
        resp = _send(d, report([_fat(f"b-{i}")], node="node-b", agent="agent-b", seq=i + 1), B)
        refused += [j.job_id for j in resp.rejected_jobs]
    assert refused and d.bound_hits_total["node_bytes"] == len(refused)
    assert d.table.held.of("node-b") <= 300_000
    # node-a keeps its data, and its next report (same size, a new job too) applies.
    resp = _send(d, report([_fat("a-job"), _fat("a-job2")], seq=2), A)
    assert not resp.rejected_jobs
    assert d.table.jobs["a-job"].ranks[0].files and "a-job2" in d.table.jobs
    # The estimate follows what is held: a job expired gives its bytes back.
    assert d.table.held.total == sum(d.table.held.by_node.values())


def test_the_total_bytes_bound_refuses_newcomers_never_what_is_held() -> None:
    d = Daemon(DaemonConfig(bounds=Bounds(max_held_bytes=200_000)))
    _send(d, report([_fat("a-job")]), A)
    for i in range(10):
        _send(d, report([_fat(f"b-{i}")], node="node-b", agent="agent-b", seq=i + 1), B)
    assert d.bound_hits_total["held_bytes"] > 0 and d.table.held.total <= 200_000
    resp = _send(d, report([_fat("c-job")], node="node-c", agent="agent-c"), C)
    assert [j.job_id for j in resp.rejected_jobs] == ["c-job"]
    assert "max_held_bytes" in resp.rejected_jobs[0].reason
    # What node-a holds is kept and still updates.
    resp = _send(d, report([_fat("a-job")], seq=2), A)
    assert not resp.rejected_jobs and d.table.jobs["a-job"].ranks[0].state is RankState.SAVING


def test_node_budgets_are_exported() -> None:
    d = Daemon()
    _send(d, report([_fat("a-job")]), A)
    fams = {f.name: f for f in build(capture(d))}
    for name in ("ncclwatch_daemon_node_held_bytes", "ncclwatch_daemon_node_jobs",
                 "ncclwatch_daemon_node_agent_ids", "ncclwatch_daemon_held_bytes",
                 "ncclwatch_daemon_agent_ids"):
        assert name in fams, name
    assert {v for k, v in fams["ncclwatch_daemon_node_jobs"].rows} == {1}
    for label in ("jobs_per_node", "agents_per_node", "agents", "node_bytes", "held_bytes",
                  "dump_reason_length"):
        assert label in BOUND_LABELS.values()


def test_a_long_dump_stacks_reason_is_cut_where_accepted_and_where_kept() -> None:
    d = Daemon()
    _send(d, report([sample("job-1", 0, 1, RankState.COMPUTE)]), A)
    assert d.operator_request_stacks("job-1", "r" * 1_000_000, A) == 1
    d.request_flight_recorder("job-1", "f" * 100_000)
    cmds = d.table.agents["agent-a"].commands
    top = d.config.bounds.max_dump_reason
    assert len(cmds[0].dump_stacks.reason) == top
    assert len(cmds[1].dump_flight_recorder.reason) == top
    assert d.bound_hits_total["dump_reason_length"] == 1


def test_the_agents_channel_has_a_receive_limit_of_its_own() -> None:
    opts = dict(uplink.CHANNEL_OPTIONS)
    assert opts["grpc.max_receive_message_length"] == uplink.MAX_RECEIVE_BYTES
    assert 0 < uplink.MAX_RECEIVE_BYTES <= 16 * 1024 * 1024


@pytest.mark.parametrize("field", ["max_jobs_per_node", "max_agents_per_node", "max_agents",
                                   "max_node_bytes", "max_held_bytes", "max_dump_reason"])
def test_each_new_bound_is_a_setting_with_a_label(field) -> None:
    assert field in BOUND_LABELS and getattr(Bounds(), field) > 0
