"""Why the agent looks at a GPU-shaped rank: its stack policy's triggers, counted.

    python -m bench.look_trace --step-seconds 8 --seconds 90

Runs tests/workloads/gpu_shaped.py (2 ranks, batches by read, rank 0 logging,
writing metrics twice a second and evaluating every 4 steps) and drives the
agent's own sampler (ProcessSampler), tracker (RankTracker) and stack policy
(StackPolicy.due) against it once a second, as the agent's round does, with
no py-spy: each look is counted by the reason that asked for it and the
stack is taken as compute. What the agent's CPU on such jobs is made of
(BENCHMARKS.md, "Agent overhead on GPU-shaped jobs"): each look is one
py-spy run.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ncclwatch.agent.discover import RankIdentity, RankProcess
from ncclwatch.agent.policy import StackPolicy
from ncclwatch.agent.sample import ProcessSampler
from ncclwatch.agent.tracker import RankTracker
from ncclwatch.model import RankState
from ncclwatch.signatures import Classification

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
START = re.compile(r"phase=train_start rank=(\d+) pid=(\d+)")


def reason(t: RankTracker, now: float, policy: StackPolicy) -> str:
    """The trigger that made ``policy.due`` pick ``t`` (policy.suspect_wait's order)."""
    if t.stack_at is None:
        return "first look"
    if t.quiet != t.quiet_at_last_dump:
        return "cpu went quiet or woke"
    if policy.still_news(t, now):
        return "still past its normal" if t.still else "resumed from a wait"
    if t.files_changed():
        return "file opened for writing"
    if now - t.stack_at >= policy.slow_interval:
        return "slow round"
    return "same wait again"


def trace(step_seconds: float, seconds: float, world: int = 2) -> dict:
    policy, sampler = StackPolicy(), ProcessSampler()
    with tempfile.TemporaryDirectory(prefix="ncclwatch-looks-") as ckpt:
        job = subprocess.Popen(
            [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={world}",
             "--max-restarts=0", str(ROOT / "tests" / "workloads" / "gpu_shaped.py"),
             "--ckpt-dir", ckpt, "--step-seconds", str(step_seconds), "--batch", "read",
             "--seconds", str(seconds + 60), "--eval-every", "4",
             "--eval-seconds", str(step_seconds / 2)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                 "PYTHONPATH": str(ROOT)})
        try:
            pids: dict[int, int] = {}
            for line in job.stdout:
                if m := START.search(line):
                    pids[int(m.group(1))] = int(m.group(2))
                    if len(pids) == world:
                        break
            if len(pids) < world:
                raise SystemExit(f"the job ended before training: {job.wait()}")
            threading.Thread(target=lambda: collections.deque(job.stdout, 0),
                             daemon=True).start()
            trackers = {}
            for rank, pid in pids.items():
                ident = RankIdentity(job_id="bench", rank=rank, local_rank=rank,
                                     world_size=world, job_source="bench",
                                     rank_source="env:RANK")
                trackers[rank] = RankTracker(RankProcess(pid=pid, create_time=0.0,
                                                         identity=ident, env={}),
                                             time.monotonic())
            looks: collections.Counter = collections.Counter()
            flips: collections.Counter = collections.Counter()
            t0 = time.monotonic()
            while (now := time.monotonic()) - t0 < seconds:
                for rank, t in trackers.items():
                    sample = sampler.sample(t.pid, with_files=True)
                    if sample is None:
                        raise SystemExit(f"rank {rank} is gone")
                    was = t.still
                    t.observe_process(sample, now)
                    flips[rank] += t.still != was
                for t in policy.due(trackers.values(), now):
                    looks[(t.proc.identity.rank, reason(t, now, policy))] += 1
                    t.observe_stack(Classification(RankState.COMPUTE), "compute", now)
                time.sleep(max(0.0, 1.0 - (time.monotonic() - now)))
        finally:
            os.killpg(job.pid, signal.SIGTERM)
            job.wait(30)
    return {"step_seconds": step_seconds, "seconds": seconds, "world": world,
            "looks": sum(looks.values()),
            "looks_by_rank_and_reason": {f"rank {r}: {why}": n
                                         for (r, why), n in sorted(looks.items())},
            "still_flips_by_rank": {f"rank {r}": n for r, n in sorted(flips.items())}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step-seconds", type=float, default=8.0)
    ap.add_argument("--seconds", type=float, default=90.0)
    a = ap.parse_args()
    print(json.dumps(trace(a.step_seconds, a.seconds), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
