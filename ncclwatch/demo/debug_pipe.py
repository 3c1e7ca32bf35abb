"""gloo's stand-in for ProcessGroupNCCL's debug-info pipe (demo and tests only).

On NCCL, torch itself serves ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``: each rank
makes the FIFO ``<stem><rank>.pipe``, polls it every second, and on a byte
dumps its Flight Recorder to ``<TORCH_FR_DUMP_TEMP_FILE><rank>`` without
stopping training. gloo (the only backend on a machine without GPUs) records
the same Flight Recorder but has no pipe, so the demo job runs this thread,
which does exactly what torch's reader does (frpipe.py's docstring has the
details), with torch's own dump API. ncclwatch's agent cannot tell the
difference, which is the point: the live path is exercised for real.
"""

from __future__ import annotations

import os
import threading
import time


#: torch's heartbeat monitor thread, which polls the pipe (its comm name).
THREAD_NAME = b"pt_nccl_heartbt"


def _name_thread() -> None:
    """Name this OS thread as torch names its pipe reader (prctl PR_SET_NAME):
    the agent tells the reader's polls from progress by that name."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(15, ctypes.c_char_p(THREAD_NAME), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _serve(stem: str, prefix: str, rank: int) -> None:
    import torch

    _name_thread()

    path = f"{stem}{rank}.pipe"
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    os.mkfifo(path, 0o666)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    while True:
        time.sleep(1.0)  # TORCH_NCCL_COORD_CHECK_MILSEC
        try:
            got = os.read(fd, 128)
        except BlockingIOError:
            continue
        if got:
            trace = torch._C._distributed_c10d._dump_fr_trace()
            with open(f"{prefix}{rank}", "wb") as f:  # truncate and rewrite, as torch does
                f.write(trace)


def start(rank: int) -> bool:
    """Serve the pipe when the job's environment asks for one; True if started."""
    stem = os.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or \
        os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if not stem or not prefix or os.environ.get("TORCH_FR_BUFFER_SIZE", "0") in ("", "0"):
        return False
    threading.Thread(target=_serve, args=(stem, prefix, rank), daemon=True,
                     name=THREAD_NAME.decode()).start()
    return True
