"""A node owns only what it runs: claims cannot be squatted, nor ranks taken
by a younger process alone.

Reproduction: the first node to report rank N of a job owned it, and the
real node's reports of that rank were refused with FAILED_PRECONDITION; job
ids are guessable, so one node certificate could claim the ranks of a job
about to start and blind its real node. Here: a real daemon, real gRPC over
mTLS on loopback and two node certificates from the real ``ncclwatch certs``
for every case; the API and /metrics over real HTTP.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest

from ncclwatch import status
from ncclwatch.daemon.ownership import OUTCOMES, Contest, decide
from ncclwatch.model import RankState, StallKind
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.credentials import client, make_certs
from tests.harness.daemons import Harness
from tests.harness.monitor import metrics_at
from tests.harness.reports import checkpoint_job, report, sample

YEAR_AND_A_DAY = 31_622_400.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    base = tmp_path_factory.mktemp("pki")
    make_certs(base / "ca", "node-a", "node-b", "node-c", "node-d")
    return base


def _run(coro):
    return asyncio.run(coro)


def _job(node: str, agent: str, *, age: float, pid_base: int = 1000, seq: int = 1,
         timeout: float = 120.0, job: str = "job-1") -> pb.ReportRequest:
    """job-1's four ranks as ``node`` reports them, each process ``age`` s old."""
    req = checkpoint_job(job, node=node, agent=agent, seq=seq, timeout=timeout)
    for s in req.report.samples:
        s.identity.pid = pid_base + s.identity.rank
        s.identity.process_age_seconds = age
    return req


def _claims(h: Harness) -> dict[str, float]:
    m = metrics_at(h.server.http_port, "/metrics")
    return {dict(lab)["outcome"]: v for (n, lab), v in m.items()
            if n == "ncclwatch_daemon_rank_claims_total"}


def _api(h: Harness) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{h.server.http_port}/api/v1/jobs",
                                timeout=10) as r:
        return json.loads(r.read())


def _owners(h: Harness, job: str = "job-1") -> set[str]:
    return {r.node for r in h.daemon.table.jobs[job].ranks.values()}


def _listed(req: pb.ReportRequest, nodelist: str) -> pb.ReportRequest:
    """Every sample carries the job's Slurm node list in its environment."""
    for s in req.report.samples:
        if not s.HasField("job"):
            s.job.CopyFrom(pb.JobInfo(source="test"))
        s.job.env["SLURM_JOB_NODELIST"] = nodelist
    return req


async def _squatted(h: Harness, b, *, squatter_age: float, world: int = 4) -> None:
    """node-b guessed job-1's id and claims ranks 0-3 (processes
    ``squatter_age`` s old; 0: no start shown) before the job starts."""
    squat = checkpoint_job("job-1", world=world, node="node-b", agent="agent-b")
    del squat.report.samples[4:]
    for s in squat.report.samples:
        s.identity.pid = 9000 + s.identity.rank
        s.identity.process_age_seconds = squatter_age
    (resp,) = await h.send_over(h.secure(b), squat)
    assert not resp.rejected_jobs and _owners(h) == {"node-b"}


def _ranks(node: str, ranks: range, *, world: int = 8, seq: int = 1, age: float = 60.0,
           nodelist: str = "", pid_base: int = 1000) -> pb.ReportRequest:
    """job-1's ``ranks`` as ``node`` reports them (its agent ``agent-<x>``),
    stating ``nodelist`` as the job's Slurm node list where given."""
    req = checkpoint_job("job-1", world=world, node=node, agent="agent-" + node[-1], seq=seq)
    keep = [s for s in req.report.samples if s.identity.rank in ranks]
    del req.report.samples[:]
    req.report.samples.extend(keep)
    for s in req.report.samples:
        s.identity.pid = pid_base + s.identity.rank
        s.identity.process_age_seconds = age
    return _listed(req, nodelist) if nodelist else req


