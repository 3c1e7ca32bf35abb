"""Slow storage for any writer: a FUSE passthrough with a bandwidth limit.

``slow_storage`` paces bytes inside a file object that the demo hands to
torch.save; the frameworks (Lightning, transformers, accelerate, DeepSpeed)
open their own files, through their own paths (fsspec transactions, a move
across filesystems, safetensors). Mounting a directory whose ``write`` sleeps
slows all of them exactly where real slow storage would, with no patching:
each rank's stack during the save is the framework's real one, blocked in
the kernel on a write (or a sendfile) to this mount.

    python -m ncclwatch.demo.throttlefs BACKING MOUNT --write-rate 2000000

``--sync-rate`` models a page cache in front of slower storage: every byte
written is also owed to the "disk" at that rate, and ``fsync`` waits until
the disk has caught up (a write returns at ``--write-rate``; the close does
not wait, as with a real page cache).

runs in the foreground until SIGINT/SIGTERM or ``fusermount -u MOUNT``.
"""

from __future__ import annotations

import argparse
import errno
import os
import threading
import time

from fuse import FUSE, FuseOSError, Operations


class Pacer:
    """A shared bandwidth budget: each transfer reserves its slot, then sleeps to it.

    Reservations are serial across threads, so concurrent writers share
    ``rate`` bytes/s rather than getting it each.
    """

    def __init__(self, rate: float | None):
        if rate is not None and rate <= 0:
            raise ValueError(f"rate must be > 0 bytes/s, got {rate}")
        self.rate = rate
        self._lock = threading.Lock()
        self._free_at = 0.0  # monotonic time the link is next idle

    def account(self, n: int) -> None:
        if self.rate is None or n <= 0:
            return
        with self._lock:
            start = max(time.monotonic(), self._free_at)
            self._free_at = start + n / self.rate
            due = self._free_at
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)


class Backlog:
    """Dirty bytes draining to the storage at ``rate``: when all are down."""

    def __init__(self, rate: float | None):
        if rate is not None and rate <= 0:
            raise ValueError(f"rate must be > 0 bytes/s, got {rate}")
        self.rate = rate
        self._lock = threading.Lock()
        self._clean_at = 0.0

    def add(self, n: int) -> None:
        if self.rate is None or n <= 0:
            return
        with self._lock:
            self._clean_at = max(time.monotonic(), self._clean_at) + n / self.rate

    def wait(self) -> None:
        with self._lock:
            due = self._clean_at
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)


class ThrottleFS(Operations):
    """Passthrough of ``root``; ``write`` (and ``read``) paced by a Pacer,
    ``fsync`` by the Backlog of written bytes (``sync_rate``)."""

    use_ns = True

    def __init__(self, root: str, write_rate: float | None, read_rate: float | None = None,
                 sync_rate: float | None = None):
        self.root = os.path.realpath(root)
        self.writes = Pacer(write_rate)
        self.reads = Pacer(read_rate)
        self.backlog = Backlog(sync_rate)

    def _full(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def __call__(self, op, path, *args):
        # OSError from the backing filesystem goes back to the caller as its errno.
        try:
            return super().__call__(op, self._full(path) if isinstance(path, str) else path,
                                    *args)
        except OSError as e:
            if isinstance(e, FuseOSError):
                raise
            raise FuseOSError(e.errno or errno.EIO) from e

    # -- metadata
    def access(self, path, mode):
        if not os.access(path, mode):
            raise FuseOSError(errno.EACCES)

    def getattr(self, path, fh=None):
        st = os.lstat(path)
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime_ns",
                "st_mtime_ns", "st_ctime_ns")
        out = {k: getattr(st, k) for k in keys}
        for k in ("st_atime", "st_mtime", "st_ctime"):
            out[k] = out.pop(k + "_ns")
        return out

    def statfs(self, path):
        st = os.statvfs(path)
        return {k: getattr(st, k) for k in (
            "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files",
            "f_flag", "f_frsize", "f_namemax")}

    def chmod(self, path, mode):
        os.chmod(path, mode)

    def chown(self, path, uid, gid):
        os.chown(path, uid, gid)

    def utimens(self, path, times=None):
        os.utime(path, ns=times) if times else os.utime(path)

    def readlink(self, path):
        return os.readlink(path)

    def readdir(self, path, fh):
        return [".", "..", *os.listdir(path)]

    # -- namespace
    def mkdir(self, path, mode):
        os.mkdir(path, mode)

    def rmdir(self, path):
        os.rmdir(path)

    def unlink(self, path):
        os.unlink(path)

    def symlink(self, target, source):
        # fusepy passes (link path, what it points to); only the link is ours.
        os.symlink(source, target)

    def rename(self, old, new):
        os.rename(old, self._full(new))

    def link(self, target, source):
        os.link(self._full(source), target)

    def mknod(self, path, mode, dev):
        os.mknod(path, mode, dev)

    # -- file data
    def open(self, path, flags):
        return os.open(path, flags)

    def create(self, path, mode, fi=None):
        return os.open(path, os.O_RDWR | os.O_CREAT, mode)

    def read(self, path, size, offset, fh):
        data = os.pread(fh, size, offset)
        self.reads.account(len(data))
        return data

    def write(self, path, data, offset, fh):
        self.writes.account(len(data))
        self.backlog.add(len(data))
        return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):
        if fh is None:
            os.truncate(path, length)
        else:
            os.ftruncate(fh, length)

    def flush(self, path, fh):
        return 0

    def fsync(self, path, datasync, fh):
        self.backlog.wait()
        (os.fdatasync if datasync else os.fsync)(fh)
        return 0

    def release(self, path, fh):
        os.close(fh)
        return 0


def mount(backing: str, mountpoint: str, write_rate: float | None,
          read_rate: float | None = None, sync_rate: float | None = None) -> None:
    """Serve until unmounted or signalled (fuse_main handles SIGINT/SIGTERM)."""
    FUSE(ThrottleFS(backing, write_rate, read_rate, sync_rate), mountpoint, foreground=True,
         nothreads=False, big_writes=True, max_write=131072, fsname="throttlefs",
         # reads must reach us to be paced, not come from the page cache
         direct_io=read_rate is not None)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m ncclwatch.demo.throttlefs",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("backing", help="directory whose files are served")
    ap.add_argument("mount", help="empty directory to mount on")
    ap.add_argument("--write-rate", type=float, default=None, help="bytes/s (default: unlimited)")
    ap.add_argument("--read-rate", type=float, default=None, help="bytes/s (default: unlimited)")
    ap.add_argument("--sync-rate", type=float, default=None,
                    help="bytes/s the storage behind the cache takes; fsync waits for it "
                         "(default: unlimited)")
    a = ap.parse_args(argv)
    mount(a.backing, a.mount, a.write_rate, a.read_rate, a.sync_rate)


if __name__ == "__main__":
    main()
