"""Classification of real py-spy dumps of torch jobs (tests/data/pyspy).

The fixtures are raw ``py-spy dump --json`` output of real gloo jobs,
captured by tests/data/pyspy/capture.py; manifest.json says what each
rank's main thread was doing when it was dumped.
"""

from __future__ import annotations

import json

import pytest

from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.signatures import (ACTIVITY_SIGNATURES, COLLECTIVE_SIGNATURES, OUTRANKS,
                                  SPAN_SIGNATURES, classify, classify_rank)
from ncclwatch.stacks import Frame, Stack, ThreadDump, main_thread, parse_pyspy_json
from tests.harness import paths

DATA = paths.DATA / "pyspy"
MANIFEST = json.loads((DATA / "manifest.json").read_text())


def _load(name: str):
    raw = (DATA / name).read_text()
    pid = json.loads(raw)[0]["pid"]
    return main_thread(parse_pyspy_json(raw), pid)


@pytest.mark.parametrize("fx", MANIFEST["fixtures"], ids=lambda f: f["file"])
def test_real_dump_classification(fx) -> None:
    raw = (DATA / fx["file"]).read_text()
    pid = json.loads(raw)[0]["pid"]
    threads = parse_pyspy_json(raw)
    main = main_thread(threads, pid)
    assert main is not None and main.stack.frames, "fixture has no main thread"
    got, stack = classify_rank(threads, pid)  # as the agent does: all threads
    assert got.state is RankState(fx["state"]), [f.short for f in stack.frames]
    assert got.op is CollectiveOp(fx["op"] or "none"), [f.short for f in stack.frames]


#: Framework fixtures (tests/data/pyspy/capture.py FRAMEWORKS): every one is checked
#: above; these must exist so that no framework's rows go untested.
FRAMEWORK_FIXTURES = {
    "lightning-ckpt": ("saving", "collective"), "pl-ckpt": ("saving", "collective"),
    "lightning-restore": ("loading", "loading"),
    "hf-trainer-ckpt": ("saving", "collective"),
    "accelerate-save-state": ("saving", "collective"),
    "accelerate-save-model": ("saving", "collective"),
    "accelerate-load-state": ("loading", "collective"),
    "deepspeed-16bit": ("saving", "collective"), "deepspeed-ckpt": ("saving", "saving"),
    "dcp-async-save": ("saving", "saving"), "fsdp1-full-load": ("loading", "loading"),
}


@pytest.mark.parametrize("name", sorted(FRAMEWORK_FIXTURES))
def test_framework_fixtures_present(name) -> None:
    by_rank = {f["rank"]: f["state"] for f in MANIFEST["fixtures"] if f["scenario"] == name}
    assert (by_rank.get(0), by_rank.get(1)) == FRAMEWORK_FIXTURES[name], by_rank


def test_lightning_slow_copy_is_a_save() -> None:
    """The issue's stack: no torch.save frame while fsspec's commit copies the file."""
    main = _load("lightning-ckpt__rank0.json")
    names = [f.name.rpartition(".")[2] for f in main.stack.frames]
    assert names[0] == "_fastcopy_sendfile" and "save" not in names, names
    assert "_atomic_save" in names and "__exit__" in names
    assert classify(main.stack.frames).state is RankState.SAVING


def test_async_save_rank_takes_the_writer_thread() -> None:
    """Rule 5: main thread in Future.result, DCP's thread writing."""
    raw = (DATA / "dcp-async-save__rank0.json").read_text()
    pid = json.loads(raw)[0]["pid"]
    threads = parse_pyspy_json(raw)
    main = main_thread(threads, pid)
    assert classify(main.stack.frames).state is RankState.IDLE  # alone, it looks idle
    got, stack = classify_rank(threads, pid)
    assert got.state is RankState.SAVING and stack is not main.stack


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
        assert sig.state is not None and sig.op is None and sig.names and not sig.span
    for sig in SPAN_SIGNATURES:
        assert sig.state is not None and sig.op is None and sig.names and sig.span
    for sig in COLLECTIVE_SIGNATURES:
        assert sig.op is not None and sig.state is None and sig.names
    pairs = [(sig.path, n) for sig in ACTIVITY_SIGNATURES + SPAN_SIGNATURES
             + COLLECTIVE_SIGNATURES for n in sig.names]
    assert len(pairs) == len(set(pairs)), "a (path, name) in two rows: order would decide"