def test_a_squatter_before_the_job_starts_loses_to_the_scheduler_node_list(pki) -> None:
    """The squatter's claims came first: the real node's younger processes
    alone move nothing (never refused: set aside, uncorroborated). The job's
    Slurm node list, as the two nodes that run its other ranks state it, names
    node-a and not node-b: that corroborates node-a's claims, and node-b
    cannot take the ranks back, whatever processes it shows."""
    async def go():
        async with Harness(pki) as h:
            a, b = client(pki, "node-a"), client(pki, "node-b")
            await _squatted(h, b, squatter_age=600.0, world=8)
            job = h.daemon.table.jobs["job-1"]
            listed = "node-a,node-c,node-d"
            mine = _ranks("node-a", range(4), age=3.0)
            (resp,) = await h.send_over(h.secure(a), mine)
            assert not resp.rejected_jobs and _owners(h) == {"node-b"}
            assert (await asyncio.to_thread(_claims, h))["uncorroborated"] == 4
            # Ranks 4-7 were nobody's: node-c's and node-d's, who state the list.
            for n, ranks in (("node-c", range(4, 6)), ("node-d", range(6, 8))):
                (resp,) = await h.send_over(h.secure(client(pki, n)),
                                       _ranks(n, ranks, nodelist=listed, pid_base=2000))
                assert not resp.rejected_jobs
            # node-a's next round: the list the job's other nodes agree on corroborates it.
            mine.report.seq = 2
            (resp,) = await h.send_over(h.secure(a), mine)
            assert not resp.rejected_jobs
            assert {k: job.ranks[k].node for k in range(4)} == {k: "node-a" for k in range(4)}
            assert {job.ranks[k].pid for k in range(4)} == {1000, 1001, 1002, 1003}
            # node-b cannot win them back with "new" processes, nor with a list of its own.
            again = _listed(checkpoint_job("job-1", world=8, node="node-b", agent="agent-b",
                                           seq=2), "node-b")
            for s in again.report.samples:
                s.identity.pid = 9100 + s.identity.rank
                s.identity.process_age_seconds = 0.5
            (resp,) = await h.send_over(h.secure(b), again)
            assert not resp.rejected_jobs
            assert {k: job.ranks[k].node for k in range(4)} == {k: "node-a" for k in range(4)}
            assert job.env["SLURM_JOB_NODELIST"] == listed
            assert all(r.gone_at is None for r in job.ranks.values())  # b's full round
            claims = await asyncio.to_thread(_claims, h)
            assert claims["corroborated"] == 4 and claims["uncorroborated"] == 12
            assert set(claims) == set(OUTCOMES)
            # The conflict is shown: the API names both nodes for each rank...
            view = await asyncio.to_thread(_api, h)
            (j,) = view["jobs"]
            assert [c["rank"] for c in j["contested_ranks"]][:4] == [0, 1, 2, 3]
            c0 = j["contested_ranks"][0]
            assert c0["owner"]["host"] == "node-a" and c0["owner"]["pid"] == 1000
            assert [(x["host"], x["pid"]) for x in c0["contenders"]] == [("node-b", 9100)]
            # ... and so does `ncclwatch status`.
            text = status.render(view)
            assert "rank 0 also reported by node-b (pid 9100)" in text, text
    _run(go())


def test_a_node_cannot_corroborate_itself(pki) -> None:
    """Before, node-b took rank 4 nobody reported, stated the job's node list
    as naming itself (the job's environment its ranked member states), and
    with that list took node-a's live rank 0 as "corroborated". Now its own
    statement counts for nothing: the claim is set aside. A list two other
    nodes of the job state alike decides; one alone does not."""
    async def go():
        async with Harness(pki) as h:
            a, b = client(pki, "node-a"), client(pki, "node-b")
            await h.send_over(h.secure(a), _ranks("node-a", range(4), age=600.0))
            job = h.daemon.table.jobs["job-1"]
            # node-b takes rank 4 (nobody reports it), then states its own list.
            (resp,) = await h.send_over(h.secure(b), _ranks("node-b", range(4, 5), pid_base=9000))
            assert not resp.rejected_jobs and job.ranks[4].node == "node-b"
            (resp,) = await h.send_over(h.secure(b), _ranks("node-b", range(4, 5), seq=2,
                                                       nodelist="node-b", pid_base=9000))
            assert job.env["SLURM_JOB_NODELIST"] == "node-b"
            steal = _ranks("node-b", (0, 4), seq=3, age=0.5, nodelist="node-b", pid_base=9000)
            (resp,) = await h.send_over(h.secure(b), steal)
            assert not resp.rejected_jobs
            assert job.ranks[0].node == "node-a" and job.ranks[0].pid == 1000
            claims = await asyncio.to_thread(_claims, h)
            assert claims["corroborated"] == 0 and claims["uncorroborated"] == 1
            # One other node (node-c, rank 5) states a list naming node-b: not enough.
            c, d = client(pki, "node-c"), client(pki, "node-d")
            await h.send_over(h.secure(c), _ranks("node-c", range(5, 6), nodelist="node-b,node-c,"
                                             "node-d", pid_base=2000))
            steal.report.seq = 4
            await h.send_over(h.secure(b), steal)
            assert job.ranks[0].node == "node-a"
            # A second (node-d, rank 6) states the same: the job's other nodes agree.
            await h.send_over(h.secure(d), _ranks("node-d", range(6, 7), nodelist="node-d,node-c,"
                                             "node-b", pid_base=3000))
            steal.report.seq = 5
            (resp,) = await h.send_over(h.secure(b), steal)
            assert not resp.rejected_jobs
            assert job.ranks[0].node == "node-b" and job.ranks[0].pid == 9000
            assert (await asyncio.to_thread(_claims, h))["corroborated"] == 1
    _run(go())


