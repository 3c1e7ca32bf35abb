"""A rank's files are reached as the rank reaches them (issue 20, item 5).

A rank in its own mount namespace once made the agent stat the host's file
of a path and offer a host-only file as the "previous checkpoint"; the dump
watcher stat'ed a name and then opened it, so a swapped symlink made it open
a FIFO. Here: a real ``unshare -m`` rank, real symlinks, FIFOs and swaps.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import threading
import time

import pytest

from ncclwatch.agent import rankfs
from ncclwatch.agent.frpipe import DumpWatcher
from ncclwatch.agent.sample import ProcessSampler

#: The rank: mounts its own tmpfs over the checkpoint directory (visible only in
#: its namespace), writes an older checkpoint there, then holds a new one open.
_RANK = r"""
set -e
mount -t tmpfs ncclwatch-test "$1"
head -c 3000 /dev/zero > "$1/step1.pt"
touch -d '2020-01-01' "$1/step1.pt"
exec python3 -c '
import os, sys, time
f = open(os.path.join(sys.argv[1], "step2.pt"), "wb")
f.write(b"z" * 1234); f.flush()
print("ready", flush=True)
while True: time.sleep(1)
' "$1"
"""


@pytest.fixture
def namespaced_rank(tmp_path):
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is missing: it is in the base system")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    # The host's view of the same directory: a host-only secret, newer than
    # anything the rank wrote, in a 0700 directory; and a same-named step2.pt.
    (ckpt / "decoy.pt").write_bytes(b"k" * 777)
    (ckpt / "step2.pt").write_bytes(b"h" * 99)
    ckpt.chmod(0o700)
    p = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", _RANK, "rank",
                          str(ckpt)], stdout=subprocess.PIPE, start_new_session=True,
                         env={**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:"
                              f"{os.environ['PATH']}"})
    try:
        assert p.stdout.readline().strip() == b"ready"
        # the rank is the exec'd python (unshare and sh exec'd into it)
        yield p.pid, ckpt
    finally:
        p.kill()
        p.wait()


def test_a_namespaced_rank_is_sampled_in_its_own_namespace(namespaced_rank) -> None:
    pid, ckpt = namespaced_rank
    sample = None
    for _ in range(50):
        sample = ProcessSampler().sample(pid)
        if sample is not None and sample.files_writing:
            break
        time.sleep(0.1)
    assert sample is not None and sample.files_writing, sample
    (f,) = sample.files_writing
    assert f.path == str(ckpt / "step2.pt")
    assert f.size_bytes == 1234                     # the rank's file, not the host's (99)
    # the previous checkpoint is the rank's own, never the host's decoy
    assert f.previous_path == str(ckpt / "step1.pt") and f.previous_size_bytes == 3000
    assert "decoy" not in f.previous_path


def test_newest_sibling_reads_inside_the_rank_root_and_skips_other_users(namespaced_rank) -> None:
    pid, ckpt = namespaced_rank
    # the host's directory has decoy.pt (newest there); the rank's has none
    path, size = rankfs.newest_sibling(pid, str(ckpt), ".pt", exclude=str(ckpt / "step2.pt"),
                                       uid=None)
    assert (os.path.basename(path), size) == ("step1.pt", 3000)
    # a file of another user is never offered
    assert rankfs.newest_sibling(pid, str(ckpt), ".pt", exclude="", uid=12345) == ("", 0)


def test_a_path_is_resolved_inside_the_rank_root(namespaced_rank) -> None:
    pid, ckpt = namespaced_rank
    got = rankfs.open_regular(f"/proc/{pid}/root{ckpt}/step1.pt")
    assert got is not None
    fd, st = got
    os.close(fd)
    assert st.st_size == 3000
    with pytest.raises(OSError):                    # the host-only file is not there
        rankfs.open_regular(f"/proc/{pid}/root{ckpt}/decoy.pt")
    # '..' cannot climb out of the rank's root
    if rankfs.has_openat2():
        got = rankfs.open_regular(f"/proc/{pid}/root/../../../../{ckpt}/step1.pt")
        assert got is not None
        os.close(got[0])


# -- the dump watcher: the file is judged, not the name -------------------------------------

def _dump(tmp_path) -> bytes:
    return pickle.dumps({"version": "2.4", "pg_config": {}, "pg_status": {}, "entries": []})


def test_the_dump_watcher_never_opens_a_fifo_a_symlink_or_a_device(tmp_path) -> None:
    dump = tmp_path / "trace_rank_0"
    watcher = DumpWatcher([str(dump)], rank=0)
    # 1. a FIFO swapped in with nobody writing: an open by name would block or read it
    os.mkfifo(dump)
    done = threading.Event()
    out = []

    def poll():
        out.append(watcher.poll())
        done.set()
    threading.Thread(target=poll, daemon=True).start()
    assert done.wait(5), "the watcher blocked on a FIFO"
    assert out == [None]
    # 2. a symlink to a real, valid dump elsewhere (a file the rank may not read)
    os.unlink(dump)
    secret = tmp_path / "root-only"
    secret.write_bytes(_dump(tmp_path))
    os.symlink(secret, dump)
    assert watcher.poll() is None
    # 3. a symlink to a device
    os.unlink(dump)
    os.symlink("/dev/zero", dump)
    assert watcher.poll() is None
    # 4. the regular file torch writes is read
    os.unlink(dump)
    dump.write_bytes(_dump(tmp_path))
    got = watcher.poll()
    assert got is not None and got.path == str(dump)


# The swapper is a process of its own, not a thread: a thread shares the GIL
# with the opener and, on a loaded machine, may barely run while it opens
# (a CI run saw 24,442 opens and never the FIFO in 1.5 s).
SWAPPER = """
import os, sys
d = sys.argv[1]
name, regular, fifo = os.path.join(d, "swap"), os.path.join(d, "r"), os.path.join(d, "f")
i = 0
while True:
    tmp = os.path.join(d, "l%d" % (i % 3))
    try:
        if i % 3 == 0:
            os.link(regular, tmp)
        elif i % 3 == 1:
            os.link(fifo, tmp)
        else:
            os.symlink(regular, tmp)
        os.replace(tmp, name)
    except FileExistsError:
        pass
    i += 1
"""


def test_open_regular_checks_the_opened_file_even_when_the_name_is_swapped(tmp_path) -> None:
    """Swap a regular file, a FIFO and a symlink under one name as fast as
    possible while opening it: every open returns that regular file or
    nothing, and never blocks (a FIFO opened by name for reading would)."""
    name = tmp_path / "swap"
    regular, fifo = tmp_path / "r", tmp_path / "f"
    regular.write_bytes(b"x" * 10)
    os.mkfifo(fifo)
    ino = regular.stat().st_ino
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(tmp_path)])
    opened, refused = 0, 0
    try:
        # at least 1.5 s of swaps, and on until both outcomes were seen (30 s at most)
        start = time.monotonic()
        while time.monotonic() - start < 30:
            if time.monotonic() - start > 1.5 and opened and refused:
                break
            try:
                got = rankfs.open_regular(str(name))
            except OSError:
                continue                         # a symlink (ELOOP), mid-swap, not made yet
            if got is None:
                refused += 1                     # the FIFO: named, checked, never opened
                continue
            fd, st = got
            os.close(fd)
            assert st.st_ino == ino
            opened += 1
    finally:
        swapper.kill()
        swapper.wait()
    print(f"opened the regular file {opened} times, refused the FIFO {refused} times")
    assert opened > 0 and refused > 0

