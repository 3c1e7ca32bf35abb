"""Every rank path resolves inside the rank's root (issue 29, item 2).

Reproductions: the Flight Recorder pipe trigger did ``os.lstat``/``os.open``
on ``/proc/PID/root/...`` with only the last component ``O_NOFOLLOW``, so an
absolute symlink in a middle component of the rank's pipe path resolved in
the host's root and the root agent wrote to the host's FIFO; the container's
``/etc/hostname`` was opened before its type was checked, so a FIFO or device
planted there was opened by the agent. Here: real symlinks (absolute,
relative, escaping) in every component, FIFOs and devices, a real chrooted
rank, and the kernel's own open events (inotify) to show that a FIFO or a
device is named but never opened; every case runs through both walks
(``openat2(RESOLVE_IN_ROOT)`` and the ``O_NOFOLLOW`` walk).
"""

from __future__ import annotations

import ctypes
import errno
import os
import pickle
import stat
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ncclwatch.agent import container, frpipe, rankfs

IN_OPEN = 0x20
_libc = ctypes.CDLL(None, use_errno=True)


@pytest.fixture(params=["openat2", "nofollow"])
def walk(request, monkeypatch):
    """Each test once per walk; the module's default is the walk under test."""
    if request.param == "openat2":
        if not rankfs.has_openat2():
            pytest.fail(f"this kernel ({os.uname().release}) has no openat2: "
                        "the openat2 walk cannot be tested here")
        fn = rankfs.walk_openat2
    else:
        fn = rankfs.walk_nofollow
    monkeypatch.setattr(rankfs, "default_walk", lambda: fn)
    return fn


