"""Sharding jobs across daemons: 2 shards x 2 replicas, two real jobs, one page each.

Four real daemons: shard 0 and shard 1, each a highly available pair (a, b),
each told the shard map (``--shards``, ``--shard``). One real agent reports
to all of them (``--collector 0a,0b;1a,1b``). Two real torch jobs, with job
ids that hash to different shards, each stall with rank 0 in a checkpoint
that outlasts its 60 s process-group timeout. A real Prometheus scrapes the
four daemons (targets labelled ``shard`` and ``replica``) with the shipped
rules; a real Alertmanager with the shipped routing sends to this test's
webhook. Each job must live on both daemons of its own shard and on no
other, both stalls must be found, each job must page exactly once, every
daemon must hear the node, and ``ncclwatch status`` against one daemon must
show both jobs.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from ncclwatch.shard import shard
from tests.harness.alerting import Webhook, query, start_alerting
from tests.harness.artifacts import keep, record, stop_keeping_logs
from tests.harness.browser import run_chromium
from tests.harness.monitor import Monitor, job_id_of, wait_healthy
from tests.harness.procs import Proc, free_port
from tests.harness.tools import need

pytestmark = pytest.mark.e2e

PG_TIMEOUT = 60
PAGE = "NCCLWatchStallAtRisk"
SHARDS, REPLICAS = 2, ("a", "b")


def _job_ids() -> list[str]:
    """One job id per shard: the first ``shard-e2e-N`` that hash there."""
    out: dict[int, str] = {}
    i = 0
    while len(out) < SHARDS:
        out.setdefault(shard(f"shard-e2e-{i}", SHARDS), f"shard-e2e-{i}")
        i += 1
    return [out[k] for k in range(SHARDS)]


@pytest.fixture
def sharded(tmp_path):
    """Four daemons as two shards of pairs, one agent, Prometheus, Alertmanager."""
    procs: list[Proc] = []
    hook = Webhook()
    ports = {(s, r): (free_port(), free_port()) for s in range(SHARDS) for r in REPLICAS}
    urls = ";".join(",".join(f"http://127.0.0.1:{ports[s, r][1]}" for r in REPLICAS)
                    for s in range(SHARDS))
    mons = {}
    for (s, r), (grpc_port, http_port) in ports.items():
        p = Proc([need("ncclwatch"), "daemon", "--grpc", f"127.0.0.1:{grpc_port}",
                  "--http", f"127.0.0.1:{http_port}", "--shards", urls, "--shard", str(s)],
                 name=f"ncclwatch-daemon-{s}{r}")
        procs.append(p)
        mons[s, r] = Monitor([p], f"http://127.0.0.1:{http_port}")
    for m in mons.values():
        wait_healthy(m)
    collector = ";".join(",".join(f"127.0.0.1:{ports[s, r][0]}" for r in REPLICAS)
                         for s in range(SHARDS))
    procs.append(Proc([need("ncclwatch"), "agent", "--collector", collector],
                      name="ncclwatch-agent-sharded"))
    # docs/scaling.md#sharding-jobs-across-daemons: a `shard` and a `replica` label.
    prom, _ = start_alerting(tmp_path, hook, [{"job_name": "ncclwatch", "static_configs": [
        {"targets": [f"127.0.0.1:{ports[s, r][1]}"], "labels": {"shard": str(s), "replica": r}}
        for s in range(SHARDS) for r in REPLICAS]}],
        procs, suffix="-sharded", group_wait="2s", group_interval="5s")
    yield mons, prom, hook
    hook.server.shutdown()
    stop_keeping_logs(procs)
    keep("alertmanager-webhook-sharded.json", json.dumps(hook.notifications, indent=1))


def _pages(hook: Webhook, job_id: str) -> list[dict]:
    return [n for n in hook.notifications if n["path"] == "/pager"
            and n["groupLabels"].get("alertname") == PAGE
            and n["groupLabels"].get("job_id") == job_id]


def test_two_shards_of_pairs_each_judge_their_own_job_and_page_once(sharded, torch_job,
                                                                   tmp_path) -> None:
    t0 = time.time()
    mons, prom, hook = sharded
    ids = _job_ids()
    jobs = [torch_job("slow-save", 2, {"NCCLWATCH_PG_TIMEOUT_S": str(PG_TIMEOUT),
                                       "NCCLWATCH_JOB_ID": job_id},
                      "--model-mb", "16", "--save-seconds", "150",
                      "--pg-timeout", str(PG_TIMEOUT)) for job_id in ids]
    for job in jobs:
        job.wait_marker("ready", timeout=120, count=2)
    for s, (job, job_id) in enumerate(zip(jobs, ids)):
        for r in REPLICAS:  # both daemons of the owner judge the job
            assert job_id_of(mons[s, r], job.pids()) == job_id
    t_save = max(job.wait_marker("save_start", timeout=120)[0]["t"] for job in jobs)

    # Each job pages once, from its own shard.
    deadline = t_save + PG_TIMEOUT - 10
    while time.time() < deadline and not all(_pages(hook, j) for j in ids):
        assert all(job.proc.alive() for job in jobs), [j.proc.output()[-2000:] for j in jobs]
        time.sleep(0.5)
    found = {j: bool(_pages(hook, j)) for j in ids}
    assert all(found.values()), f"pages: {found}; webhook got {hook.notifications}"
    t_page = time.time()
    for s, job_id in enumerate(ids):
        other = 1 - s
        for r in REPLICAS:
            m = mons[s, r].metrics()
            assert m.get(("ncclwatch_stall_active", (("job_id", job_id),
                                                     ("kind", "checkpoint_gather")))) == 1
            assert job_id not in {j["job"] for j in mons[other, r].jobs()["jobs"]}
        series = query(prom, f'ncclwatch_stall_active{{job_id="{job_id}"}} == 1')
        assert sorted((x["metric"]["shard"], x["metric"]["replica"]) for x in series) == \
            [(str(s), "a"), (str(s), "b")], series
    # Every daemon hears the node, jobs or not.
    for (s, r), mon in mons.items():
        agents = mon.jobs()["agents"]
        assert len(agents) == 1 and agents[0]["connected"] and agents[0]["ranks_watched"] >= 4, \
            ((s, r), agents)
    # One daemon that knows the map: status shows both jobs, each on its shard.
    out = subprocess.run([need("ncclwatch"), "status", "--daemon", mons[0, "b"].http],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for s, job_id in enumerate(ids):
        row = next(line for line in out.stdout.splitlines() if line.startswith(job_id + " "))
        assert "checkpoint_gather" in row and row.rstrip().endswith(f" {s}"), row
    html = mons[0, "a"].get("/")
    assert f"href='{mons[1, 'a'].http}/'>1</a>" in html
    # An alert's link to shard 1's job on shard 0's page (the rules take the first
    # daemon's URL) ends on the owner's page, in a real browser.
    dom = run_chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom",
                   f"{mons[0, 'a'].http}/#job-{ids[1]}")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert f"id=\"job-{ids[1]}\"" in dom.stdout, dom.stdout[-3000:]

    time.sleep(8)  # past a group_interval: a duplicate would have arrived by now
    for job_id in ids:
        pages = _pages(hook, job_id)
        assert [n["status"] for n in pages] == ["firing"], pages
        assert len(pages[0]["alerts"]) == 1, pages[0]["alerts"]  # the pair deduplicated
        labels = pages[0]["alerts"][0]["labels"]
        assert labels["job_id"] == job_id and "replica" not in labels \
            and "instance" not in labels, labels
    record("sharded_pages", {"page_after_save_start_s": round(t_page - t_save, 1),
                             "test_wall_s": round(time.time() - t0, 1)})
