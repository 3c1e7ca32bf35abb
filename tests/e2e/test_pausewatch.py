"""bench/pausewatch.py sees a real native dump's ptrace stop, and nothing else.

A real py-spy against a real Python process with torch loaded (the unwind of a
rank's native frames): ``--native`` stops it, ``--nonblocking`` never does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench.pausewatch import PauseWatch, traced
from tests.harness.tools import need

pytestmark = pytest.mark.e2e

CHILD = ("import threading, time, torch\n"
         "threading.Thread(target=lambda: time.sleep(600), daemon=True).start()\n"
         "print('up', flush=True)\n"
         "time.sleep(600)\n")


@pytest.fixture
def child():
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "up"
    yield p
    p.kill()
    p.wait(10)


def _dump(pid: int, *flags: str) -> None:
    r = subprocess.run([need("py-spy"), "dump", "--json", *flags, "--pid", str(pid)],
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()[-500:]


def test_nonblocking_dumps_are_no_pause(child) -> None:
    with PauseWatch({0: child.pid}, interval=0.005) as watch:
        for _ in range(5):
            _dump(child.pid, "--nonblocking")
    assert watch.pauses == [], watch.summary()
    assert traced(child.pid) == 0


def test_native_dump_is_a_pause_named_for_its_tracer(child) -> None:
    with PauseWatch({3: child.pid}, interval=0.005) as watch:
        for _ in range(5):  # one stop of a few ms could fall between two polls
            _dump(child.pid, "--native")
            if watch.pauses:
                break
            time.sleep(0.1)
    s = watch.summary()
    assert watch.pauses, "five native dumps, no stop seen"
    assert all(p.native_dump and p.rank == 3 and p.end is not None for p in watch.pauses), s
    assert s["native_dumps"] == s["pauses"] >= 1 and s["paused_seconds"] > 0, s
    # the py-spy was this test's child: attributed to it, and to no other process
    mine = watch.summary(by=os.getpid())
    assert mine["pauses"] == s["pauses"] and mine["by_others"] == 0, mine
    theirs = watch.summary(by=child.pid)
    assert theirs["pauses"] == 0 and theirs["by_others"] == s["pauses"], theirs
    assert traced(child.pid) == 0  # py-spy detached: running free again
