"""What a demo rank does besides its scenario's collectives: models and state
dicts, what a late rank does instead of joining, busy threads, and dying
with its parent.

The scenarios (job.py) are built of these; tests/workloads use busy_thread.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor
from torch.overrides import TorchFunctionMode


def make_model(model_mb: float, layers: int = 4) -> nn.Module:
    """Square Linear layers holding about model_mb MiB of fp32 weights."""
    dim = max(16, int((model_mb * 2**20 / (4 * layers)) ** 0.5))
    torch.manual_seed(0)  # same init on every rank
    return nn.Sequential(*[nn.Linear(dim, dim) for _ in range(layers)])


def nbytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def full_state_dict(model: nn.Module) -> dict:
    """The usual way: the whole model state, on rank 0's host memory."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )
    return get_model_state_dict(model, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))


class SlowHostCopy(TorchFunctionMode):
    """Makes ``Tensor.to(cpu)`` sleep: a host copy under memory pressure.

    Inside get_model_state_dict(cpu_offload=True) rank 0 copies each gathered
    tensor to the host; sleeping there keeps the real gather frames on the
    stack while the peers already wait in the all_gather of the next tensor.
    The delay is split over the first ``copies`` copies; never slow the last
    one, after it the peers have left the gather.
    """

    def __init__(self, seconds: float, copies: int):
        super().__init__()
        self.left = max(copies, 1)
        self.each = seconds / self.left

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func is torch.Tensor.to and self.left > 0
                and not isinstance(args[0], DTensor)
                and torch.device("cpu") in (*args[1:], kwargs.get("device"))):
            self.left -= 1
            time.sleep(self.each)
        return func(*args, **kwargs)


def _busy_elsewhere(seconds: float) -> None:
    time.sleep(seconds)  # plain Python, no torch frame: "rank 0 is late"


def _busy_computing(seconds: float) -> None:
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    end = time.time() + seconds
    while time.time() < end:
        a = torch.tanh(a @ b)


def _busy_loading(seconds: float) -> None:
    loader = torch.utils.data.DataLoader(SlowDataset(), batch_size=2, num_workers=0)
    end = time.time() + seconds
    for _ in loader:
        if time.time() > end:
            break


#: --late-activity: what the late rank does instead of joining the collective.
LATE_ACTIVITIES = {
    "sleep": _busy_elsewhere,
    "compute": _busy_computing,
    "dataloader": _busy_loading,
}


def keep_sockets(seconds: float) -> None:
    """Hand this rank's sockets to a process that only holds them open.

    When a node dies its TCP connections do not close; the peers wait in
    their collective until the watchdog fires. Killing a process closes its
    sockets and gloo peers fail fast instead, so for --keep-sockets a
    helper (exec'd with an empty environment: not a rank) keeps them open
    after this rank is killed, as a dead node would.
    """
    import subprocess
    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                fds.append(int(name))
        except OSError:
            continue
    subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"],
                     pass_fds=fds, env={}, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


class SlowDataset(torch.utils.data.Dataset):
    """Each sample takes 0.5 s: an input pipeline that cannot keep up, polling
    for its data (ten waits a second: it makes progress, it is not still)."""

    def __len__(self):
        return 10**6

    def __getitem__(self, i):
        for _ in range(5):
            time.sleep(0.1)
        return torch.full((16,), float(i))


def busy_thread(fraction: float, period: float = 0.01, buf_bytes: int = 64 * 1024) -> None:
    """Burn ``fraction`` of a core in a daemon thread for the life of the rank.

    hashlib releases the GIL on large buffers, so the burn runs beside the
    main thread as a spinning CUDA sync does, without slowing its Python;
    the thread makes no read/write syscalls.
    """
    import hashlib
    import threading
    buf = bytes(buf_bytes)
    spin, rest = period * fraction, period * (1 - fraction)

    def burn() -> None:
        while True:
            end = time.monotonic() + spin
            while time.monotonic() < end:
                hashlib.sha256(buf).digest()
            if rest > 0:
                time.sleep(rest)

    threading.Thread(target=burn, name="busy-wait", daemon=True).start()


def die_with_parent() -> None:
    """If torchrun itself dies (kill -9), take this rank down too (Linux)."""
    try:
        import ctypes
        import signal
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PDEATHSIG
        if os.getppid() == 1:  # parent already gone
            os._exit(1)
    except (OSError, AttributeError):
        pass
