"""Open a rank's debug-info FIFO for writing as the FIFO's owner.

torch makes the FIFO with ``mkfifo(0666)`` under the user's umask: usually
0644, owned by the training user. The agent is root without
CAP_DAC_OVERRIDE, so its own open for writing fails (EACCES) for every rank
not run by root. Here the calling thread's filesystem uid (``setfsuid(2)``:
the uid the kernel checks file permissions with, a per-thread credential)
becomes the FIFO's owner for one ``open`` of the inode the caller already
resolved and checked (``/proc/thread-self/fd/<O_PATH fd>``: no name the rank
chose is looked up), then goes back to what it was. While it differs from
0 the kernel clears this thread's filesystem capabilities
(CAP_DAC_READ_SEARCH among them), so the open is checked exactly as the
owner's would be; other threads never change identity.

Needs CAP_SETUID and the ``setfsuid`` system call (the systemd unit allows
that one call back after ``~@privileged``). Without them the kernel leaves
the fsuid as it was, which is noticed and reported as ``NoOwnerSwitch``.
Never used for a FIFO owned by root, nor for a FIFO not owned by the rank's
own user (the rank would be asking the agent to write to someone else's).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

__all__ = ["NoOwnerSwitch", "open_fifo"]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.setfsuid.argtypes = [ctypes.c_uint32]
_libc.setfsuid.restype = ctypes.c_int
_QUERY = 0xFFFFFFFF    # an invalid uid: setfsuid changes nothing, answers the current one

#: Said once by the agent when the switch is refused (a unit or pod without it).
NEEDS = ("the agent cannot open it as its owner: it needs CAP_SETUID and the setfsuid "
         "system call (the shipped systemd unit and DaemonSet grant both)")


class NoOwnerSwitch(PermissionError):
    """The kernel refused to switch the thread's filesystem uid (no CAP_SETUID,
    or a seccomp filter without setfsuid)."""


def _setfsuid(uid: int) -> int:
    """The fsuid before the call (setfsuid's answer; -1 under a seccomp EPERM)."""
    return _libc.setfsuid(uid)


def open_fifo(opath: int, st: os.stat_result, rank_uid: int, flags: int = os.O_WRONLY) -> int:
    """A non-blocking fd on the FIFO ``opath`` names (``st``: its fstat),
    opened as its owner. OSError as the owner's own open would raise (ENXIO:
    no reader, EACCES: the owner may not write either); NoOwnerSwitch when
    the switch was refused; PermissionError for a root- or stranger-owned FIFO."""
    if not stat.S_ISFIFO(st.st_mode):
        raise OSError(errno.EINVAL, "not a FIFO: never opened as its owner")
    if st.st_uid == 0:
        raise PermissionError(errno.EACCES, "owned by root: not opened as another user")
    if st.st_uid != rank_uid:
        raise PermissionError(errno.EACCES, f"owned by uid {st.st_uid}, not the rank's "
                                            f"user (uid {rank_uid}): not opened as its owner")
    before = _setfsuid(_QUERY)
    _setfsuid(st.st_uid)
    try:
        if _setfsuid(_QUERY) != st.st_uid:
            raise NoOwnerSwitch(errno.EPERM, NEEDS)
        fd = os.open(f"/proc/thread-self/fd/{opath}",
                     flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    finally:
        _setfsuid(before)
        if _setfsuid(_QUERY) != before:       # never happens: the real uid may always go back
            os.abort()
    st2 = os.fstat(fd)
    if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISFIFO(st2.st_mode):
        os.close(fd)
        raise OSError(errno.ESTALE, "the FIFO changed under the open")
    return fd
