"""One rank's deep stack never blinds its node (real agent, daemon, py-spy).

A real process recursing 4,000 frames deep (py-spy reads up to 4,096; at
5,000 it fails on the rank and no stack is taken at all) beside a real stalled gloo job
(rank 0 sleeps, rank 1 waits in a barrier), watched by ``ncclwatch run``:
the daemon keeps receiving both jobs (it refused the node's whole report
every round while the deep rank sat in its stack), and the deep rank's stack
arrives trimmed (innermost and outermost frames, a marker between).
"""

from __future__ import annotations

import os
import sys
import time

import pytest

from tests.harness.paths import ROOT
from tests.harness.procs import Proc, free_port
from tests.harness.tools import py_spy_available

pytestmark = pytest.mark.e2e

WORKLOAD = str(ROOT / "tests" / "workloads" / "blind_jobs.py")


def _env(job: str, rank: int, world: int, port: int) -> dict[str, str]:
    return {**os.environ, "NCCLWATCH_JOB_ID": job, "RANK": str(rank), "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def test_a_deep_stack_leaves_the_other_job_watched(ncclwatch_run) -> None:
    py_spy_available()
    # This checkout's code, whichever checkout the venv's console script names.
    mon = ncclwatch_run("--interval", "1", env={"PYTHONPATH": str(ROOT)})
    port = free_port()
    procs = [Proc([sys.executable, WORKLOAD, "deep"],
                  env={**_env("deep-job", 0, 1, free_port()), "BLIND_DEPTH": "4000"}, name="deep"),
             *(Proc([sys.executable, WORKLOAD, "stall", str(r)], env=_env("stall-job", r, 2, port),
                    name=f"stall-{r}") for r in (0, 1))]
    try:
        deadline, jobs = time.time() + 75, {}
        while time.time() < deadline:
            jobs = {j["job"]: j for j in mon.jobs()["jobs"]}
            m = mon.metrics()
            trimmed = sum(v for (n, _), v in m.items()
                          if n == "ncclwatch_agent_stacks_trimmed_total")
            deep = jobs.get("deep-job", {}).get("ranks", [])
            stall = {r["rank"]: r for r in jobs.get("stall-job", {}).get("ranks", [])}
            if trimmed >= 1 and deep and deep[0].get("stack_id") and \
                    stall.get(1, {}).get("state") == "collective":
                break
            time.sleep(2)
        else:
            pytest.fail(f"jobs seen: {sorted(jobs)}; {jobs}\n"
                        + "\n".join(p.output()[-2000:] for p in procs) + mon.output()[-4000:])
        assert set(stall) == {0, 1} and stall[1].get("op") in ("barrier", None)
        refused = sum(v for (n, _), v in m.items()
                      if n == "ncclwatch_daemon_rejected_reports_total")
        hits = {dict(lbl).get("bound"): v for (n, lbl), v in m.items()
                if n == "ncclwatch_daemon_bound_hits_total"}
        assert refused == 0 and hits.get("stack_frames", 0) == 0   # trimmed at the agent
    finally:
        for p in procs:
            p.stop()
