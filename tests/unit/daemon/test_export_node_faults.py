"""A blind node is never silent: a node whose report parts the daemon drops
(or whose reports it refuses) is counted by reason on /metrics, named in the
API's agents view, in red on the page and in a line of ``ncclwatch status``.

Driven through the daemon's real ingest (the gRPC service's core) with a
report that carries one process claiming a world far over the daemon's limit
beside a healthy job: before, that node said nothing anywhere.
"""

from __future__ import annotations

import grpc
import pytest

from ncclwatch import status
from ncclwatch.contract.checks import REASONS
from ncclwatch.daemon import api, page
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.export import build, capture, encode, fault_reasons
from ncclwatch.daemon.validate import ReportError
from ncclwatch.model import RankState
from tests.harness.paths import ROOT
from tests.harness.reports import report, sample


def _faulty(d: Daemon, rounds: int = 3, start: float = 10.0) -> None:
    for i in range(rounds):
        bad = sample("notebook", 0, 10**7, RankState.IDLE, pid=4242)
        good = sample("train", 0, 1, RankState.COMPUTE)
        d.ingest(report([good, bad], node="node-a", seq=i + 1), start + i)


def _metric(d: Daemon, now: float) -> dict[tuple[str, str], float]:
    fam = next(f for f in build(capture(d, now)) if f.name == "ncclwatch_daemon_node_faults")
    return {labels: v for labels, v in fam.rows}


def test_a_bad_sample_is_counted_by_node_and_reason_and_the_good_job_kept() -> None:
    d = Daemon(DaemonConfig())
    _faulty(d)
    assert "train" in d.table.jobs and "notebook" not in d.table.jobs
    assert _metric(d, 13.0) == {("node-a", "world_size_over_limit"): 3}
    text = encode(build(capture(d, 13.0))).decode()
    assert ('ncclwatch_daemon_node_faults_total{node="node-a",reason="world_size_over_limit"} 3'
            in text)


def test_a_reason_outside_the_contract_is_exported_as_other() -> None:
    assert fault_reasons({"world_size_over_limit": 2, "x" * 300: 4, "new": 1}) == [
        ("other", 5), ("world_size_over_limit", 2)]
    assert "other" not in REASONS


def test_the_agents_view_page_and_status_name_the_node_and_reason() -> None:
    d = Daemon(DaemonConfig())
    _faulty(d, rounds=4)
    view = api.jobs_view(d, now=20.0)
    (a,) = view["agents"]
    assert a["node"] == "node-a"
    assert a["faults"] == {"world_size_over_limit": 4}
    assert a["last_fault_seconds_ago"] == 7.0 and a["faults_recent"]
    html = page.render(view)
    assert ("<b class='bad faults'>4 parts dropped or reports refused "
            "(world_size_over_limit: 4) since the daemon started; last 7s ago</b>") in html
    out = status.render(view)
    assert ("FAULTS on node-a: 4 parts dropped or reports refused (world_size_over_limit: 4) "
            "since the daemon started; last 7s ago") in out
    # Long after the last fault: the page says it small, status no more.
    later = api.jobs_view(d, now=13.0 + api.FAULT_RECENT_SECONDS + 1)
    assert not later["agents"][0]["faults_recent"]
    assert "class='bad faults'" not in page.render(later)
    assert "FAULTS" not in status.render(later)


def test_a_node_whose_every_report_is_refused_still_has_a_row() -> None:
    """Refused whole (a certificate for another node): no agent is held, yet
    the API, the page and status name the node and why."""
    d = Daemon(DaemonConfig())
    for i in range(3):
        with pytest.raises(ReportError) as e:
            d.ingest(report([sample("train", 0, 1, RankState.COMPUTE)], node="node-b",
                            seq=i + 1), 10.0 + i, cert_names=frozenset({"node-c"}))
        assert e.value.code is grpc.StatusCode.PERMISSION_DENIED
    assert not d.table.agents
    view = api.jobs_view(d, now=15.0)
    rows = [a for a in view["agents"] if a["faults"]]
    assert len(rows) == 1 and rows[0]["faults"] == {"identity": 3}
    assert rows[0]["agent_id"] == "" and rows[0]["last_report_seconds"] is None
    assert "never applied" in page.render(view)
    out = status.render(view)
    assert out.startswith("no training jobs seen (0 agent(s) connected)")
    assert f"FAULTS on {rows[0]['node']}: 3 parts dropped or reports refused (identity: 3)" in out


