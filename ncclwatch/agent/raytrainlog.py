"""A Ray Train worker's world rank, from Ray Train's own log of that worker.

Ray sets RANK inside a train worker after it starts, so its environment
never says the number. Ray Train (V2) keeps a system log per worker on the
worker's own node (``<session>/logs/train/ray-train-sys-worker-<id>.log``),
JSON lines each naming the writing ``process`` and its ``world_rank``,
``local_rank`` and ``node_rank``; the worker holds the file open for life.
The agent reads it through the worker's own descriptor (``/proc/PID/fd/N``:
the very file it writes, whatever its path means on the host), bounded, and
only while the worker is unnumbered. Only a descriptor the worker opened for
writing (its fdinfo flags: O_WRONLY or O_RDWR, not O_PATH) to a file the
worker's uid owns is read: a worker could hold, by path or read-only, a
planted file of that name that is not its log. Every node's agent reads its own
workers' logs: no node depends on another's.
"""

from __future__ import annotations

import json
import os
import re

from ncclwatch.agent import rankfs

#: rank_source of a number read there.
SOURCE = "ray_train_log"
#: The link text of the descriptor of a worker's Ray Train system log.
_SYS_LOG = re.compile(r"/logs/train/ray-train-sys-worker-[0-9a-f]{16,64}\.log\Z")
#: At most this much of the log is read (its first records name the rank).
READ_BYTES = 64 << 10
#: ``... [rank=1, world_size=3]``: Ray's "Setting up process group" message.
_WORLD = re.compile(r"\bworld_size=(\d{1,7})\]")


_O_PATH = getattr(os, "O_PATH", 0o10000000)
#: Access modes of a descriptor the worker writes through.
_WRITES = (os.O_WRONLY, os.O_RDWR)


def _fdinfo(pid: int, name: str, proc: str) -> tuple[int, int] | None:
    """(flags, inode or 0) of the worker's descriptor ``name``; None: unread."""
    flags, ino = None, 0
    try:
        with open(f"{proc}/{pid}/fdinfo/{name}") as f:
            for line in f.read(4096).splitlines():
                key, _, value = line.partition(":")
                if key == "flags":
                    flags = int(value.strip(), 8)
                elif key == "ino":
                    ino = int(value.strip())
    except (OSError, ValueError):
        return None
    return (flags, ino) if flags is not None else None


def _writes(flags: int) -> bool:
    return not flags & _O_PATH and flags & os.O_ACCMODE in _WRITES


def _uid(pid: int, proc: str) -> int | None:
    """The worker's effective uid (/proc/PID/status), the owner of what it makes."""
    try:
        with open(f"{proc}/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[2])
    except (OSError, ValueError, IndexError):
        pass
    return None


def log_fd(pid: int, proc: str = "/proc") -> tuple[str, int] | None:
    """(``/proc/PID/fd/N``, its inode or 0) of the worker's Ray Train system
    log, a descriptor it writes through; None: none."""
    for name, target in rankfs.fd_targets(pid, proc):
        if _SYS_LOG.search(target):
            info = _fdinfo(pid, name, proc)
            if info is not None and _writes(info[0]):
                return f"{proc}/{pid}/fd/{name}", info[1]
    return None


def parse(text: str, pids: frozenset[int]) -> tuple[int, int] | None:
    """(world rank, world size or 0) from the log's lines written by one of
    ``pids`` (the worker as its own PID namespace numbers it, and as the
    host does); None when no such line names one. Pure, for tests."""
    rank, world = None, 0
    for line in text.splitlines():
        if '"world_rank"' not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue   # a line cut at READ_BYTES
        if not isinstance(rec, dict) or rec.get("process") not in pids:
            continue
        r = rec.get("world_rank")
        if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < 1 << 24:
            continue
        if rank is not None and r != rank:
            return None   # two numbers for one process: neither is taken
        rank = r
        m = _WORLD.search(str(rec.get("message", "")))
        if m:
            world = int(m.group(1))
    return (rank, world) if rank is not None else None


def world_rank(pid: int, inner_pid: int = 0, proc: str = "/proc") -> tuple[int, int] | None:
    """(world rank, world size or 0) of Ray Train worker ``pid`` from its log."""
    found, uid = log_fd(pid, proc), _uid(pid, proc)
    if found is None or uid is None:
        return None
    name, ino = found
    try:
        opened = rankfs.open_named(name)
    except OSError:
        return None
    if opened is None:
        return None
    fd, st = opened
    try:
        if st.st_uid != uid or (ino and st.st_ino != ino):
            return None   # not the worker's own file, or not the descriptor judged
        data = os.pread(fd, READ_BYTES, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    pids = frozenset(p for p in (pid, inner_pid) if p > 0)
    return parse(data.decode("utf-8", errors="replace"), pids)
