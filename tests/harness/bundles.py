"""Evidence bundles: a daemon holding a stalled job to pack one, and a bundle's files read back."""

from __future__ import annotations

import io
import tarfile
import time

from ncclwatch.daemon.core import Daemon
from ncclwatch.model import CollectiveOp, RankState
from tests.harness.reports import (MB, SAVE, drive_job, frames, rank0_sample, report, sample,
                                   stack_pb)

#: A waiter's native stack: gloo's barrier under its Python frame.
NATIVE = frames(("gloo::transport::tcp::UnboundBuffer::waitRecv", "libtorch_cpu.so"),
                ("c10d::ProcessGroupGloo::barrier", "libtorch_cpu.so"),
                ("barrier", "torch/distributed/distributed_c10d.py"))


def stalled_daemon() -> tuple[Daemon, float]:
    """A daemon 13 s into job-1's checkpoint_gather (rank 0 saving, rank 1 waiting
    natively in gloo's barrier), and the monotonic time of its last report."""
    def rank0(i: int):
        s = rank0_sample(RankState.SAVING, i, file_size=(i + 1) * MB, seconds=i)
        s.stack_id = stack_pb(SAVE).id
        return s
    # Reports in the past of the daemon's real clock (a fresh ask over HTTP waits
    # for reports newer than itself), whatever the machine's uptime.
    d, now = drive_job(rank0, 12, start=time.monotonic() - 20)
    waiter = sample("job-1", 1, 4, RankState.COLLECTIVE, CollectiveOp.BARRIER, seconds=12,
                    timeout=90.0)
    waiter.native_frame, waiter.native_stack_id = "gloo::Pair::recv", stack_pb(NATIVE).id
    d.ingest(report([rank0(12), waiter], seq=99, stacks=[stack_pb(SAVE), stack_pb(NATIVE)]),
             now=now + 0.5)
    return d, now + 0.5


def members(body: bytes) -> dict[str, bytes]:
    """A bundle's files by their path under its top directory."""
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        return {m.name.partition("/")[2]: tar.extractfile(m).read() for m in tar.getmembers()}
