"""The debug-info FIFO of a rank run by another user, written by an agent with
the shipped capabilities: torch's mkfifo(0666) under umask 022 leaves it 0644,
which root without CAP_DAC_OVERRIDE may not open for writing. frpipe opens it
as its owner (asowner: setfsuid on one thread, CAP_SETUID); without CAP_SETUID
it says why instead of "nobody listens". Real processes, real credentials."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ncclwatch.agent import asowner
from tests.harness.paths import ROOT

NOBODY = 65534
#: The agent's process as the unit runs it, the capability granted by this change first.
UNIT_CAPS = ["setuid", "sys_ptrace", "dac_read_search"]

RANK = """
import os, sys, time
os.umask(0o022)
os.mkfifo(sys.argv[1], 0o666)                        # as torch's DumpPipe does
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)
print("up", flush=True)
deadline = time.time() + 30
while time.time() < deadline:
    try:
        got = os.read(fd, 128)
    except BlockingIOError:
        time.sleep(0.05)
        continue
    if got:
        print("got", got.decode(), flush=True)
        break
"""

AGENT = """
import sys
from ncclwatch.agent import frpipe
try:
    print("trigger", frpipe.trigger(sys.argv[1]))
except frpipe.PipeUnavailable as e:
    print("unavailable", e)
print("fsuid", open("/proc/thread-self/status").read().split("Uid:")[1].split()[3])
"""


@pytest.fixture
def home():
    if os.geteuid() != 0:
        pytest.fail("runs a rank as uid 65534 and the agent as root with fewer capabilities")
    d = Path(tempfile.mkdtemp(prefix="ncclwatch-asowner-", dir="/tmp"))
    os.chmod(d, 0o755)
    os.chown(d, NOBODY, NOBODY)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _rank(fifo: Path, uid: int = NOBODY) -> subprocess.Popen:
    p = subprocess.Popen(["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups",
                          sys.executable, "-c", RANK, str(fifo)],
                         stdout=subprocess.PIPE, text=True, cwd="/")
    assert p.stdout.readline().strip() == "up"
    return p


def _agent(caps: list[str], pipe: str) -> str:
    spec = ",".join(["-all"] + [f"+{c}" for c in caps])
    p = subprocess.run(["setpriv", "--bounding-set", spec, "--inh-caps", "-all", "--no-new-privs",
                        sys.executable, "-c", AGENT, pipe], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_the_agent_writes_a_users_0644_fifo_as_its_owner(home) -> None:
    fifo = home / "pipe_rank_0.pipe"
    rank = _rank(fifo)
    try:
        assert fifo.stat().st_mode & 0o777 == 0o644 and fifo.stat().st_uid == NOBODY
        out = _agent(UNIT_CAPS, f"/proc/{rank.pid}/root{fifo}")
        assert "trigger True" in out, out
        assert "fsuid 0" in out, out                   # the thread is itself again
        assert rank.stdout.readline().strip() == "got 1"
    finally:
        rank.kill()
        rank.wait()


def test_without_cap_setuid_the_agent_says_what_it_lacks(home) -> None:
    fifo = home / "pipe_rank_0.pipe"
    rank = _rank(fifo)
    try:
        out = _agent(UNIT_CAPS[1:], f"/proc/{rank.pid}/root{fifo}")
        assert "unavailable" in out and "CAP_SETUID" in out, out
        assert "fsuid 0" in out, out
    finally:
        rank.kill()
        rank.wait()


def test_no_reader_is_still_nobody_listening(home) -> None:
    fifo = home / "pipe_rank_0.pipe"
    rank = _rank(fifo)
    rank.kill()
    rank.wait()
    holder = subprocess.Popen(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY),
                               "--clear-groups", "sleep", "30"], cwd="/")
    try:
        time.sleep(0.3)
        assert "trigger False" in _agent(UNIT_CAPS, f"/proc/{holder.pid}/root{fifo}")
    finally:
        holder.kill()
        holder.wait()


def test_never_as_another_user_than_the_ranks(home) -> None:
    """A rank's pipe path that names another user's FIFO is not written as that user."""
    fifo = home / "pipe_rank_0.pipe"
    rank = _rank(fifo)
    other = subprocess.Popen(["setpriv", "--reuid", "65533", "--regid", "65533",
                              "--clear-groups", "sleep", "30"], cwd="/")
    try:
        time.sleep(0.3)
        out = _agent(UNIT_CAPS, f"/proc/{other.pid}/root{fifo}")
        assert "unavailable" in out and "not the rank's user" in out, out
        rank.kill()
        assert rank.wait() and rank.stdout.read() == ""    # it never got a byte
    finally:
        for p in (rank, other):
            p.kill()
            p.wait()


def test_refuses_root_owned_fifos_and_other_files(tmp_path) -> None:
    os.mkfifo(tmp_path / "root.pipe", 0o644)
    (tmp_path / "file").write_text("")
    for name, err in (("root.pipe", "owned by root"), ("file", "not a FIFO")):
        fd = os.open(tmp_path / name, os.O_PATH)
        try:
            with pytest.raises(OSError, match=err):
                asowner.open_fifo(fd, os.fstat(fd), 1000)
        finally:
            os.close(fd)
