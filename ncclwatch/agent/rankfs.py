"""A rank's files, reached the way the rank reaches them.

The agent runs as root in the host's mount namespace; a rank may live in its
own (a container, ``unshare -m``), where a path names another file than on
the host, and its paths are its owner's text. So a rank's file is only ever
reached through ``/proc/PID/fd/N`` (the very file it holds open) or through
its root, ``/proc/PID/root``, resolved with ``openat2(RESOLVE_IN_ROOT)``:
``..`` and absolute symlinks stay inside the rank's root, magic links
(``/proc/self/...``) are refused. Where the kernel has no ``openat2``
(before 5.6) the path is opened under ``/proc/PID/root`` with ``O_NOFOLLOW``
on the last component.

Files are opened ``O_NONBLOCK | O_NOCTTY``: opening a FIFO or a device a
rank swapped in never blocks, and the caller checks what it opened
(``fstat``), never the name.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import stat

#: openat2(2): syscall number (the same on x86_64 and aarch64) and resolve flags.
_SYS_OPENAT2 = 437
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10

_ROOTED = re.compile(r"^/proc/(\d+)/root(/.*)?$")
_libc = ctypes.CDLL(None, use_errno=True)
_have_openat2: bool | None = None


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


def _openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, 0, resolve)
    fd = _libc.syscall(_SYS_OPENAT2, dirfd, os.fsencode(path), ctypes.byref(how),
                       ctypes.sizeof(how))
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)
    return fd


def has_openat2() -> bool:
    global _have_openat2
    if _have_openat2 is None:
        try:
            os.close(_openat2(-100, "/", os.O_RDONLY | os.O_DIRECTORY, 0))  # AT_FDCWD
            _have_openat2 = True
        except OSError as e:
            _have_openat2 = e.errno not in (errno.ENOSYS, errno.EPERM)
    return _have_openat2


def root_path(pid: int, path: str) -> str:
    """``path`` as rank ``pid`` sees it, named from the host (for messages and
    for callers that open through ``open_rooted``)."""
    return f"/proc/{pid}/root{path}" if path.startswith("/") else f"/proc/{pid}/cwd/{path}"


def open_in_root(pid: int, path: str, flags: int = os.O_RDONLY) -> int:
    """An fd on ``path`` resolved inside rank ``pid``'s root (its mount
    namespace and chroot), never following a last-component symlink."""
    flags |= os.O_CLOEXEC | os.O_NOFOLLOW
    if not flags & _O_PATH:
        flags |= os.O_NONBLOCK | os.O_NOCTTY
    if not path.startswith("/"):
        raise OSError(errno.EINVAL, "a rank's path must be absolute", path)
    if has_openat2():
        root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return _openat2(root, path, flags, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
        finally:
            os.close(root)
    return os.open(root_path(pid, path), flags)


_O_PATH = getattr(os, "O_PATH", 0o10000000)


def _open_path(name: str) -> int:
    """An O_PATH fd on ``name``: it names the file without opening it (no
    device driver, no FIFO, no side effect), the last symlink not followed."""
    m = _ROOTED.match(name)
    if m:
        return open_in_root(int(m.group(1)), m.group(2) or "/", _O_PATH)
    return os.open(name, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)


def open_regular(name: str) -> tuple[int, os.stat_result] | None:
    """Open a regular file for reading, judging the file, not its name.

    ``name`` is a ``/proc/PID/root/...`` path (resolved inside the rank's
    root), a ``/proc/PID/fd/N`` link (the file the rank holds) or a plain path.
    The file is first named with O_PATH and checked (``fstat``: a regular
    file); only then is that very inode opened for reading, through
    ``/proc/self/fd``. A symlink, FIFO, socket or device is never opened.
    Returns (fd, stat) or None; OSError when it cannot be reached.
    """
    if name.startswith("/proc/") and "/fd/" in name and not _ROOTED.match(name):
        opath = os.open(name, _O_PATH | os.O_CLOEXEC)          # the rank's own open file
    else:
        opath = _open_path(name)
    try:
        st = os.fstat(opath)
        if not stat.S_ISREG(st.st_mode):
            return None
        fd = os.open(f"/proc/self/fd/{opath}",
                     os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    finally:
        os.close(opath)
    st2 = os.fstat(fd)
    if not stat.S_ISREG(st2.st_mode) or (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        return None
    return fd, st2


def newest_sibling(pid: int, directory: str, suffix: str, exclude: str,
                   uid: int | None) -> tuple[str, int]:
    """The most recently modified other regular ``*suffix`` file in the rank's
    ``directory`` (as the rank sees it), owned by ``uid`` (the rank's user;
    None: any): ("", 0) when there is none. Symlinks are not followed."""
    try:
        dfd = open_in_root(pid, directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return "", 0
    best: tuple[float, str, int] | None = None
    try:
        with os.scandir(dfd) as it:
            for e in it:
                path = directory.rstrip("/") + "/" + e.name
                if not e.name.endswith(suffix) or path == exclude:
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
                    continue
                if uid is not None and st.st_uid != uid:
                    continue
                if best is None or st.st_mtime > best[0]:
                    best = (st.st_mtime, path, st.st_size)
    except OSError:
        return "", 0
    finally:
        os.close(dfd)
    return (best[1], best[2]) if best else ("", 0)
