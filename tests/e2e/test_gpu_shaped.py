"""The GPU-shaped job (tests/workloads/gpu_shaped.py) is shaped as it says, with no
monitor watching: what the matrix rows and the benchmark build on (issue 26).

The kernel's own counts (/proc/self of each rank, over training, in its
train_end marker): outside its batch reads a rank makes no read/write syscalls
and its main thread no voluntary switches while its "device works" and it waits
for its peers; rank 0 alone writes (a line per step, a metrics file twice a
second). Steps are fixed work: a rank stopped for 3 s makes that step 3 s late.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import time

import pytest

from ncclwatch.model import STILL_EVENTS_PER_S
from tests.harness.jobs import Job
from tests.harness.paths import ROOT
from tests.harness.procs import Proc
from tests.harness.tools import need

pytestmark = pytest.mark.e2e

JOB = str(ROOT / "tests" / "workloads" / "gpu_shaped.py")
#: Voluntary switches per second of the main thread outside its batches, at most:
#: three quarters of the agent's still rate, so a quiet rank reads as still with room.
QUIET_PER_S = 0.75 * STILL_EVENTS_PER_S
STEP = re.compile(r"\[rank 0\] step (\d+) done t=[\d.]+ seconds=([\d.]+) work=(\d+)")


def _run(tmp_path, batch: str, *extra: str) -> Job:
    argv = [need("torchrun"), "--standalone", "--nproc-per-node=2", "--max-restarts=0", JOB,
            "--ckpt-dir", str(tmp_path), "--step-seconds", "2", "--batch", batch, *extra]
    return Job(Proc(argv, env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
                    name=f"gpu-shaped-{batch}"), 2)


def _steps(job: Job) -> list[tuple[int, float, int]]:
    return [(int(m.group(1)), float(m.group(2)), int(m.group(3)))
            for _, line in job.proc.lines if (m := STEP.search(line))]


def _end(job: Job, rank: int) -> dict:
    (m,) = [m for m in job.markers("train_end") if m["rank"] == rank]
    return {k: float(v) for k, v in m.items() if k not in ("rank", "pid")}


def test_reads_come_in_bursts_and_the_rest_is_silent(tmp_path) -> None:
    job = _run(tmp_path, "read", "--seconds", "12", "--eval-every", "3", "--eval-seconds", "1")
    try:
        job.wait_marker("done", 150, count=2)
        job.proc.popen.wait(30)
    finally:
        job.proc.stop()
    assert job.proc.popen.returncode == 0, job.proc.output()[-2000:]
    steps = len(_steps(job))
    r0, r1 = _end(job, 0), _end(job, 1)
    out = job.proc.output()[-1500:]
    assert r1["steps"] == r0["steps"] == steps >= 4, out
    # rank 1: exactly its batches' 20 reads a step (+ the two /proc reads of the count)
    assert 20 * steps <= r1["reads"] <= 20 * steps + 6, (r1, out)
    assert r1["writes"] <= 2, (r1, out)
    # (almost) no switch while the device works and the rank waits: a rare one when
    # the helper thread (rank 0: the metrics thread too) holds the GIL as the main
    # thread wants it back. Measured on the idle 2-core machine, 6 runs of this job:
    # 0-10 in 13 s (at most 0.72/s); under a CPU hog 14 in 13.3 s (a fresh-clone run).
    # The bound, 1.5/s, is three quarters of the agent's still rate (2/s), so a quiet
    # rank still reads as still.
    assert r1["quiet_switches"] <= max(4, QUIET_PER_S * r1["seconds"]), (r1, out)
    # rank 0: its batches and one per evaluation; writes: a line a step, metrics at 2/s
    evals = (steps - 1) // 3
    assert 20 * (steps + evals) <= r0["reads"] <= 20 * (steps + evals) + 6, (r0, out)
    assert r0["writes"] >= steps + 1.5 * r0["seconds"], (r0, out)
    assert r0["quiet_switches"] <= max(4, QUIET_PER_S * r0["seconds"]), (r0, out)
    assert (tmp_path / "metrics.json").read_text().startswith('{"step": ')


def test_a_stopped_rank_makes_its_step_late_and_mmap_batches_read_nothing(tmp_path) -> None:
    job = _run(tmp_path, "mmap", "--steps", "7")
    try:
        job.wait_marker("train_start", 150, count=2)
        rank1 = next(m["pid"] for m in job.markers("train_start") if m["rank"] == 1)
        deadline = time.time() + 60
        while len(_steps(job)) < 3 and time.time() < deadline:
            time.sleep(0.05)
        os.kill(rank1, signal.SIGSTOP)  # this test's own pause of its own rank
        time.sleep(3)
        os.kill(rank1, signal.SIGCONT)
        job.wait_marker("done", 120, count=2)
        job.proc.popen.wait(30)
    finally:
        job.proc.stop()
    out = job.proc.output()[-1500:]
    secs = [s for _, s, _ in _steps(job)]
    assert len(secs) == 7, out
    # the fixed work waited for the stopped rank: one step up to 3 s longer than
    # the others. Less when the stop fell while rank 1 already waited at the sync
    # for a slower rank 0 (that slack is not lost): a loaded CI run saw 2.1 s.
    assert max(secs) - statistics.median(secs) >= 1.5, (secs, out)
    r1 = _end(job, 1)
    assert r1["reads"] <= 6 and r1["writes"] <= 2, (r1, out)