class Opens:
    """The kernel's IN_OPEN events in a directory: what was really opened."""

    def __init__(self, directory: Path) -> None:
        self.fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0
        assert _libc.inotify_add_watch(self.fd, os.fsencode(directory), IN_OPEN) >= 0

    def names(self) -> list[str]:
        try:
            buf = os.read(self.fd, 65536)
        except BlockingIOError:
            return []
        out, i = [], 0
        while i < len(buf):
            _, mask, _, n = struct.unpack_from("iIII", buf, i)
            out.append(buf[i + 16:i + 16 + n].rstrip(b"\0").decode())
            i += 16 + n
        return out

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def tree(tmp_path):
    """A rank's root and, beside it, the host's secrets (a regular file, a FIFO)."""
    root, host = tmp_path / "root", tmp_path / "host"
    (root / "etc").mkdir(parents=True)
    (root / "dev").mkdir()
    (root / "etc" / "hostname").write_text("inside\n")
    host.mkdir()
    (host / "secret").write_text("SECRET\n")
    (root / "etc" / "abs").symlink_to("/etc")                       # absolute, stays inside
    (root / "etc" / "rel").symlink_to("../etc")                     # relative, stays inside
    (root / "up").symlink_to("../../../../../../../../" + str(host)[1:])   # climbs out
    (root / "hostabs").symlink_to(str(host))                        # a host path, absolute
    (root / "etc" / "loop").symlink_to("loop")
    (root / "etc" / "lastlink").symlink_to("hostname")
    os.mkfifo(root / "etc" / "fifo")
    os.mknod(root / "dev" / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    return root, host


def _read(root: Path, path: str, **kw) -> str | None:
    got = rankfs.open_under(str(root), path, **kw)
    if got is None:
        return None
    fd, _ = got
    try:
        return os.read(fd, 100).decode()
    finally:
        os.close(fd)


@pytest.mark.parametrize("path", [
    "/etc/hostname", "etc/hostname", "/../../../etc/hostname", "/etc/../../etc/hostname",
    "/etc/abs/hostname", "/etc/rel/hostname", "/etc/abs/rel/abs/hostname",
    "/etc/./rel/../etc/abs/hostname",
])
def test_symlinks_and_dotdot_in_every_component_stay_in_the_root(tree, walk, path) -> None:
    root, _ = tree
    assert _read(root, path) == "inside\n"


@pytest.mark.parametrize("path", [
    "/up/secret",                 # a relative link that climbs past the root
    "/hostabs/secret",            # an absolute link naming the host's directory
    "/etc/rel/../../up/secret",   # through two links and '..'
    "/etc/abs/../hostabs/secret",
])
def test_escaping_symlinks_resolve_inside_the_root_never_to_the_host(tree, walk, path) -> None:
    root, host = tree
    assert (host / "secret").read_text() == "SECRET\n"     # the host's file is there...
    with pytest.raises(FileNotFoundError):                 # ...and never reached
        _read(root, path)
    # The same name exists inside the root: that is the file found.
    inside = root / str(host)[1:]
    inside.mkdir(parents=True)
    (inside / "secret").write_text("rank's own\n")
    assert _read(root, path) == "rank's own\n"


def test_the_last_component_is_never_followed_and_loops_end(tree, walk) -> None:
    root, _ = tree
    assert _read(root, "/etc/lastlink") is None            # a symlink: named, not opened
    assert _read(root, "/etc/lastlink", follow_last=True) == "inside\n"
    with pytest.raises(OSError) as e:
        _read(root, "/etc/loop/x")
    assert e.value.errno == errno.ELOOP


def test_no_symlinks_refuses_a_link_in_any_component(tree, walk) -> None:
    root, _ = tree
    assert _read(root, "/etc/hostname", symlinks=False) == "inside\n"
    for path in ("/etc/abs/hostname", "/etc/rel/hostname", "/hostabs/secret"):
        with pytest.raises(OSError) as e:
            _read(root, path, symlinks=False)
        assert e.value.errno == errno.ELOOP, path


def test_magic_links_are_refused(walk) -> None:
    """/proc/PID/root inside a root that has /proc: a magic link out of any root."""
    with pytest.raises(OSError) as e:
        rankfs.open_under("/", f"/proc/{os.getpid()}/root/etc/hostname")
    assert e.value.errno in (errno.ELOOP, errno.EXDEV)


def test_fifos_and_devices_are_named_never_opened(tree, walk) -> None:
    root, _ = tree
    watch = [Opens(root / "etc"), Opens(root / "dev")]
    try:
        done = threading.Event()
        got: list[object] = []

        def look() -> None:
            for path in ("/etc/fifo", "/dev/null", "/etc/abs/fifo"):
                got.append(rankfs.open_under(str(root), path, rankfs.REGULAR))
            got.append(rankfs.open_under(str(root), "/dev/null", rankfs.FIFO, os.O_WRONLY))
            done.set()
        threading.Thread(target=look, daemon=True).start()
        assert done.wait(10), "a walk blocked on a FIFO"
        assert got == [None, None, None, None]
        assert [w.names() for w in watch] == [[], []]       # the kernel saw no open
        # the regular file next to them is opened (and the kernel says so)
        assert _read(root, "/etc/hostname") == "inside\n"
        assert watch[0].names() == ["hostname"]
    finally:
        for w in watch:
            w.close()


def test_a_container_hostname_planted_as_fifo_or_device_is_never_opened(tmp_path, walk) -> None:
    """container.read_in_root: the image's /etc/hostname is judged before any open."""
    proc = tmp_path / "proc"
    etc = proc / "7" / "root" / "etc"
    etc.mkdir(parents=True)
    watch = Opens(etc)
    try:
        os.mkfifo(etc / "hostname")
        assert container.read_in_root(7, "/etc/hostname", proc=str(proc)) == ""
        os.unlink(etc / "hostname")
        os.mknod(etc / "hostname", 0o600 | stat.S_IFCHR, os.makedev(1, 5))   # /dev/zero
        assert container.read_in_root(7, "/etc/hostname", proc=str(proc)) == ""
        assert watch.names() == []
        os.unlink(etc / "hostname")
        (etc / "hostname").write_text("trainer-0\n")
        assert container.read_in_root(7, "/etc/hostname", proc=str(proc)) == "trainer-0\n"
        assert watch.names() == ["hostname"]
    finally:
        watch.close()


# -- a real rank in its own root: the pipe trigger and the dump watcher -----------------------

@pytest.fixture
def chrooted(tmp_path):
    """A process whose root is ``tmp_path/root`` (chroot): /proc/PID/root is that
    directory, and an absolute symlink in it means a path inside it."""
    root = tmp_path / "root"
    root.mkdir()
    p = subprocess.Popen([sys.executable, "-c",
                          "import os, sys, time; os.chroot(sys.argv[1]); os.chdir('/'); "
                          "print('ready', flush=True); time.sleep(600)", str(root)],
                         stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert p.stdout.readline().strip() == b"ready"
        yield p.pid, root, tmp_path
    finally:
        p.kill()
        p.wait()


class Reader:
    """A FIFO held open for reading (as torch's DumpPipe holds it)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)

    def got(self) -> bytes:
        try:
            return os.read(self.fd, 128)
        except BlockingIOError:
            return b""


def test_the_pipe_trigger_resolves_a_middle_symlink_inside_the_rank_root(chrooted, walk) -> None:
    pid, root, tmp = chrooted
    host_dir = tmp / "hostdir"
    # The rank's TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/run/dbg/pipe_ ; in its root,
    # /run/dbg is an absolute symlink naming a directory that also exists on the host.
    host = Reader(host_dir / "pipe_0.pipe")          # the host's FIFO, with a reader
    (root / "run").mkdir()
    (root / "run" / "dbg").symlink_to(str(host_dir))
    env = {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/run/dbg/pipe_"}
    pipe = rankfs.root_path(pid, frpipe.pipe_path(env, 0))
    # No such FIFO inside the rank's root: nothing is written anywhere.
    assert frpipe.trigger(pipe) is False
    assert host.got() == b""
    # The rank's own FIFO at the symlink's target inside its root gets the byte.
    rank = Reader(root / str(host_dir)[1:] / "pipe_0.pipe")
    assert frpipe.trigger(pipe) is True
    assert rank.got() == b"1" and host.got() == b""
    # A relative link that climbs out lands inside the root too.
    (root / "run" / "dbg").unlink()
    (root / "run" / "dbg").symlink_to("../../../../../../../" + str(host_dir)[1:])
    assert frpipe.trigger(pipe) is True
    assert rank.got() == b"1" and host.got() == b""
    # A device where the FIFO should be is never opened for writing.
    os.unlink(root / str(host_dir)[1:] / "pipe_0.pipe")
    os.mknod(root / str(host_dir)[1:] / "pipe_0.pipe", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    watch = Opens(root / str(host_dir)[1:])
    try:
        assert frpipe.trigger(pipe) is False
        assert watch.names() == []
    finally:
        watch.close()


def test_the_dump_watcher_reads_only_inside_the_rank_root(chrooted, walk) -> None:
    pid, root, tmp = chrooted
    host_cache = tmp / "hostcache"
    host_cache.mkdir()
    dump = pickle.dumps({"version": "2.4", "pg_config": {}, "pg_status": {}, "entries": []})
    (root / "home").mkdir()
    (root / "home" / "cache").symlink_to(str(host_cache))
    path = rankfs.root_path(pid, "/home/cache/trace_rank_0")
    watcher = frpipe.DumpWatcher([path], rank=0)
    (host_cache / "trace_rank_0").write_bytes(dump)           # the host's file: never read
    assert watcher.poll() is None
    inside = root / str(host_cache)[1:]
    inside.mkdir(parents=True)
    (inside / "trace_rank_0").write_bytes(dump)               # the rank's own
    got = watcher.poll()
    assert got is not None and got.path == path


def test_the_previous_checkpoint_is_looked_for_only_inside_the_rank_root(chrooted, walk) -> None:
    """The checkpoint directory (rankfs.newest_sibling, the sampler's "previous
    checkpoint") walked like the pipe: a middle component that is an absolute
    symlink naming a host directory means that path inside the rank's root,
    and a FIFO or device named like a checkpoint is never offered."""
    pid, root, tmp = chrooted
    host_ck = tmp / "hostck"
    (host_ck / "run").mkdir(parents=True)
    (host_ck / "run" / "step2.pt").write_bytes(b"h" * 700)   # the host's: never offered
    (root / "data").mkdir()
    (root / "data" / "ck").symlink_to(str(host_ck))
    assert rankfs.newest_sibling(pid, "/data/ck/run", ".pt", exclude="", uid=None) == ("", 0)
    run = root / str(host_ck)[1:] / "run"
    run.mkdir(parents=True)
    (run / "step1.pt").write_bytes(b"r" * 300)
    os.mkfifo(run / "step9.pt")
    os.mknod(run / "step8.pt", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    assert rankfs.newest_sibling(pid, "/data/ck/run", ".pt", exclude="", uid=None) == \
        ("/data/ck/run/step1.pt", 300)