def test_a_younger_process_does_not_take_a_live_nodes_rank(pki) -> None:
    """node-b claims node-a's ranks with younger processes (and a node list of
    its own making): before, ``restarted`` moved every rank to node-b. Now the
    claim is set aside while node-a reports; node-a's silence moves them."""
    async def go():
        async with Harness(pki) as h:
            h.daemon.table.staleness = 0.5
            a, b = client(pki, "node-a"), client(pki, "node-b")
            first = _job("node-a", "agent-a", age=600.0)
            first.report.interval_seconds = 0.1
            await h.send_over(h.secure(a), first)
            steal = _listed(_job("node-b", "agent-b", age=0.5, pid_base=9000), "node-b")
            (resp,) = await h.send_over(h.secure(b), steal)
            assert not resp.rejected_jobs and _owners(h) == {"node-a"}
            assert (await asyncio.to_thread(_claims, h))["uncorroborated"] == 4
            await asyncio.sleep(1.0)                      # node-a goes silent
            steal.report.seq = 2
            (resp,) = await h.send_over(h.secure(b), steal)
            assert _owners(h) == {"node-b"}
            assert (await asyncio.to_thread(_claims, h))["owner_silent"] == 4
    _run(go())


def test_a_claim_never_blocks_the_node_that_runs_the_rank(pki) -> None:
    """Evidence that does not decide (no process age): the owner keeps the rank,
    the other node's samples are set aside, never refused, and the rank moves
    the moment the owner's reports of it stop."""
    async def go():
        async with Harness(pki) as h:
            h.daemon.table.staleness = 0.5
            a, b = client(pki, "node-a"), client(pki, "node-b")
            squat = _job("node-b", "agent-b", age=0.0, pid_base=9000)
            squat.report.interval_seconds = 0.1          # stale 0.5 s after its last report
            await h.send_over(h.secure(b), squat)
            other = sample("job-ok", 0, 1, RankState.COMPUTE)
            req = _job("node-a", "agent-a", age=0.0)
            req.report.samples.append(other)
            (resp,) = await h.send_over(h.secure(a), req)
            assert not resp.rejected_jobs                      # nothing refused
            assert h.daemon.table.jobs["job-ok"].ranks[0].node == "node-a"
            assert _owners(h) == {"node-b"}
            assert not h.daemon.rejected_total and not h.daemon.rejected_jobs_total
            assert (await asyncio.to_thread(_claims, h))["kept"] == 4
            # node-b goes silent: node-a's next report takes every rank.
            await asyncio.sleep(1.0)
            (resp,) = await h.send_over(h.secure(a), _job("node-a", "agent-a", age=0.0, seq=2))
            assert not resp.rejected_jobs and _owners(h) == {"node-a"}
            assert (await asyncio.to_thread(_claims, h))["owner_silent"] == 4
    _run(go())


