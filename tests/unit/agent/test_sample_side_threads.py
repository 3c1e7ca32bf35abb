"""A rank's pipe-polling thread is no progress (agent/sample.py SIDE_THREADS).

torch's heartbeat monitor (``pt_nccl_heartbt``) reads the Flight Recorder's
debug-info pipe every second while the rank waits. Counted as progress, those
reads ended every still period of a rank with a live pipe, and its collective
hang was never flagged (a real gloo job under the agent showed it: found
without the pipe, never with it). A real process: its main thread blocks, a
thread polls a FIFO like torch's, named as torch names it or not.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from ncclwatch.agent.sample import ProcessSampler, side_thread_ids

POLLER = r"""
import ctypes, os, sys, threading, time
path = sys.argv[1]
os.mkfifo(path, 0o666)
fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
def poll():
    if sys.argv[2] == "named":
        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b"pt_nccl_heartbt"), 0, 0, 0)
    while True:
        time.sleep(0.1)       # ten polls a second: well past the still rate
        try:
            os.read(fd, 128)
        except BlockingIOError:
            pass
threading.Thread(target=poll, daemon=True).start()
print("up", flush=True)
threading.Event().wait()      # the main thread blocks, as in a barrier
"""


def _progress(pid: int, seconds: float) -> int:
    sampler = ProcessSampler()
    first = sampler.sample(pid, with_files=False)
    time.sleep(seconds)
    last = sampler.sample(pid, with_files=False)
    assert first is not None and last is not None
    return last.progress_events - first.progress_events


@pytest.mark.parametrize("name,counted", [("named", False), ("anonymous", True)])
def test_a_thread_named_as_torchs_pipe_reader_is_no_progress(tmp_path, name, counted) -> None:
    p = subprocess.Popen([sys.executable, "-c", POLLER, str(tmp_path / "pipe"), name],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "up"
        time.sleep(0.3)
        assert bool(side_thread_ids(p.pid)) is not counted
        moved = _progress(p.pid, 1.5)
        if counted:
            assert moved >= 5, moved          # the polls, as any other thread's calls
        else:
            assert moved <= 1, moved          # still: the reader's polls left out
    finally:
        p.kill()
        p.wait()
