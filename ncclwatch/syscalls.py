"""What a rank's thread is blocked in, from the kernel: system calls by number, in words (data).

The agent reads /proc/PID/task/TID/syscall (the number of the call the
thread sleeps in, "running" while it runs, "-1 ..." when it is in the
kernel outside any call: a page fault) and /proc/PID/task/TID/wchan (the
kernel function it sleeps in), names the number through the table of its own
architecture, and sends ``reading`` (``RankSample.blocked_in``). The daemon
reads it back with ``parse`` and says it with ``words``. Both ends import this
module; the agent never sends words, the daemon never sees a number it must
name for an architecture it does not run.

The numbers are the kernel's own: x86_64 from
arch/x86/entry/syscalls/syscall_64.tbl, aarch64 from the generic table
include/uapi/asm-generic/unistd.h that arm64 uses (tests/unit/test_syscalls.py
checks both against the installed kernel headers where they are).
"""

from __future__ import annotations

import platform
import re

#: Call name -> number, per architecture: the calls a rank can block in that
#: say something about what it waits for. Any other number is "syscall N".
NUMBERS: dict[str, dict[str, int]] = {
    "x86_64": {
        "read": 0, "write": 1, "poll": 7, "ioctl": 16, "pread64": 17, "pwrite64": 18,
        "readv": 19, "writev": 20, "select": 23, "sched_yield": 24, "pause": 34,
        "nanosleep": 35, "sendfile": 40, "connect": 42, "accept": 43, "sendto": 44,
        "recvfrom": 45, "sendmsg": 46, "recvmsg": 47, "wait4": 61, "fsync": 74,
        "fdatasync": 75, "futex": 202, "io_getevents": 208, "clock_nanosleep": 230,
        "epoll_wait": 232, "waitid": 247, "openat": 257, "pselect6": 270, "ppoll": 271,
        "epoll_pwait": 281, "accept4": 288, "preadv": 295, "pwritev": 296,
        "recvmmsg": 299, "sendmmsg": 307, "io_uring_enter": 426, "epoll_pwait2": 441,
        "futex_waitv": 449,
    },
    # asm-generic: no poll, select, epoll_wait, open or pause on arm64.
    "aarch64": {
        "io_getevents": 4, "epoll_pwait": 22, "ioctl": 29, "openat": 56, "read": 63,
        "write": 64, "readv": 65, "writev": 66, "pread64": 67, "pwrite64": 68,
        "preadv": 69, "pwritev": 70, "sendfile": 71, "pselect6": 72, "ppoll": 73,
        "fsync": 82, "fdatasync": 83, "waitid": 95, "futex": 98, "nanosleep": 101,
        "clock_nanosleep": 115, "sched_yield": 124, "accept": 202, "connect": 203,
        "sendto": 206, "recvfrom": 207, "sendmsg": 211, "recvmsg": 212, "accept4": 242,
        "recvmmsg": 243, "wait4": 260, "sendmmsg": 269, "io_uring_enter": 426,
        "epoll_pwait2": 441, "futex_waitv": 449,
    },
}
#: platform.machine() spellings of the same architectures.
ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}

#: Number -> name, per architecture.
NAMES: dict[str, dict[int, str]] = {
    arch: {n: name for name, n in table.items()} for arch, table in NUMBERS.items()}

#: What a thread blocked in a call is doing, by call (first word of the
#: clause's explanation). Calls not here are said by name alone.
MEANINGS: dict[str, str] = {
    **dict.fromkeys(("futex", "futex_waitv"), "waiting on a lock or condition"),
    **dict.fromkeys(("read", "readv", "pread64", "preadv"),
                    "reading a pipe, socket or file"),
    **dict.fromkeys(("write", "writev", "pwrite64", "pwritev", "sendfile"),
                    "writing a pipe, socket or file"),
    **dict.fromkeys(("poll", "ppoll", "select", "pselect6", "epoll_wait", "epoll_pwait",
                     "epoll_pwait2"), "waiting for a socket or pipe to be ready"),
    **dict.fromkeys(("nanosleep", "clock_nanosleep"), "asleep (a sleep or a retry loop)"),
    **dict.fromkeys(("recvfrom", "recvmsg", "recvmmsg"), "receiving from a socket"),
    **dict.fromkeys(("sendto", "sendmsg", "sendmmsg"), "sending to a socket"),
    **dict.fromkeys(("accept", "accept4"), "waiting for a connection"),
    "connect": "connecting to a peer",
    "openat": "opening a file",
    **dict.fromkeys(("fsync", "fdatasync"), "flushing a file to storage"),
    **dict.fromkeys(("wait4", "waitid"), "waiting for a child process"),
    "ioctl": "in a device call (a driver: GPU, NIC)",
    "sched_yield": "yielding the CPU (a spin loop)",
    "pause": "waiting for a signal",
    **dict.fromkeys(("io_getevents", "io_uring_enter"), "waiting for asynchronous I/O"),
}