def test_job_facts_come_only_from_the_owners_and_a_timeout_change_is_shown(pki) -> None:
    async def go():
        async with Harness(pki) as h:
            a, b = client(pki, "node-a"), client(pki, "node-b")
            await h.send_over(h.secure(a), _job("node-a", "agent-a", age=30.0, timeout=120.0))
            # node-b claims rank 0 (an older process: kept by node-a) with a
            # year-long watchdog and a Flight Recorder timeout to match.
            m = sample("job-1", 0, 4, RankState.COMPUTE, pid=666, timeout=YEAR_AND_A_DAY)
            m.identity.process_age_seconds = 3600.0
            m.flight_recorder.CopyFrom(pb.FlightRecorderSummary(version="2.4", groups=[
                pb.ProcessGroupProgress(pg_id="0", pg_name="0", pg_desc="default_pg",
                                        ranks=[0, 1, 2, 3], pending_seq=1,
                                        pending_timeout_ms=int(YEAR_AND_A_DAY * 1000))]))
            # A rank-less member on node-b (which owns no ranked member) tries too.
            r = sample("job-1", -1, 4, RankState.COMPUTE, pid=667, timeout=YEAR_AND_A_DAY)
            (resp,) = await h.send_over(h.secure(b), report([m, r], node="node-b", agent="agent-b"))
            assert not resp.rejected_jobs
            job = h.daemon.table.jobs["job-1"]
            assert job.declared_timeout == 120.0 and job.fr_timeout == 0.0
            assert not job.timeout_changes
            assert h.daemon.budget_of("job-1", time.monotonic()).timeout == 120.0
            # The owner itself changes the timeout: applied, logged and shown.
            await h.send_over(h.secure(a), _job("node-a", "agent-a", age=31.0, seq=2, timeout=600.0))
            assert job.declared_timeout == 600.0
            view = await asyncio.to_thread(_api, h)
            (ch,) = view["jobs"][0]["timeout_changes"]
            assert (ch["timeout"], ch["from_seconds"], ch["to_seconds"], ch["host"]) == \
                ("job", 120.0, 600.0, "node-a")
            text = status.render(view)
            assert "job timeout changed from 120s to 600s (node-a, rank 0)" in text, text
    _run(go())


def test_the_rules_table() -> None:
    """Each rule of ownership.RULES, and that the table decides every case:
    a later process start alone never moves a rank."""
    old, new = 100.0, 200.0
    cases = [
        (Contest(False, old, None, False), ("owner_silent", True)),
        (Contest(False, new, old, True), ("owner_silent", True)),
        (Contest(True, old, new, False), ("uncorroborated", False)),
        (Contest(True, old, new, False, True), ("corroborated", True)),
        (Contest(True, new, old, False, True), ("corroborated", True)),
        (Contest(True, old, new, True, True), ("retake_refused", False)),
        (Contest(True, old, new, True), ("uncorroborated", False)),
        (Contest(True, new, old, False), ("kept", False)),
        (Contest(True, old, old + 1.0, False), ("kept", False)),   # within START_SLACK
        (Contest(True, None, new, False), ("uncorroborated", False)),
        (Contest(True, None, None, False), ("kept", False)),       # nothing to compare
        (Contest(True, old, None, False), ("kept", False)),
    ]
    for contest, expected in cases:
        assert decide(contest) == expected, contest


def test_a_claim_in_a_report_left_out_moves_nothing(pki) -> None:
    """Claims in samples of a job the report is left out for (another world
    size, older processes: no evidence of a resize) take nothing over and leave
    no contender behind."""
    async def go():
        async with Harness(pki) as h:
            a, b = client(pki, "node-a"), client(pki, "node-b")
            await h.send_over(h.secure(a), _job("node-a", "agent-a", age=60.0))
            bad = checkpoint_job("job-1", world=8, node="node-b", agent="agent-b")
            for s in bad.report.samples:
                s.identity.process_age_seconds = 3600.0
            (resp,) = await h.send_over(h.secure(b), bad)
            assert [(j.job_id, j.code) for j in resp.rejected_jobs] == \
                [("job-1", "FAILED_PRECONDITION")]
            assert _owners(h) == {"node-a"}
            assert not h.daemon.ownership.ranks_of("job-1")
            assert not any(h.daemon.ownership.claims_total.values())
    _run(go())


