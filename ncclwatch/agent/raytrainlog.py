"""A Ray Train worker's world rank, from Ray Train's own log of that worker.

Ray sets RANK inside a train worker after it starts, so its environment
never says the number. Ray Train (V2) keeps a system log per worker on the
worker's own node (``<session>/logs/train/ray-train-sys-worker-<id>.log``),
JSON lines each naming the writing ``process`` and its ``world_rank``,
``local_rank`` and ``node_rank``; the worker holds the file open for life.
The agent reads it through the worker's own descriptor (``/proc/PID/fd/N``:
the very file it writes, whatever its path means on the host), bounded, and
only while the worker is unnumbered. Every node's agent reads its own
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


def log_fd(pid: int, proc: str = "/proc") -> str | None:
    """``/proc/PID/fd/N`` of the worker's Ray Train system log, or None."""
    for name, target in rankfs.fd_targets(pid, proc):
        if _SYS_LOG.search(target):
            return f"{proc}/{pid}/fd/{name}"
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
    name = log_fd(pid, proc)
    if name is None:
        return None
    try:
        opened = rankfs.open_named(name)
    except OSError:
        return None
    if opened is None:
        return None
    fd, _ = opened
    try:
        data = os.pread(fd, READ_BYTES, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    pids = frozenset(p for p in (pid, inner_pid) if p > 0)
    return parse(data.decode("utf-8", errors="replace"), pids)