#: Readings that are no call: the thread runs (on a CPU or runnable), or
#: sleeps in the kernel outside any call (a page fault: a memory-mapped file
#: on slow storage, swap).
RUNNING, NO_SYSCALL = "running", "no_syscall"
STATES: dict[str, str] = {
    RUNNING: "running",
    NO_SYSCALL: "in the kernel outside a system call (a page fault: a memory-mapped file "
                "or swap)",
}

#: The longest reading: a call and a kernel symbol (KSYM_NAME_LEN is 512).
MAX_READING = 600
_CALL = re.compile(r"[a-z0-9_]{1,32}|syscall [0-9]{1,5}")
_WCHAN = re.compile(r"[A-Za-z0-9_.$]{1,512}")


def arch(machine: str | None = None) -> str:
    """This machine's architecture as NUMBERS names it ("" when it has no table)."""
    m = machine if machine is not None else platform.machine()
    m = ALIASES.get(m, m)
    return m if m in NUMBERS else ""


def call_name(number: int, architecture: str) -> str:
    """The call ``number`` names on ``architecture``: its name, else "syscall N"."""
    return NAMES.get(architecture, {}).get(number) or f"syscall {number}"


def reading(syscall_text: str, wchan_text: str, architecture: str) -> str:
    """``RankSample.blocked_in`` from the two files' text: "running",
    "<call>" or "<call>/<wchan>" ("no_syscall" for "-1"); "" when unreadable."""
    fields = syscall_text.split()
    if not fields:
        return ""
    if fields[0] == "running":
        return RUNNING
    try:
        number = int(fields[0])
    except ValueError:
        return ""
    call = NO_SYSCALL if number < 0 else call_name(number, architecture)
    wchan = wchan_text.strip()
    return f"{call}/{wchan}" if wchan and wchan != "0" and _WCHAN.fullmatch(wchan) else call


def parse(value: str) -> tuple[str, str]:
    """(call, wchan) of a reading; ("", "") for one that is not a reading (a
    daemon never trusts the wire: anything else is unknown)."""
    if not value or len(value) > MAX_READING:
        return "", ""
    call, _, wchan = value.partition("/")
    if not _CALL.fullmatch(call) or (wchan and not _WCHAN.fullmatch(wchan)):
        return "", ""
    return call, wchan


def words(value: str) -> str:
    """A reading said for a person: "running", "blocked in read (pipe_read):
    reading a pipe, socket or file"; "" for none."""
    call, wchan = parse(value)
    if not call:
        return ""
    if call in STATES:
        return STATES[call] + (f" ({wchan})" if wchan else "")
    meaning = MEANINGS.get(call)
    return (f"blocked in {call}" + (f" ({wchan})" if wchan else "")
            + (f": {meaning}" if meaning else ""))


#: Calls that mean the thread sleeps on a timer: its own choice, no peer's.
SLEEPS = frozenset({"nanosleep", "clock_nanosleep"})


def asleep(value: str) -> bool:
    """A still rank's thread is asleep on a timer, waiting on no peer.

    Only for a rank that made no progress through its still period (no
    voluntary switches, no I/O): a wait that polls with short sleeps (NCCL's
    blocking wait sleeps 10 ms a loop) switches every time and is not still.
    Such a rank's native stack can add nothing (the agent does not pause it
    for one), and its stillness is decided without one (the daemon)."""
    return parse(value)[0] in SLEEPS