def test_a_node_cannot_shrink_another_nodes_job(pki) -> None:
    """Before, node-b's report of job-1 at world size 1 with younger processes
    resized node-a's live job to one rank, and node-a's own reports of it were
    refused from then on. Now it is left out; node-a's reports apply."""
    async def go():
        async with Harness(pki) as h:
            a, b = client(pki, "node-a"), client(pki, "node-b")
            await h.send_over(h.secure(a), _job("node-a", "agent-a", age=600.0))
            shrink = _listed(checkpoint_job("job-1", world=1, node="node-b", agent="agent-b"),
                             "node-b")
            for s in shrink.report.samples:
                s.identity.process_age_seconds = 0.5
                s.identity.pid += 8000
            (resp,) = await h.send_over(h.secure(b), shrink)
            assert [(j.job_id, j.code) for j in resp.rejected_jobs] == \
                [("job-1", "FAILED_PRECONDITION")]
            job = h.daemon.table.jobs["job-1"]
            assert job.world_size == 4 and _owners(h) == {"node-a"} and len(job.ranks) == 4
            (resp,) = await h.send_over(h.secure(a), _job("node-a", "agent-a", age=601.0, seq=2))
            assert not resp.rejected_jobs and job.world_size == 4
            assert (await asyncio.to_thread(_claims, h))["uncorroborated"] == 1
    _run(go())


def test_a_squatter_with_another_world_size_does_not_keep_the_job(pki) -> None:
    """A job id guessed first with another world size: the job that runs under
    it is left out (never taken on its younger processes alone) while the
    squatter reports, and taken at its own size when the job's node list
    corroborates it or the squatter goes silent; the squatter cannot size it
    back."""
    async def go():
        async with Harness(pki) as h:
            h.daemon.table.staleness = 0.5
            a, b = client(pki, "node-a"), client(pki, "node-b")
            squat = checkpoint_job("job-1", world=2, node="node-b", agent="agent-b")
            squat.report.interval_seconds = 0.1
            for s in squat.report.samples:
                s.identity.process_age_seconds = 900.0
                s.identity.pid += 8000
            await h.send_over(h.secure(b), squat)
            job = h.daemon.table.jobs["job-1"]
            (resp,) = await h.send_over(h.secure(a), _job("node-a", "agent-a", age=5.0))
            assert [j.job_id for j in resp.rejected_jobs] == ["job-1"]
            assert job.world_size == 2
            await asyncio.sleep(1.0)                      # the squatter goes silent
            (resp,) = await h.send_over(h.secure(a), _job("node-a", "agent-a", age=6.0, seq=2))
            assert not resp.rejected_jobs
            assert job.world_size == 4 and _owners(h) == {"node-a"}
            # node-b tries its world size again with "new" processes: left out.
            again = checkpoint_job("job-1", world=2, node="node-b", agent="agent-b", seq=2)
            for s in again.report.samples:
                s.identity.process_age_seconds = 0.5
            (resp,) = await h.send_over(h.secure(b), again)
            assert [(j.job_id, j.code) for j in resp.rejected_jobs] == \
                [("job-1", "FAILED_PRECONDITION")]
            assert job.world_size == 4 and _owners(h) == {"node-a"}
            h.daemon.tick()
            assert ("job-1", StallKind.CHECKPOINT_GATHER) in h.daemon.incidents.active
    _run(go())


def test_slurm_node_lists_and_what_corroborates() -> None:
    from ncclwatch.daemon.schednodes import corroborates, expand

    assert expand("gpu[001-003,010],login1") == {"gpu001", "gpu002", "gpu003", "gpu010",
                                                 "login1"}
    assert expand("r[1-2]-n[8-9]") == {"r1-n8", "r1-n9", "r2-n8", "r2-n9"}
    assert expand("gpu[1-99999999]") is None and expand("gpu[a-b]") is None
    lst, other = expand("gpu[01-02]"), expand("gpu07")
    assert corroborates({"gpu03": lst, "gpu04": lst}, "gpu02", ["gpu07"])
    assert not corroborates({"gpu03": lst, "gpu04": lst}, "gpu02", ["gpu01"])  # owner listed
    assert not corroborates({"gpu03": lst}, "gpu02", ["gpu07"])        # one witness alone
    assert not corroborates({"gpu02": lst, "gpu03": lst}, "gpu02", ["gpu07"])  # its own word
    # Two agree, but most of the nodes that state a list say otherwise.
    assert not corroborates({"gpu03": lst, "gpu04": lst, "gpu05": other, "gpu06": other,
                             "gpu08": other}, "gpu02", ["gpu07"])
    assert not corroborates({"gpu03": lst, "gpu04": None}, "gpu02", ["gpu07"])
