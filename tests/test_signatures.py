"""Classification of real py-spy dumps of torch jobs (tests/data/pyspy).

The fixtures are raw ``py-spy dump --json`` output of real gloo jobs,
captured by tests/data/pyspy/capture.py; manifest.json says what each
rank's main thread was doing when it was dumped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.signatures import (ACTIVITY_SIGNATURES, COLLECTIVE_SIGNATURES, classify)
from ncclwatch.stacks import Frame, main_thread, parse_pyspy_json

DATA = Path(__file__).parent / "data" / "pyspy"
MANIFEST = json.loads((DATA / "manifest.json").read_text())


def _load(name: str):
    raw = (DATA / name).read_text()
    pid = json.loads(raw)[0]["pid"]
    return main_thread(parse_pyspy_json(raw), pid)


@pytest.mark.parametrize("fx", MANIFEST["fixtures"], ids=lambda f: f["file"])
def test_real_dump_classification(fx) -> None:
    main = _load(fx["file"])
    assert main is not None and main.stack.frames, "fixture has no main thread"
    got = classify(main.stack.frames)
    assert got.state is RankState(fx["state"]), [f.short for f in main.stack.frames]
    assert got.op is CollectiveOp(fx["op"] or "none"), [f.short for f in main.stack.frames]


def test_fixtures_cover_the_required_scenarios() -> None:
    ops = {f["op"] for f in MANIFEST["fixtures"]}
    states = {f["state"] for f in MANIFEST["fixtures"]}
    for op in ("barrier", "broadcast", "all_gather", "all_reduce", "gather_object",
               "broadcast_object_list"):
        assert op in ops
    for st in ("saving", "gathering_state_dict", "loading", "collective", "compute"):
        assert st in states


def test_main_thread_is_the_pid_thread() -> None:
    raw = (DATA / "slow-save__rank0.json").read_text()
    threads = parse_pyspy_json(raw)
    pid = json.loads(raw)[0]["pid"]
    assert main_thread(threads, pid).os_thread_id == pid


SITE = "/v/lib/python3.12/site-packages/"


@pytest.mark.parametrize("stack,state,op", [
    # HF Trainer calling torch.save: the innermost activity (saving) wins.
    ([("_save", SITE + "torch/serialization.py"), ("save", SITE + "torch/serialization.py"),
      ("_save_checkpoint", SITE + "transformers/trainer.py")], RankState.SAVING, CollectiveOp.NONE),
    # DeepSpeed ZeRO-3 consolidation blocked in an all_gather: participant.
    ([("all_gather", SITE + "deepspeed/comm/comm.py"),
      ("_zero3_consolidated_16bit_state_dict", SITE + "deepspeed/runtime/engine.py")],
     RankState.GATHERING_STATE_DICT, CollectiveOp.ALL_GATHER),
    # Python < 3.11 py-spy gives bare co_names; qualified names on 3.11+.
    ([("_BaseDataLoaderIter.__next__", SITE + "torch/utils/data/dataloader.py")],
     RankState.DATALOADER, CollectiveOp.NONE),
    # Functional collectives wait.
    ([("wait_tensor", SITE + "torch/distributed/_functional_collectives.py"),
      ("step", "/job/train.py")], RankState.COLLECTIVE, CollectiveOp.WAIT),
    # A frame named like a collective in user code is not one.
    ([("barrier", "/job/mysync.py")], RankState.COMPUTE, CollectiveOp.NONE),
    # Idle only counts as the innermost frame.
    ([("Condition.wait", "/usr/lib/python3.11/threading.py")], RankState.IDLE, CollectiveOp.NONE),
    ([("step", "/job/train.py"), ("Condition.wait", "/usr/lib/python3.11/threading.py")],
     RankState.COMPUTE, CollectiveOp.NONE),
    ([], RankState.UNKNOWN, CollectiveOp.NONE),
])
def test_signature_rules(stack, state, op) -> None:
    got = classify([Frame(n, f, 1) for n, f in stack])
    assert (got.state, got.op) == (state, op)


def test_outermost_collective_names_the_op() -> None:
    c10d = SITE + "torch/distributed/distributed_c10d.py"
    got = classify([Frame("broadcast", c10d, 1), Frame("broadcast_object_list", c10d, 2),
                    Frame("main", "/job/train.py", 3)])
    assert got.op is CollectiveOp.BROADCAST_OBJECT_LIST


def test_signature_rows_are_well_formed() -> None:
    for sig in ACTIVITY_SIGNATURES:
        assert sig.state is not None and sig.op is None and sig.names
    for sig in COLLECTIVE_SIGNATURES:
        assert sig.op is not None and sig.state is None and sig.names