# -- the precedence rule (signatures.py docstring), case by case ----------------------
PL = SITE + "lightning/pytorch/"
C10D = SITE + "torch/distributed/distributed_c10d.py"
FSDP_SDU = SITE + "torch/distributed/fsdp/_state_dict_utils.py"
F = Frame


@pytest.mark.parametrize("frames,state,op", [
    # rule 2: a span names what no row knows below it (shutil's copy) ...
    ([F("copyfile", "/usr/lib/python3.11/shutil.py"),
      F("Trainer.save_checkpoint", PL + "trainer/trainer.py")], RankState.SAVING, CollectiveOp.NONE),
    # ... but yields to a collective inside it: the waiting rank waits.
    ([F("barrier", C10D), F("DDPStrategy.barrier", PL + "strategies/ddp.py"),
      F("Trainer.save_checkpoint", PL + "trainer/trainer.py")],
     RankState.COLLECTIVE, CollectiveOp.BARRIER),
    # rule 1 over rule 2: a work row inside a span names the activity even with a collective.
    ([F("all_gather", SITE + "deepspeed/comm/comm.py"),
      F("_zero3_consolidated_16bit_state_dict", SITE + "deepspeed/runtime/engine.py"),
      F("save_16bit_model", SITE + "deepspeed/runtime/engine.py")],
     RankState.GATHERING_STATE_DICT, CollectiveOp.ALL_GATHER),
    # rule 1: a gather inside a load is the load's unshard (OUTRANKS), at any depth.
    ([F("all_gather_into_tensor", C10D), F("_enter_unshard_params_ctx", FSDP_SDU),
      F("_full_pre_load_state_dict_hook", FSDP_SDU)], RankState.LOADING, CollectiveOp.ALL_GATHER),
    # the same unshard under a save-side hook stays a gather
    ([F("all_gather_into_tensor", C10D), F("_enter_unshard_params_ctx", FSDP_SDU),
      F("_full_pre_state_dict_hook", FSDP_SDU)],
     RankState.GATHERING_STATE_DICT, CollectiveOp.ALL_GATHER),
    # rule 1: the innermost work row wins (torch.save inside a load-side span is a save)
    ([F("_save", SITE + "torch/serialization.py"),
      F("load_state", SITE + "accelerate/accelerator.py")], RankState.SAVING, CollectiveOp.NONE),
    # the innermost span wins when no work row matched
    ([F("rmtree", "/usr/lib/python3.11/shutil.py"),
      F("rotate_checkpoints", SITE + "transformers/trainer_utils.py"),
      F("Trainer._load_from_checkpoint", SITE + "transformers/trainer.py")],
     RankState.SAVING, CollectiveOp.NONE),
    # rule 3: object point-to-point calls name the op over the send/recv inside them
    ([F("recv", C10D), F("recv_object_list", C10D)], RankState.COLLECTIVE, CollectiveOp.RECV),
    ([F("all_gather_single", C10D)], RankState.COLLECTIVE, CollectiveOp.ALL_GATHER),
])
def test_precedence_rule(frames, state, op) -> None:
    got = classify(frames)
    assert (got.state, got.op) == (state, op)


def test_outranks_is_about_activities() -> None:
    for low, high in OUTRANKS.items():
        assert {low, high} <= {RankState.SAVING, RankState.GATHERING_STATE_DICT,
                               RankState.LOADING} and low is not high


def _thread(tid: int, name: str, frames: list[Frame]) -> ThreadDump:
    return ThreadDump(tid, tid, name, True, Stack(tuple(frames), name))


WAIT = [F("Condition.wait", "/usr/lib/python3.11/threading.py"),
        F("Future.result", "/usr/lib/python3.11/concurrent/futures/_base.py"),
        F("main", "/job/train.py")]
WRITE = [F("write_data", SITE + "torch/distributed/checkpoint/filesystem.py")]


@pytest.mark.parametrize("main_frames,other,state", [
    (WAIT, WRITE, RankState.SAVING),                       # rule 5: takes the writer's state
    (WAIT, [F("Condition.wait", "/usr/lib/python3.11/threading.py")], RankState.IDLE),
    ([F("step", "/job/train.py")], WRITE, RankState.COMPUTE),  # overlapped save: computing
    ([F("barrier", C10D)], WRITE, RankState.COLLECTIVE),       # waiting for peers: its own state
])
def test_rank_state_from_its_threads(main_frames, other, state) -> None:
    threads = [_thread(7, "MainThread", main_frames), _thread(8, "writer", other)]
    got, stack = classify_rank(threads, 7)
    assert got.state is state
    assert (stack.thread_name == "writer") == (state is RankState.SAVING)
