"""Native signatures against real ``py-spy dump --native`` dumps.

gloo rows: tests/data/pyspy/native-*.json, recorded on this machine by
tests/data/pyspy/capture_native.py (a rank waiting NCCL-style while rank 0
saves). CUDA rows: the H200 recordings in tests/data/gpu.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.native_signatures import (OP_SIGNATURES, WAIT_SIGNATURES, classify_native,
                                         classify_native_rank)
from ncclwatch.signatures import classify_rank
from ncclwatch.stacks import Frame, parse_pyspy_json
from tests.harness.paths import DATA

GPU = DATA / "gpu" / "h200-torch2.11"


def _threads(path: Path):
    return parse_pyspy_json(path.read_text())


def _pid(threads) -> int:
    # The fixtures' main thread; os_thread_id is the pid where py-spy saw it.
    return next(t.os_thread_id for t in threads if t.thread_name == "MainThread")


@pytest.mark.parametrize("name, state, op, frame", [
    ("async-wait", RankState.COLLECTIVE, CollectiveOp.WAIT, "c10d::Work::wait"),
    ("future-wait", RankState.COLLECTIVE, CollectiveOp.WAIT,
     "torch::jit::PythonFutureWrapper::wait"),
    ("ddp-backward", RankState.COLLECTIVE, CollectiveOp.ALL_REDUCE,
     "c10d::Reducer::finalize_backward"),
    ("barrier", RankState.COLLECTIVE, CollectiveOp.WAIT, "c10d::Work::wait"),
    # FSDP2 with async unshard (NCCL's shape): the Python frames around the wait name it.
    ("fsdp2-forward", RankState.COLLECTIVE, CollectiveOp.ALL_GATHER, "c10d::Work::wait"),
])
def test_real_gloo_native_dumps(name, state, op, frame) -> None:
    threads = _threads(DATA / "pyspy" / f"native-{name}__rank1.json")
    w = classify_native_rank(threads, _pid(threads))
    assert w is not None, name
    assert (w.state, w.op, w.frame) == (state, op, frame)


@pytest.mark.parametrize("name", ["async-wait", "future-wait", "ddp-backward",
                                  "fsdp2-forward"])
def test_python_frames_alone_read_these_waits_as_compute(name) -> None:
    """The premise of issue 18: nothing on the Python stack says 'waiting'."""
    threads = _threads(DATA / "pyspy" / f"native-{name}__rank1.json")
    c, _ = classify_rank(threads, _pid(threads))
    assert c.state is RankState.COMPUTE and c.op is CollectiveOp.NONE


def test_spinning_thread_is_not_a_wait() -> None:
    """The busy-wait thread of every rank sleeps in libc: no row matches it."""
    threads = _threads(DATA / "pyspy" / "native-async-wait__rank1.json")
    busy = next(t for t in threads if t.thread_name == "busy-wait")
    assert classify_native(busy.stack.frames) is None


@pytest.mark.parametrize("name, frame", [
    ("pyspy_wait_sync_wait_native.json", "cuCtxSynchronize_v2"),
    ("pyspy_wait_event_wait_native.json", "cuEventSynchronize"),
])
def test_real_cuda_native_dumps(name, frame) -> None:
    threads = _threads(GPU / name)
    w = classify_native_rank(threads, _pid(threads))
    assert w is not None and w.state is RankState.DEVICE_WAIT and w.frame == frame


def test_native_manifest_records_each_pause() -> None:
    manifest = json.loads((DATA / "pyspy" / "native-manifest.json").read_text())
    assert set(manifest) >= {"async-wait", "future-wait", "ddp-backward", "fsdp2-forward"}
    for name, m in manifest.items():
        assert 0 < m["pause_seconds"] < 10, name
        assert m["num_threads"] >= m["threads_dumped"] >= 1, name


def _native(*names: str) -> list[Frame]:
    return [Frame(n, "/usr/lib/libtorch_cpu.so") for n in names]


@pytest.mark.parametrize("frames, state, op", [
    # .item() of a result behind a queued collective: a memcpy under _local_scalar_dense_cuda.
    (_native("cudaMemcpyAsync", "at::native::_local_scalar_dense_cuda",
             "at::_ops::_local_scalar_dense::call"), RankState.DEVICE_WAIT, CollectiveOp.NONE),
    # The same memcpy anywhere else is a copy, not a wait.
    (_native("cudaMemcpyAsync", "at::native::copy_"), None, None),
    (_native("cudaStreamSynchronize", "c10::cuda::stream_synchronize"),
     RankState.DEVICE_WAIT, CollectiveOp.NONE),
    (_native("c10d::ProcessGroupNCCL::WorkNCCL::synchronize",
             "c10d::ProcessGroupNCCL::WorkNCCL::wait"), RankState.COLLECTIVE, CollectiveOp.WAIT),
    (_native("gloo::transport::tcp::UnboundBuffer::waitRecv", "gloo::allreduce",
             "c10d::ProcessGroupGloo::allreduce"), RankState.COLLECTIVE, CollectiveOp.ALL_REDUCE),
    (_native("pthread_cond_wait", "c10::ivalue::Future::wait"),
     RankState.COLLECTIVE, CollectiveOp.WAIT),
    # Python frames never match a native row, whatever their name.
    ([Frame("c10d::Work::wait", "/x/job.py", 3)], None, None),
    (_native("at::native::addmm_out", "torch::autograd::Engine::thread_main"), None, None),
])
def test_native_rows(frames, state, op) -> None:
    w = classify_native(frames)
    if state is None:
        assert w is None
    else:
        assert w is not None and (w.state, w.op) == (state, op)


def test_rows_are_well_formed() -> None:
    for sig in WAIT_SIGNATURES:
        assert sig.pattern and " " not in sig.pattern
        assert sig.state in (RankState.COLLECTIVE, RankState.DEVICE_WAIT)
        assert (sig.op is not CollectiveOp.NONE) == (sig.state is RankState.COLLECTIVE)
    assert len({p for p, _ in OP_SIGNATURES}) == len(OP_SIGNATURES)


def test_a_ray_train_workers_wait_is_read_on_its_training_thread() -> None:
    """A real native dump of a real Ray Train worker (TorchTrainer, gloo, the
    training function waiting in ``Work.wait()`` of an async all_reduce while
    rank 0 saves, a thread spinning beside it; tests/e2e/test_ray_train.py takes
    one live). Its main thread is Ray's task loop, whose innermost frames are
    libc's (epoll_wait): the rank's thread is the TrainingThread, found by its
    innermost Python frame, not by position."""
    threads = _threads(DATA / "pyspy" / "native-ray-async-wait__rank1.json")
    pid = _pid(threads)
    host = next(t for t in threads if t.os_thread_id == pid)
    assert host.stack.frames[0].name == "epoll_wait"          # no Python frame first
    assert classify_native(host.stack.frames) is None          # what position alone read
    w = classify_native_rank(threads, pid)
    assert w is not None and (w.state, w.op, w.frame) == (
        RankState.COLLECTIVE, CollectiveOp.WAIT, "c10d::Work::wait")
    from ncclwatch.stacks import main_thread
    assert main_thread(threads, pid).thread_name.startswith("TrainingThread(")