def test_node_names_and_reasons_are_escaped_on_the_page_and_in_status() -> None:
    row = {"node": "<img src=x>\x1b[2J", "agent_id": "a", "connected": True, "stale": False,
           "last_report_seconds": 1.0, "ranks_watched": 1, "nvml_up": False, "version": "",
           "report_gaps": 0, "faults": {"<script>\x1b]0;": 2},
           "last_fault_seconds_ago": 1.0, "faults_recent": True}
    html = page.render({"jobs": [], "agents": [row]})
    assert "<img src=x>" not in html and "<script>\x1b" not in html
    assert "&lt;script&gt;" in html
    out = status.render({"jobs": [], "agents": [row]})
    assert "\x1b" not in out and "FAULTS on" in out


def test_two_shards_faults_of_one_agent_are_summed() -> None:
    """Each shard drops the parts of its own jobs: status says them all."""
    x = {"faults": {"duplicate_rank": 2}, "last_fault_seconds_ago": 5.0, "faults_recent": True}
    y = {"faults": {"world_size_over_limit": 3}, "last_fault_seconds_ago": 1.0,
         "faults_recent": False}
    x["left_out"], x["left_out_seconds_ago"] = {"duplicate_rank": 4}, 9.0
    y["left_out"], y["left_out_seconds_ago"] = {"duplicate_rank": 3, "not_finite": 1}, 2.0
    assert status._both_faults(x, y) == {  # noqa: SLF001
        "faults": {"duplicate_rank": 2, "world_size_over_limit": 3},
        "last_fault_seconds_ago": 1.0, "faults_recent": True,
        # the agent's own count is one agent's, seen by both shards: the larger
        "left_out": {"duplicate_rank": 4, "not_finite": 1}, "left_out_seconds_ago": 2.0}


def test_the_alert_says_refused_whole_only_for_the_contracts_node_reasons() -> None:
    """The alert's description tells a blind node from a partly blind one by
    reason: every name it matches is one of the contract's."""
    import re

    import yaml
    rules = yaml.safe_load((ROOT / "dashboards" / "prometheus"
                            / "alerts.yaml").read_text())
    (rule,) = [r for g in rules["groups"] for r in g["rules"]
               if r.get("alert") == "NCCLWatchNodeReportFaults"]
    names = re.search(r'match "\^\(([a-z_|]+)\)\$"', rule["annotations"]["description"])[1]
    assert set(names.split("|")) <= set(REASONS) and "identity" in names
    assert "ncclwatch_daemon_node_faults_total" in rule["expr"]


def test_the_parts_an_agent_left_out_are_exported_by_the_contracts_reason() -> None:
    """The agent's own count (AgentHealth.parts_left_out, in REASONS order) is on
    /metrics by node and reason, a reason's series from its first count."""
    d = Daemon(DaemonConfig())
    req = report([sample("train", 0, 1, RankState.COMPUTE)], node="node-b")
    counts = [0] * len(REASONS)
    counts[list(REASONS).index("duplicate_rank")] = 2
    req.report.health.parts_left_out.extend(counts)
    d.ingest(req, 10.0)
    fam = next(f for f in build(capture(d, 10.0)) if f.name == "ncclwatch_agent_parts_left_out")
    rows = dict(fam.rows)
    assert rows[("node-b", "duplicate_rank")] == 2
    assert rows == {("node-b", "duplicate_rank"): 2}    # a reason appears with its count
    # The node is faulty though the daemon dropped nothing: the agents view,
    # the page and status say what the agent left out.
    (a,) = api.jobs_view(d, now=12.0)["agents"]
    assert a["faults"] == {} and a["left_out"] == {"duplicate_rank": 2}
    assert a["left_out_seconds_ago"] == 2.0 and a["faults_recent"]
    said = "2 samples the agent left out before sending (duplicate_rank: 2); last 2s ago"
    view = api.jobs_view(d, now=12.0)
    assert said in page.render(view)
    assert f"FAULTS on node-b: {said}" in status.render(view)
    # The same count again is no new fault: it goes quiet after 5 minutes.
    req2 = report([sample("train", 0, 1, RankState.COMPUTE)], node="node-b", seq=2)
    req2.report.health.parts_left_out.extend(counts)
    d.ingest(req2, 400.0)
    (a,) = api.jobs_view(d, now=400.0)["agents"]
    assert a["left_out_seconds_ago"] == 390.0 and not a["faults_recent"]
