"""The API's stall objects say what to do now (from the forecast) and the fix in the
job's own framework: one row per advice and one per framework."""

from __future__ import annotations

import re

import pytest

from ncclwatch import frameworks
from ncclwatch.daemon import api
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.model import CollectiveOp as Op, RankState as S
from ncclwatch.stacks import Frame, stack_id
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.reports import MB, drive_job, rank0_sample, report, sample, stack_pb

SP = "/venv/lib/python3.11/site-packages/"
SER = SP + "torch/serialization.py"
#: A frame file each framework's save runs through (as py-spy reports it).
FRAME_OF = {
    "nemo": SP + "nemo/lightning/pytorch/strategies/megatron_strategy.py",
    # installed: a source checkout is an import only by the agent's evidence (imports.py)
    "megatron": SP + "megatron/training/checkpointing.py",
    "torchtitan": SP + "torchtitan/components/checkpoint.py",
    "torchtune": SP + "torchtune/training/checkpointing/_checkpointer.py",
    "composer": SP + "composer/utils/checkpoint.py",
    "lightning": SP + "lightning/pytorch/trainer/trainer.py",
    "deepspeed": SP + "deepspeed/runtime/engine.py",
    "transformers": SP + "transformers/trainer.py",
    "accelerate": SP + "accelerate/accelerator.py",
    "torch_fsdp2": SP + "torch/distributed/fsdp/_fully_shard/_fully_shard.py",
    "torch_fsdp1": SP + "torch/distributed/fsdp/_state_dict_utils.py",
    "torch_dcp": SP + "torch/distributed/checkpoint/state_dict_saver.py",
    "torch": "/job/train.py",
}


def _stall(d: Daemon, now: float) -> dict:
    [job] = api.jobs_view(d, now=now)["jobs"]
    [stall] = job["stalls"]
    return stall


def _drive_with_stack(frame_file: str, seconds: int = 12) -> tuple[Daemon, float]:
    """Rank 0 saves 200 MiB at 1 MiB/s (too slow for 90 s) through ``frame_file``."""
    save = [Frame("write", "/job/storage.py", 1), Frame("save", SER, 2),
            Frame("save_checkpoint", frame_file, 3), Frame("main", "/job/train.py", 4)]
    d = Daemon(DaemonConfig(stall_threshold=5.0))
    for i in range(seconds):
        now = 1000.0 + i
        r0 = rank0_sample(S.SAVING, i, file_size=(i + 1) * MB, prev=200 * MB, seconds=i)
        r0.stack_id = stack_id(save)
        samples = [r0] + [sample("job-1", r, 4, S.COLLECTIVE, Op.BARRIER, seconds=i,
                                 timeout=90.0) for r in (1, 2, 3)]
        d.ingest(report(samples, seq=i + 1, stacks=[stack_pb(save)]), now=now)
        d.tick(now=now, wall=now)
    return d, 1000.0 + seconds - 1


@pytest.mark.parametrize("fw", [f.id for f in frameworks.FRAMEWORKS])
def test_each_framework_gets_its_own_fix_and_the_advice_for_now(fw: str) -> None:
    d, now = _drive_with_stack(FRAME_OF[fw])
    s = _stall(d, now)
    dx = s["diagnosis"]
    assert dx["root_cause"] == "save_overruns_watchdog"
    assert dx["framework"]["id"] == fw
    assert dx["fixes"], fw
    own = {fw} | ({"torch"} if fw in {"torch_fsdp1", "torch_fsdp2", "torch_dcp"} else set())
    assert {f["framework"] for f in dx["fixes"]} <= own
    assert dx["fixes"][0]["snippet"]
    assert s["advice"]["action"] == "stop_cleanly"
    assert 0 < s["advice"]["decide_within_seconds"] <= s["watchdog"]["remaining_seconds"] + 1


def test_lightning_job_is_told_the_strategy_argument_not_dcp_code() -> None:
    d, now = _drive_with_stack(FRAME_OF["lightning"])
    snippets = " ".join(f["snippet"] for f in _stall(d, now)["diagnosis"]["fixes"])
    assert 'FSDPStrategy(state_dict_type="sharded")' in snippets
    assert "dcp.save" not in snippets


def test_a_save_that_fits_is_let_run_until_it_should_end() -> None:
    d, now = drive_job(lambda i: rank0_sample(S.SAVING, i, file_size=(i + 1) * 10 * MB, prev=150 * MB,
                                     seconds=i), 10)
    a = _stall(d, now)["advice"]
    assert a["action"] == "let_it_run", a
    assert a["until"] == "save_ends" and 0 <= a["decide_within_seconds"] < 15
    assert a["headline"].startswith("LET IT RUN")


def test_an_overrun_says_stop_cleanly_within_the_budget_left() -> None:
    d, now = drive_job(lambda i: rank0_sample(S.SAVING, i, file_size=(i + 1) * MB, prev=200 * MB,
                                     seconds=i), 12)
    s = _stall(d, now)
    a = s["advice"]
    assert a["action"] == "stop_cleanly" and a["until"] == "watchdog_fires"
    assert a["decide_within_seconds"] == pytest.approx(s["watchdog"]["remaining_seconds"], abs=2)
    assert "Flight Recorder dump" in a["text"] and "too late" in a["text"]


def test_memory_running_out_says_stop_now_before_it_does() -> None:
    def rank0(i: int) -> pb.RankSample:
        return rank0_sample(S.GATHERING_STATE_DICT, i, seconds=i, limits=[
            (pb.MEMORY_LIMIT_KIND_CGROUP, 1000 * MB + 100 * MB * i, 3000 * MB)])
    d, now = drive_job(rank0, 12)
    a = _stall(d, now)["advice"]
    assert a["action"] == "stop_now", a
    assert a["until"] == "memory_runs_out" and 0 < a["decide_within_seconds"] < 20


def test_nothing_forecast_says_take_the_dump_now() -> None:
    d, now = drive_job(lambda i: rank0_sample(S.SAVING, i, file_size=(i + 1) * MB, seconds=i), 12)
    s = _stall(d, now)
    a = s["advice"]
    assert a["action"] == "dump_now", a
    assert a["headline"].startswith("TAKE THE FLIGHT RECORDER DUMP NOW")
    assert a["decide_within_seconds"] == pytest.approx(s["watchdog"]["remaining_seconds"], abs=2)


def test_status_says_what_to_do_now_and_the_framework_fix() -> None:
    from ncclwatch import status

    d, now = _drive_with_stack(FRAME_OF["deepspeed"])
    text = status.render(api.jobs_view(d, now=now), "http://daemon.example:7471")
    assert "NOW: STOP THE JOB CLEANLY NOW (" in text
    assert "runbook: http://daemon.example:7471/runbooks/checkpoint_gather.md#save_overruns" in text
    assert "  fix: " not in text  # DeepSpeed's own rows, not torch's generic words
    assert "fix for DeepSpeed: Save sharded" in text
    assert '"stage3_gather_16bit_weights_on_model_save": false' in text
    assert text.index("NOW:") < text.index("culprit:")
    # One clock: each duration names the anchor it counts from.
    assert re.search(r"culprit: rank 0 .* saving for \d+s \(since save start\)", text), text
    assert re.search(r"waiting: ranks [\d-]+ in \S+ for \d+s \(since the first wait\)", text), text
