"""A bandwidth-limited FUSE mount in a temp dir, for slow-storage tests (the ``throttlefs`` fixture).

Each framework writes its checkpoint through its own code path; a mount that
paces ``write`` slows all of them alike. The mount is served by a real
``python -m ncclwatch.demo.throttlefs`` process and always unmounted at
teardown, even when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from tests.harness.paths import ROOT


@dataclass
class Mounted:
    backing: Path  # where the bytes land (read it to check without the limit)
    mount: Path    # where the job writes (paced)
    proc: subprocess.Popen


def _unmount(path: Path, fusermount: str) -> None:
    for args in ([fusermount, "-u", str(path)], [fusermount, "-u", "-z", str(path)]):
        if not os.path.ismount(path):
            return
        for _ in range(10):
            if subprocess.run(args, capture_output=True).returncode == 0:
                return
            time.sleep(0.3)  # busy: a writer still has a file open


def _fusermount() -> str:
    fusermount = shutil.which("fusermount") or shutil.which("fusermount3")
    if fusermount is None or not os.path.exists("/dev/fuse"):
        pytest.fail("throttlefs needs /dev/fuse and fusermount: install Debian's `fuse3` "
                    "(make test does: apt-get install -y fuse3 libfuse2)")
    return fusermount


@contextlib.contextmanager
def mounted(write_rate: float | None = None, read_rate: float | None = None,
            sync_rate: float | None = None) -> Iterator[Mounted]:
    """A throttlefs mount in a new temp dir, unmounted and removed on exit."""
    fusermount = _fusermount()
    top = Path(tempfile.mkdtemp(prefix="throttlefs-"))
    backing, mnt = top / "backing", top / "mnt"
    backing.mkdir()
    mnt.mkdir()
    argv = [sys.executable, "-m", "ncclwatch.demo.throttlefs", str(backing), str(mnt)]
    if write_rate is not None:
        argv += ["--write-rate", str(write_rate)]
    if read_rate is not None:
        argv += ["--read-rate", str(read_rate)]
    if sync_rate is not None:
        argv += ["--sync-rate", str(sync_rate)]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 20
        while not os.path.ismount(mnt):
            if proc.poll() is not None or time.time() > deadline:
                out = proc.stdout.read() if proc.poll() is not None else "(still running)"
                pytest.fail(f"throttlefs did not mount {mnt}: {out}")
            time.sleep(0.05)
        yield Mounted(backing, mnt, proc)
    finally:
        _unmount(mnt, fusermount)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        shutil.rmtree(top, ignore_errors=True)

