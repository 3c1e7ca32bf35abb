"""The job's shape as evidence (issue 18): with native stacks turned off
(``--native-stack-after 0``), ranks that wait NCCL-style (``work.wait()`` of an
async all_reduce, a thread spinning in every rank) show nothing on their
Python stacks; that every one of them has sat still while rank 0 saves is
then the only evidence, and the checkpoint_gather it gives is provisional,
until the live Flight Recorder (the daemon asks for dumps during the stall)
confirms it by sequence numbers.

Outside checkpoint work (a collective_hang) the shape counts after the hang
ceiling (30 s): a rank at work while the rest sit still is a provisional hang;
every rank still (the late one sleeps) blames nobody, until the Flight Recorder
names the rank that never enqueued the collective."""

from __future__ import annotations

import sys

from tests.harness.scenariorun import run_scenario, table
from tests.harness.scenarios import PG_TIMEOUT, Scenario, job_args
from tests.harness.tools import need

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
               env=(FR_PIPE := (("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "{ckpt}/pipe_"),
                                ("TORCH_FR_DUMP_TEMP_FILE", "{ckpt}/fr_"),
                                ("TORCH_FR_BUFFER_SIZE", "2000"))))

# Rank 1 stops joining the step's all_reduce (waited in work.wait() by the others)
# and reads a slow DataLoader instead: it makes progress, the others sit still.
HANG_BY_SHAPE = Scenario(
    "stillness-hang-dataloader",
    job_args("train", "--hang-after", "20", "--late-rank", "1", "--late-activity", "dataloader",
         "--busy-thread", "0.6", "--wait-op", "async-wait", seconds=300),
    kind="collective_hang", culprits=(1,), root_cause="rank_in_dataloader", at_risk=True,
    start="busy_start", world=3, detect_within=60.0, evidence=("stillness",), ops=("wait",))

# Rank 1 sleeps instead: every rank sits still, and only the Flight Recorder can
# say which one the others wait for: all_reduce #N that rank 1 never enqueued.
HANG_BY_FR = Scenario(
    "flight-recorder-hang-sleep",
    job_args("train", "--hang-after", "20", "--late-rank", "1", "--late-activity", "sleep",
         "--busy-thread", "0.6", "--wait-op", "async-wait", seconds=300),
    kind="collective_hang", culprits=(1,), root_cause="rank_idle", at_risk=True,
    start="busy_start", world=3, detect_within=60.0, evidence=("flight_recorder",),
    ops=("all_reduce",), env=FR_PIPE)


def test_stillness_alone_gives_a_provisional_checkpoint_gather(ncclwatch_run) -> None:
    need("torchrun")
    mon = ncclwatch_run("--native-stack-after", "0")
    out = run_scenario(mon, ROW)
    print("\n" + table([out]), file=sys.__stdout__, flush=True)
    if out.confirmed_at is not None and out.detected_at is not None:
        print(f"confirmed by {ROW.confirmed_by} {out.confirmed_at - out.detected_at:.1f}s "
              "after the provisional verdict", file=sys.__stdout__, flush=True)
    assert not out.problems(), table([out])


@pytest.mark.parametrize("row", [HANG_BY_SHAPE, HANG_BY_FR], ids=lambda r: r.name)
def test_a_hang_no_frame_shows(ncclwatch_run, row: Scenario) -> None:
    need("torchrun")
    mon = ncclwatch_run("--native-stack-after", "0")
    out = run_scenario(mon, row)
    print("\n" + table([out]), file=sys.__stdout__, flush=True)
    assert not out.problems(), table([out])
