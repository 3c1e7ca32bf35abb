"""/proc/PID/stat and /proc/PID/task/TID/stat, read one way.

The command name (field 2) is whatever the process set, spaces and
parentheses included, so the fields are counted after its last ``)``. Three
readers need them (a process's start for its identity and a pid guard, a
thread's CPU and state); this is the one parser.
"""

from __future__ import annotations

#: Field numbers as proc(5) counts them (1-based, the pid being 1).
STATE, UTIME, STIME, STARTTIME = 3, 14, 15, 22

_FIRST_AFTER_COMM = 3


def fields(pid: int, tid: int = 0, proc: str = "/proc") -> list[bytes]:
    """The stat fields of ``pid`` (or of its thread ``tid``) from field 3 on;
    ``field(fs, N)`` reads field N. Raises OSError (gone, unreadable) or
    ValueError (not a stat line)."""
    path = f"{proc}/{pid}/task/{tid}/stat" if tid else f"{proc}/{pid}/stat"
    with open(path, "rb") as f:
        raw = f.read()
    return raw[raw.rindex(b")") + 2:].split()


def field(fs: list[bytes], number: int) -> bytes:
    """Field ``number`` (proc(5)'s numbering) of what ``fields`` returned;
    IndexError if the line is short."""
    return fs[number - _FIRST_AFTER_COMM]


def start_ticks(pid: int, proc: str = "/proc") -> int:
    """When ``pid`` started, in clock ticks after boot (field 22): with the pid,
    the identity of one process (a reused pid has another start). Raises
    OSError, ValueError or IndexError where unread."""
    return int(field(fields(pid, proc=proc), STARTTIME))
