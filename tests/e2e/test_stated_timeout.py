"""End to end: a job that states its process-group timeout only on its command
line, in a framework's syntax (Megatron-LM's ``--distributed-timeout-minutes``),
shows that timeout and its source in the daemon's API, not the assumed 600 s.

Real torchrun, a real 2-rank gloo job whose script passes the option to
``init_process_group`` and nothing else, real agent (discovery reads the
rank's command line) and daemon (``ncclwatch run``), real gRPC.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.harness.procs import Proc
from tests.harness.tools import need

pytestmark = pytest.mark.e2e

READY = re.compile(r"ready pid=(\d+)")

SCRIPT = """
import argparse, os, time
from datetime import timedelta
import torch.distributed as dist
p = argparse.ArgumentParser()
p.add_argument("--distributed-timeout-minutes", type=int, default=10)
args = p.parse_args()
dist.init_process_group("gloo", timeout=timedelta(minutes=args.distributed_timeout_minutes))
dist.barrier()
print(f"[rank {dist.get_rank()}] ready pid={os.getpid()}", flush=True)
time.sleep(120)
"""


def test_megatron_minutes_on_the_command_line_are_the_jobs_timeout(ncclwatch_run, tmp_path):
    mon = ncclwatch_run()                      # daemon default 600 s
    script = tmp_path / "pretrain_gpt.py"
    script.write_text(SCRIPT)
    job = Proc([need("torchrun"), "--standalone", "--nproc-per-node=2", "--max-restarts=0",
                str(script), "--distributed-timeout-minutes", "2"],
               env={"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}, name="torchrun-megatron")
    try:
        # Wide margins: under a CPU hog two ranks importing torch take a while.
        deadline = time.time() + 150
        while time.time() < deadline and len(READY.findall(job.output())) < 2:
            assert job.alive(), job.output()[-3000:]
            time.sleep(0.2)
        # Two ranks share torchrun's stdout: their lines may run together.
        pids = {int(p) for p in READY.findall(job.output())}
        assert len(pids) == 2, job.output()[-3000:]
        watchdog, j = None, None
        deadline = time.time() + 60
        while time.time() < deadline:
            j = mon.job_of(pids)
            if j is not None and j["ranks_reporting"] == 2:
                watchdog = j["watchdog"]
                if watchdog["timeout_source"] != "default":
                    break
            time.sleep(0.3)
        assert watchdog is not None, (j, mon.output()[-3000:])
        assert watchdog["timeout_seconds"] == 120.0, (watchdog, mon.output()[-3000:])
        assert watchdog["timeout_source"] == "args:--distributed-timeout-minutes", watchdog
        assert watchdog["timeout_assumed"] is False
        m = mon.metrics()
        got = [v for (n, lab), v in m.items()
               if n == "ncclwatch_watchdog_timeout_seconds" and ("job_id", j["job"]) in lab]
        assert got == [120.0], got
    finally:
        job.stop()
