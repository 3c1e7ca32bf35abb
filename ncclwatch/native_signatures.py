"""Native frames that mean a rank waits on its peers or its device (data).

On NCCL a collective returns to Python as soon as it is queued; the rank
blocks later, wherever it next meets the device (``.item()``,
``synchronize``, DDP's backward, FSDP's next unshard), with no c10d frame on
its Python stack. ``py-spy dump --native`` shows the C++ frames beneath: each
row below names symbols (fnmatch globs on the demangled name py-spy prints)
that mean a wait, and what kind. The innermost matching frame of the main
thread wins; a row whose ``under`` is set counts only with such a frame
further out (``cudaMemcpy*`` is ``.item()`` only under
``_local_scalar_dense_cuda``, elsewhere a plain copy).

Op rows name the collective where a frame says it (DDP's reducer all-reduces
its buckets; ProcessGroup*::allreduce and friends; FSDP2's unshard around a
bare wait is its all_gather); a bare ``Work::wait`` or a future's wait with
no such frame says only WAIT. Every row that this machine can produce is
exercised by a real dump in tests/data/pyspy (native-*.json); the CUDA rows by
the H200 recordings in tests/data/gpu.

NCCL's own threads (watchdog, heartbeat monitor, proxy) are always there,
waiting or not, so only the main thread is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Sequence

from ncclwatch.model import CollectiveOp as Op
from ncclwatch.model import RankState as S
from ncclwatch.stacks import Frame, ThreadDump, is_native, main_thread


@dataclass(frozen=True, slots=True)
class NativeSignature:
    """A native frame whose name matches ``pattern`` means ``state``/``op``."""

    pattern: str
    state: S
    op: Op = Op.NONE
    #: Only with a frame matching this further out (toward the thread's start).
    under: str = ""


def _wait(pattern: str, op: Op = Op.WAIT, under: str = "") -> NativeSignature:
    return NativeSignature(pattern, S.COLLECTIVE, op, under)


def _device(pattern: str, under: str = "") -> NativeSignature:
    return NativeSignature(pattern, S.DEVICE_WAIT, Op.NONE, under)


#: Blocking frames, innermost wins.
WAIT_SIGNATURES: tuple[NativeSignature, ...] = (
    # DDP: finalize_backward waits on the bucket all_reduces' futures.
    _wait("c10d::Reducer::*", Op.ALL_REDUCE),
    # c10d work objects (gloo's AsyncWork, NCCL's WorkNCCL and the base class).
    _wait("c10d::ProcessGroupNCCL::WorkNCCL::wait*"),
    _wait("c10d::ProcessGroupNCCL::WorkNCCL::synchronize*"),
    _wait("c10d::ProcessGroupGloo::AsyncWork::wait*"),
    _wait("c10d::Work::wait*"),
    _wait("c10d::*Work*::wait*"),
    # gloo's transport waiting for a peer's bytes.
    _wait("gloo::transport::*UnboundBuffer::waitRecv*"),
    _wait("gloo::transport::*UnboundBuffer::waitSend*"),
    # Waits on a collective's future (work.get_future().wait(), functional collectives).
    _wait("torch::jit::PythonFutureWrapper::wait*"),
    _wait("c10::ivalue::Future::wait*"),
    # The device: .item() / .cpu() of a result behind a queued collective,
    # torch.cuda.synchronize(), Event.synchronize(), a stream sync.
    _device("cudaMemcpy*", under="at::native::_local_scalar_dense_cuda*"),
    _device("cuMemcpy*", under="at::native::_local_scalar_dense_cuda*"),
    _device("cudaStreamSynchronize*"),
    _device("cuStreamSynchronize*"),
    _device("cudaEventSynchronize*"),
    _device("cuEventSynchronize*"),
    _device("cudaDeviceSynchronize*"),
    _device("cuCtxSynchronize*"),
    _device("c10::cuda::device_synchronize*"),
)

#: Frames that name the collective a wait belongs to, anywhere on the stack.
OP_SIGNATURES: tuple[tuple[str, Op], ...] = (
    ("c10d::Reducer::*", Op.ALL_REDUCE),
    *((f"c10d::ProcessGroup*::{name}*", op) for name, op in (
        ("allreduce", Op.ALL_REDUCE), ("allgather", Op.ALL_GATHER),
        ("_allgather_base", Op.ALL_GATHER), ("reduce_scatter", Op.REDUCE_SCATTER),
        ("_reduce_scatter_base", Op.REDUCE_SCATTER), ("broadcast", Op.BROADCAST),
        ("barrier", Op.BARRIER), ("alltoall", Op.ALL_TO_ALL), ("send", Op.SEND),
        ("recv", Op.RECV), ("gather", Op.GATHER), ("scatter", Op.SCATTER))),
)


_FSDP2 = "*/torch/distributed/fsdp/_fully_shard/"

#: Python frames around a bare wait that say which collective it is (a glob
#: on the path, the function names, the op): FSDP2's unshard waits on its
#: all_gather, its post-backward on its reduce_scatter.
PY_OP_SIGNATURES: tuple[tuple[str, frozenset[str], Op], ...] = (
    (_FSDP2 + "_fsdp_param_group.py", frozenset({"wait_for_unshard", "unshard"}),
     Op.ALL_GATHER),
    (_FSDP2 + "_fsdp_collectives.py",
     frozenset({"foreach_all_gather_copy_out", "foreach_all_gather"}), Op.ALL_GATHER),
    (_FSDP2 + "_fsdp_collectives.py", frozenset({"foreach_reduce"}), Op.REDUCE_SCATTER),
    (_FSDP2 + "_fsdp_param_group.py", frozenset({"post_backward", "wait_for_reduce"}),
     Op.REDUCE_SCATTER),
)


def _python_op(frames: Sequence[Frame]) -> Op | None:
    """The op the innermost Python frame of a known wrapper names, if any."""
    for f in frames:
        if is_native(f):
            continue
        name = f.name.rpartition(".")[2]
        path = f.filename.replace("\\", "/")
        for glob, names, op in PY_OP_SIGNATURES:
            if name in names and fnmatchcase(path, glob):
                return op
    return None


@dataclass(frozen=True, slots=True)
class NativeWait:
    """What a native stack says: the state, the op, the frame that said it."""

    state: S
    op: Op
    frame: str


def classify_native(frames: Sequence[Frame]) -> NativeWait | None:
    """The wait a thread's frames (innermost first) show, or None (none known)."""
    native = [f.name for f in frames if is_native(f)]
    for i, name in enumerate(native):
        for sig in WAIT_SIGNATURES:
            if not fnmatchcase(name, sig.pattern):
                continue
            if sig.under and not any(fnmatchcase(n, sig.under) for n in native[i + 1:]):
                continue
            op = sig.op
            if sig.state is S.COLLECTIVE and op is Op.WAIT:
                op = next((o for n in native[i + 1:] for p, o in OP_SIGNATURES
                           if fnmatchcase(n, p)), None) or _python_op(frames) or op
            return NativeWait(sig.state, op, name)
    return None


def classify_native_rank(threads: Sequence[ThreadDump], pid: int) -> NativeWait | None:
    """The wait of the rank's main thread (NCCL's helper threads always wait)."""
    main = main_thread(list(threads), pid)
    return classify_native(main.stack.frames) if main is not None else None
