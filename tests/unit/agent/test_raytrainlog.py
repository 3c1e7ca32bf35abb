"""A Ray Train worker's log is read only through a descriptor the worker
writes through, to a file its uid owns: before, any descriptor it held to a
file of that name was read, one opened by path (O_PATH) or read-only to a
planted file included. Real child processes hold real descriptors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ncclwatch.agent import raytrainlog

_HOLDER = """
import os, sys, time
path, how = sys.argv[1], sys.argv[2]
if how == "path":
    fd = os.open(path, os.O_PATH)
elif how == "read":
    fd = os.open(path, os.O_RDONLY)
else:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.write(fd, sys.argv[3].replace("PID", str(os.getpid())).encode() + b"\\n")
print("ready", flush=True)
time.sleep(60)
"""

_LINE = json.dumps({"message": "Setting up process group for: env:// [rank=2, world_size=4]",
                    "process": 0, "world_rank": 2}).replace('"process": 0', '"process": PID')


def _hold(tmp_path: Path, how: str) -> tuple[subprocess.Popen, Path]:
    path = tmp_path / how / "logs/train" / ("ray-train-sys-worker-" + "cd" * 28 + ".log")
    path.parent.mkdir(parents=True)
    path.write_text("")
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path), how, _LINE],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p, path


def test_only_a_descriptor_the_worker_writes_its_own_file_through_is_read(tmp_path) -> None:
    writer, _ = _hold(tmp_path, "write")
    held = [writer]
    try:
        assert raytrainlog.world_rank(writer.pid) == (2, 4)
        for how in ("path", "read"):
            p, path = _hold(tmp_path, how)
            held.append(p)
            path.write_text(_LINE.replace("PID", str(p.pid)) + "\n")   # planted, whole
            assert raytrainlog.world_rank(p.pid) is None, how
    finally:
        for p in held:
            p.kill()
            p.wait()


def test_a_write_descriptor_to_a_file_another_uid_owns_is_not_read(tmp_path) -> None:
    p, path = _hold(tmp_path, "write")
    try:
        assert raytrainlog.world_rank(p.pid) == (2, 4)
        os.chown(path, 4321, 4321)          # the worker writes a file not its own
        assert raytrainlog.world_rank(p.pid) is None
    finally:
        p.kill()
        p.wait()
