"""One job across two "nodes": two agents, each owning half of the ranks.

Also an MPICH job started on two hosts, which no variable names as one job.

The daemon merges a job's ranks from every agent; the verdict must be the
one a single agent gives (culprit rank 2, on the second node). Then the
second node's agent disappears: its ranks become unknown, never culprits,
and the stall turns into rank_lost naming them.
"""

from __future__ import annotations

import sys
import time

import psutil
import pytest

from tests.harness.artifacts import record
from tests.harness.jobs import Job
from tests.harness.monitor import job_id_of
from tests.harness.paths import ROOT
from tests.harness.procs import Proc, free_port
from tests.harness.tools import need, need_system

pytestmark = pytest.mark.e2e

PG_TIMEOUT = 90


def _stalls(mon, pids) -> dict[str, dict]:
    view = mon.job_of(pids)
    return {s["kind"]: s for s in (view or {}).get("stalls", [])}


def test_two_agents_merge_one_job_and_losing_one_is_rank_lost(ncclwatch_split, torch_job):
    mon = ncclwatch_split(("--node", "node-a", "--ranks", "0-1"),
                          ("--node", "node-b", "--ranks", "2-3"))
    job = torch_job("slow-save", 4, {"NCCLWATCH_PG_TIMEOUT_S": str(PG_TIMEOUT)},
                    "--model-mb", "8", "--saver", "2", "--save-seconds", "150",
                    "--pg-timeout", str(PG_TIMEOUT))
    job.wait_marker("ready", timeout=120, count=4)
    pids = job.pids()
    job_id = job_id_of(mon, pids)
    view = mon.job_of(pids)
    assert view["nodes"] == ["node-a", "node-b"]
    assert {r["rank"]: r["host"] for r in view["ranks"]} == {
        0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}
    job.wait_marker("save_start", timeout=120)
    # The stall can open before the last waiter's next stack is taken (stacks
    # lag /proc): wait for the full picture, as an operator would refresh.
    deadline = time.time() + 40
    stall = None
    while time.time() < deadline:
        stall = _stalls(mon, pids).get("checkpoint_gather")
        if stall and stall["waiting"]["ranks"] == [0, 1, 3]:
            break
        time.sleep(0.5)
    assert stall, mon.get("/api/v1/jobs")[:3000]
    assert [(c["rank"], c["host"], c["state"]) for c in stall["culprits"]] == [
        (2, "node-b", "saving")]
    assert stall["waiting"]["ranks"] == [0, 1, 3]
    assert stall["watchdog"]["timeout_seconds"] == PG_TIMEOUT

    agent_b = mon.procs[2]
    assert "--ranks" in agent_b.popen.args and "2-3" in agent_b.popen.args
    agent_b.stop()
    deadline = time.time() + 60
    while time.time() < deadline and "rank_lost" not in _stalls(mon, pids):
        time.sleep(0.5)
    stalls = _stalls(mon, pids)
    lost = stalls.get("rank_lost")
    assert lost, mon.get("/api/v1/jobs")[:3000]
    assert lost["unknown_ranks"] == [2, 3]
    assert lost["culprits"] == []
    assert lost["diagnosis"]["root_cause"] == "agent_silent"
    assert "checkpoint_gather" not in stalls  # its culprit is no longer seen: no guess
    m = mon.metrics()
    assert m[("ncclwatch_ranks", (("job_id", job_id), ("state", "unknown")))] == 2
    assert m[("ncclwatch_agent_up", (("node", "node-b"),))] == 0
    assert m[("ncclwatch_agent_up", (("node", "node-a"),))] == 1


def test_an_mpich_job_across_two_nodes_is_one_job(ncclwatch_split, tmp_path) -> None:
    """MPICH (hydra, Debian's package) puts no job id in the ranks' environment.
    Started on two hosts (``-launcher fork -hosts localhost,127.0.0.1``: one
    ``hydra_pmi_proxy`` per host, as across two nodes), each node's agent
    names the job by hydra's control port and process group, which every
    proxy is told: one job, rank 0 (node-a) saving, named within 10 s."""
    need("py-spy")
    mon = ncclwatch_split(("--node", "node-a", "--ranks", "0"),
                          ("--node", "node-b", "--ranks", "1"))
    go = tmp_path / "go"
    argv = [need_system("mpiexec.mpich", "mpich"), "-launcher", "fork",
            "-hosts", "localhost,127.0.0.1", "-ppn", "1", "-n", "2", sys.executable, "-m",
            "tests.workloads.launch_job", "--go", str(go), "--dir", str(tmp_path),
            "--save-seconds", "40", "--pg-timeout", "75", "--how", "mpi",
            "--port", str(free_port())]
    job = Job(Proc(argv, env={"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
                              "OMP_NUM_THREADS": "1"}, name="mpich-two-hosts"), 2)
    try:
        ready = job.wait_marker("ready", 240, count=2)
        pids = {m["rank"]: m["pid"] for m in ready}
        proxies = {p.ppid() for p in map(psutil.Process, pids.values())}
        assert len(proxies) == 2, "one hydra proxy per host"
        deadline, view = time.time() + 60, None
        while time.time() < deadline:
            jobs = [j for j in mon.jobs()["jobs"]
                    if set(pids.values()) & {r["pid"] for r in j["ranks"] if not r["gone"]}]
            if len(jobs) == 1 and {(r["rank"], r["host"]) for r in jobs[0]["ranks"]} == {
                    (0, "node-a"), (1, "node-b")}:
                view = jobs[0]
                break
            time.sleep(0.3)
        assert view is not None, f"not one job: {mon.get('/api/v1/jobs')[:3000]}"
        assert view["job"].startswith("launcher:hydra/"), view["job"]
        go.touch()
        save = job.wait_marker("save_start", 60)[0]
        stall, deadline = None, save["t"] + 30
        while time.time() < deadline and stall is None:
            stall = _stalls(mon, set(pids.values())).get("checkpoint_gather")
            if stall is None:
                time.sleep(0.25)
        delay = time.time() - save["t"]
        assert stall is not None, mon.get("/api/v1/jobs")[:3000]
        print(f"\nmpich across two nodes: found {delay:.1f}s after the save began (goal 10s"
              f"{'' if delay <= 10 else ': MISSED'})", file=sys.__stdout__, flush=True)
        assert [(c["rank"], c["host"], c["state"]) for c in stall["culprits"]] == [
            (0, "node-a", "saving")]
        record("mpich_two_nodes", {"detection_delay_s": round(delay, 2), "job": view["job"]})
        # The wide margin (the loop's own 30 s): the 10 s goal is printed above.
        assert delay <= 30.0, f"named {delay:.1f}s after the save began"
    finally:
        job.proc.stop()
