"""The job's shape as evidence (issue 18): with native stacks turned off
(``--native-stack-after 0``), ranks that wait NCCL-style (``work.wait()`` of an
async all_reduce, a thread spinning in every rank) show nothing on their
Python stacks; that every one of them has sat still while rank 0 saves is
then the only evidence, and the checkpoint_gather it gives is provisional,
until the live Flight Recorder (the daemon asks for dumps during the stall)
confirms it by sequence numbers."""

from __future__ import annotations

import sys

from tests.conftest import need
from tests.scenarios.matrix import PG_TIMEOUT, Scenario
from tests.scenarios.test_matrix import run_scenario, table

import pytest

pytestmark = pytest.mark.e2e

ROW = Scenario("stillness-async-wait",
               ("--scenario", "slow-save", "--model-mb", "16", "--busy-thread", "0.6",
                "--wait-op", "async-wait", "--save-seconds", "150",
                "--pg-timeout", str(PG_TIMEOUT)),
               kind="checkpoint_gather", culprits=(0,), root_cause="save_overruns_watchdog",
               at_risk=True, start="save_start", world=3, detect_within=30.0, state="saving",
               evidence=("stillness",), ops=("wait",), confirmed_by="flight_recorder",
               limit=60.0,
               # The job's Flight Recorder behind a debug-info pipe (demo.debug_pipe
               # serves it for gloo as ProcessGroupNCCL does for NCCL).
               env=(("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "{ckpt}/pipe_"),
                    ("TORCH_FR_DUMP_TEMP_FILE", "{ckpt}/fr_"),
                    ("TORCH_FR_BUFFER_SIZE", "2000")))


def test_stillness_alone_gives_a_provisional_checkpoint_gather(ncclwatch_run) -> None:
    need("torchrun")
    mon = ncclwatch_run("--native-stack-after", "0")
    out = run_scenario(mon, ROW)
    print("\n" + table([out]), file=sys.__stdout__, flush=True)
    if out.confirmed_at is not None and out.detected_at is not None:
        print(f"confirmed by {ROW.confirmed_by} {out.confirmed_at - out.detected_at:.1f}s "
              "after the provisional verdict", file=sys.__stdout__, flush=True)
    assert not out.problems(), table([out])
