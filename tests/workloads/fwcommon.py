"""What every framework workload shares: markers, rank, a checkpoint's target size.

The workloads (fw_*.py) run under real torchrun with gloo on CPU and write
their checkpoint to a throttled FUSE mount (ncclwatch.demo.throttlefs), so the
save is slow inside each framework's own write path. They print the same
marker lines as ncclwatch.demo.job (tests/harness/jobs.py MARKER) from the
frameworks' own callbacks and hooks:
    NCCLWATCH_DEMO phase=<phase> rank=<r> pid=<pid> t=<time.time()> [k=v ...]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))


def marker(phase: str, **kv) -> None:
    extra = "".join(f" {k}={v}" for k, v in kv.items())
    sys.stdout.write(f"NCCLWATCH_DEMO phase={phase} rank={RANK} pid={os.getpid()} "
                     f"t={time.time():.6f}{extra}\n")
    sys.stdout.flush()


def die_with_parent() -> None:
    """A rank outlives a killed torchrun otherwise (Linux PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:
        os._exit(1)


def args(doc: str, **extra: tuple[type, object]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=doc)
    p.add_argument("--ckpt-dir", required=True, help="where checkpoints go (the slow mount)")
    p.add_argument("--model-mb", type=float, default=4.0, help="fp32 weights, MiB")
    p.add_argument("--pg-timeout", type=float, default=90.0, help="process group timeout, s")
    for name, (typ, default) in extra.items():
        p.add_argument("--" + name.replace("_", "-"), type=typ, default=default)
    a = p.parse_args()
    die_with_parent()
    import torch
    torch.set_num_threads(1)
    return a


def dim_for(model_mb: float, layers: int) -> int:
    """Width of ``layers`` square Linear layers holding about model_mb MiB."""
    return max(16, int((model_mb * 2**20 / (4 * layers)) ** 0.5))
