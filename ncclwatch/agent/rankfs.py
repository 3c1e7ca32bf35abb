"""A rank's files, reached the way the rank reaches them, and only inside its root.

The agent runs as root in the host's mount namespace; a rank may live in its
own (a container, ``unshare -m``), where a path names another file than on
the host, and its paths are its owner's text. So a rank's file is only ever
reached through ``/proc/PID/fd/N`` (the very file it holds open) or by a walk
that starts at a directory fd of its root, ``/proc/PID/root``, and never
leaves it: ``..`` stops at the root, an absolute symlink in any component
starts again at the root, a magic link (``/proc/self/...``) is refused.

Two walks do that, the same rules for both (the tests run both):

* ``openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`` where the kernel has it
  (5.6+; the kernel itself keeps every step inside the root, moves included);
* else a component-by-component walk, each step ``openat(O_PATH|O_NOFOLLOW)``
  from the previous directory's fd; ``..`` pops the walk's own stack of fds
  (never the kernel's ``..``), a symlink's text is read and walked again from
  the root (absolute) or the current directory (relative), 40 hops at most,
  and a symlink on procfs (a magic link) is refused.

The walk yields an ``O_PATH`` fd: it names the file without opening it (no
FIFO blocks, no device driver runs). Its type is checked (``fstat``) and
only then is that very inode opened for what the caller needs, through
``/proc/self/fd/N``, ``O_NONBLOCK | O_NOCTTY``, and checked again.

``symlinks=False`` refuses a symlink anywhere (a container's ``/etc/hostname``:
nothing there needs one). The last component is never followed unless
``follow_last``: a dump file or a FIFO is the name itself, never a link.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import stat
from collections.abc import Callable

#: openat2(2): syscall number (the same on x86_64 and aarch64) and resolve flags.
_SYS_OPENAT2 = 437
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_IN_ROOT = 0x10
#: statfs(2) f_type of procfs, where every symlink may be a magic link.
PROC_SUPER_MAGIC = 0x9FA0
#: Symlinks followed in one walk, as the kernel's MAXSYMLINKS.
MAX_HOPS = 40

_O_PATH = getattr(os, "O_PATH", 0o10000000)
_ROOTED = re.compile(r"^/proc/(\d+)/(root|cwd)(/.*)?$")
_OWN_FD = re.compile(r"^/proc/(\d+|self)/fd/\d+$")
_libc = ctypes.CDLL(None, use_errno=True)
_have_openat2: bool | None = None

#: What a caller wants to find at the end of a walk: checked before any open.
REGULAR: Callable[[int], bool] = stat.S_ISREG
FIFO: Callable[[int], bool] = stat.S_ISFIFO
DIRECTORY: Callable[[int], bool] = stat.S_ISDIR

Walk = Callable[[int, str, bool, bool], int]


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


def walk_openat2(root: int, path: str, symlinks: bool = True, follow_last: bool = False) -> int:
    """An O_PATH fd on ``path`` resolved by the kernel inside ``root``."""
    resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | (0 if symlinks else RESOLVE_NO_SYMLINKS)
    flags = _O_PATH | (0 if follow_last else os.O_NOFOLLOW)
    return _openat2(root, path, flags, resolve)


class _statfs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 256)]


def _on_procfs(fd: int) -> bool:
    buf = _statfs()
    if _libc.fstatfs(fd, ctypes.byref(buf)) != 0:
        return True                      # unknown: treated as the unsafe case
    return buf.f_type == PROC_SUPER_MAGIC


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p and p != "."]


def walk_nofollow(root: int, path: str, symlinks: bool = True, follow_last: bool = False) -> int:
    """An O_PATH fd on ``path`` resolved inside ``root`` one component at a
    time, each ``O_NOFOLLOW`` (for kernels without openat2)."""
    stack = [os.dup(root)]               # the directories walked, root first
    todo = list(reversed(_parts(path)))
    hops = 0
    try:
        while todo:
            part = todo.pop()
            if part == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                continue
            fd = os.open(part, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=stack[-1])
            mode = os.fstat(fd).st_mode
            last = not todo
            if stat.S_ISLNK(mode) and (follow_last or not last):
                os.close(fd)
                if not symlinks or _on_procfs(stack[-1]):
                    raise OSError(errno.ELOOP, "symlink refused", path)
                hops += 1
                if hops > MAX_HOPS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                target = os.readlink(part, dir_fd=stack[-1])
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop())
                todo.extend(reversed(_parts(target)))
                continue
            if last:
                return fd
            if not stat.S_ISDIR(mode):
                os.close(fd)
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            stack.append(fd)
        return os.dup(stack[-1])         # "/", or a path that ended in ".."
    finally:
        for fd in stack:
            os.close(fd)


def default_walk() -> Walk:
    return walk_openat2 if has_openat2() else walk_nofollow


def root_path(pid: int, path: str) -> str:
    """``path`` as rank ``pid`` sees it, named from the host (for messages and
    for ``open_named``: ``/proc/PID/root/...``, relative ones under ``cwd``)."""
    return f"/proc/{pid}/root{path}" if path.startswith("/") else f"/proc/{pid}/cwd/{path}"


def _reopen(opath: int, kind: Callable[[int], bool], flags: int
            ) -> tuple[int, os.stat_result] | None:
    """The inode ``opath`` names, opened with ``flags`` only if it is ``kind``."""
    st = os.fstat(opath)
    if not kind(st.st_mode):
        return None
    if flags & _O_PATH:
        return os.dup(opath), st
    fd = os.open(f"/proc/self/fd/{opath}", flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    st2 = os.fstat(fd)
    if not kind(st2.st_mode) or (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        return None
    return fd, st2


def open_under(base: str, path: str, kind: Callable[[int], bool] = REGULAR,
               flags: int = os.O_RDONLY, *, symlinks: bool = True,
               follow_last: bool = False, walk: Walk | None = None
               ) -> tuple[int, os.stat_result] | None:
    """(fd, stat) of ``path`` resolved inside the directory ``base`` (a rank's
    root), opened with ``flags`` once it was seen to be ``kind``; None when it
    is another kind of file. OSError when it cannot be reached."""
    walk = walk or default_walk()
    root = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        opath = walk(root, path, symlinks, follow_last)
    finally:
        os.close(root)
    try:
        return _reopen(opath, kind, flags)
    finally:
        os.close(opath)


def open_in_root(pid: int, path: str, kind: Callable[[int], bool] = REGULAR,
                 flags: int = os.O_RDONLY, *, symlinks: bool = True,
                 follow_last: bool = False, proc: str = "/proc", walk: Walk | None = None
                 ) -> tuple[int, os.stat_result] | None:
    """``path`` as rank ``pid`` sees it (absolute: from its root; relative:
    from its working directory, ``..`` stopping there), see ``open_under``."""
    base = f"{proc}/{pid}/root" if path.startswith("/") else f"{proc}/{pid}/cwd"
    return open_under(base, path, kind, flags, symlinks=symlinks,
                      follow_last=follow_last, walk=walk)


def open_named(name: str, kind: Callable[[int], bool] = REGULAR, flags: int = os.O_RDONLY,
               *, walk: Walk | None = None) -> tuple[int, os.stat_result] | None:
    """Open a file by a name the agent made: ``/proc/PID/root/...`` or
    ``/proc/PID/cwd/...`` (walked inside the rank's root or working
    directory), ``/proc/PID/fd/N`` (the file the rank holds open) or a plain
    path (walked from this agent's root). The file is judged, never its name:
    a symlink at the end, a FIFO or a device where a regular file is wanted
    is never opened. (fd, stat), None for another kind, OSError when absent.
    """
    m = _ROOTED.match(name)
    if m:
        return open_under(f"/proc/{m.group(1)}/{m.group(2)}", m.group(3) or "/", kind, flags,
                          walk=walk)
    if _OWN_FD.match(name):
        opath = os.open(name, _O_PATH | os.O_CLOEXEC)           # the rank's own open file
        try:
            return _reopen(opath, kind, flags)
        finally:
            os.close(opath)
    return open_under("/", name, kind, flags, walk=walk)


def open_regular(name: str) -> tuple[int, os.stat_result] | None:
    """A regular file opened for reading by ``open_named``'s rules."""
    return open_named(name, REGULAR, os.O_RDONLY)


def newest_sibling(pid: int, directory: str, suffix: str, exclude: str,
                   uid: int | None) -> tuple[str, int]:
    """The most recently modified other regular ``*suffix`` file in the rank's
    ``directory`` (as the rank sees it), owned by ``uid`` (the rank's user;
    None: any): ("", 0) when there is none. Symlinks are not followed."""
    try:
        got = open_in_root(pid, directory, DIRECTORY, os.O_RDONLY | os.O_DIRECTORY,
                           follow_last=True)
    except OSError:
        return "", 0
    if got is None:
        return "", 0
    dfd = got[0]
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


#: At most this many of a rank's descriptors are looked at (fd_targets).
MAX_FDS = 4096


def fd_targets(pid: int, proc: str = "/proc"):
    """(fd name, link text) of the rank's open descriptors, at most MAX_FDS:
    the link texts only, nothing opened (a pipe's or a log's name says what
    it is). Empty when the rank is gone or its fds cannot be listed."""
    try:
        names = os.listdir(f"{proc}/{pid}/fd")
    except OSError:
        return
    for name in names[:MAX_FDS]:
        try:
            yield name, os.readlink(f"{proc}/{pid}/fd/{name}")
        except OSError:
            continue


def regular_in_root(pid: int, path: str, *, follow_last: bool = False,
                    proc: str = "/proc") -> bool:
    """``path`` names a regular file inside the rank's root (walked as
    ``open_in_root`` walks; named with ``O_PATH``, never opened)."""
    try:
        got = open_in_root(pid, path, REGULAR, _O_PATH, follow_last=follow_last, proc=proc)
    except OSError:
        return False
    if got is None:
        return False
    os.close(got[0])
    return True
