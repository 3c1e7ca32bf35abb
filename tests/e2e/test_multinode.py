"""One job across two "nodes": two agents, each owning half of the ranks.

The daemon merges a job's ranks from every agent; the verdict must be the
one a single agent gives (culprit rank 2, on the second node). Then the
second node's agent disappears: its ranks become unknown, never culprits,
and the stall turns into rank_lost naming them.
"""

from __future__ import annotations

import time

import pytest

from tests.e2e.test_checkpoint_stall import _job_id

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
    job_id = _job_id(mon, pids)
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
