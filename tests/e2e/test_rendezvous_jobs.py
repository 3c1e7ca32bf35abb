"""End to end: jobs no launcher names, found by their rendezvous.

Three ranks of ``ncclwatch.demo.job`` started by a real shell loop, each
with ``--init-method URL --rank I --world-size 3`` and an environment with no
rank, rendezvous or scheduler variable: once with a ``tcp://`` TCPStore on
loopback, once with a ``file://`` store. The job shows as ``store:...`` /
``file:...``, every rank numbered with its source (rank 0 as the store's
server on tcp://, the others from their own ``--rank``, corroborated), and
rank 1's slow save is a checkpoint_gather stall naming rank 1 (the goal,
10 s from the save's start, is printed).
"""

from __future__ import annotations

import os
import shlex
import sys
import time

import pytest

from tests.harness.artifacts import record
from tests.harness.jobs import Job
from tests.harness.procs import Proc, free_port

pytestmark = pytest.mark.e2e

DETECT_WITHIN = 45.0
SCRUB = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK")
SCRUB_PREFIXES = ("MASTER_", "SLURM_", "TORCHELASTIC_", "PMI_", "PMIX_", "OMPI_", "RAY_", "PET_")


def _scrubbed() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in SCRUB and not k.startswith(SCRUB_PREFIXES)}


def _loop(url: str, tmp) -> Job:
    one = " ".join(shlex.quote(a) for a in [
        sys.executable, "-m", "ncclwatch.demo.job", "--scenario", "slow-save",
        "--saver", "1", "--save-seconds", "60", "--pg-timeout", "120",
        "--ckpt-dir", str(tmp), "--init-method", url])
    script = f"for i in 0 1 2; do {one} --rank $i --world-size 3 & done; wait"
    env = {**_scrubbed(), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    # env -i: the loop sees exactly the scrubbed environment (Proc adds ours).
    proc = Proc(["env", "-i", *(f"{k}={v}" for k, v in env.items()), "bash", "-c", script],
                name="shell-loop")
    return Job(proc, 3)


@pytest.mark.parametrize("scheme", ["tcp", "file"])
def test_a_shell_loop_job_is_found_by_its_rendezvous(ncclwatch_run, tmp_path, scheme) -> None:
    url = (f"tcp://127.0.0.1:{free_port()}" if scheme == "tcp"
           else f"file://{tmp_path}/rdzv")
    mon = ncclwatch_run("--interval", "0.5")
    job = _loop(url, tmp_path)
    try:
        ready = job.wait_marker("ready", 90, count=3)
        pids = {m["pid"]: m["rank"] for m in ready}
        deadline = time.time() + 60
        found = None
        while time.time() < deadline:
            found = mon.job_of(set(pids))
            live = [r for r in (found or {}).get("ranks", []) if r["pid"] in pids]
            if len(live) == 3 and all(r["rank"] is not None for r in live):
                break
            time.sleep(0.5)
        assert found is not None, mon.output()[-4000:]
        prefix = "store:" if scheme == "tcp" else "file:"
        assert found["job"].startswith(prefix), found["job"]
        ranks = {r["pid"]: (r["rank"], r["identified_by"]) for r in found["ranks"]
                 if r["pid"] in pids}
        want = {pid: rank for pid, rank in pids.items()}
        assert {pid: r for pid, (r, _) in ranks.items()} == want, ranks
        for pid, (rank, source) in ranks.items():
            if scheme == "tcp" and rank == 0:
                # the store's server, or its own --rank corroborated by the others
                # when the round that first numbered them did not see its listening
                # socket yet (a rank keeps the number it was first given; once seen
                # under a CPU hog); both are the job's own facts and agree
                assert source in ("tcpstore_server", "args:--rank"), ranks
            else:
                assert source == "args:--rank", ranks
        saves = job.wait_marker("save_start", 120)
        started = saves[0]["t"]
        stall = mon.wait_stall(set(pids), "checkpoint_gather", started + DETECT_WITHIN + 30)
        assert stall is not None, mon.output()[-4000:]
        seen = time.time() - started
        assert [c["rank"] for c in stall["culprits"]] == [1], stall["culprits"]
        record(f"rendezvous_{scheme}", {"job": found["job"], "detect_seconds": round(seen, 1),
                                        "goal_seconds": 10})
        assert seen < DETECT_WITHIN + 30
    finally:
        job.proc.stop()
