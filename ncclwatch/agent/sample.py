"""Cheap per-rank samples from /proc through psutil.

One ``oneshot()`` per rank per round: CPU time, RSS, I/O, threads, and the
regular files open for writing (a checkpoint being written shows here, with
its size). A process that exits mid-sample yields None, never an exception.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import psutil

log = logging.getLogger(__name__)

MAX_FILES = 8
_WRITE_MODES = frozenset({"w", "a", "r+", "w+", "a+"})
_SKIP_PREFIXES = ("/dev/", "/proc/", "/sys/")


@dataclass(frozen=True, slots=True)
class OpenFile:
    path: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class ProcessSample:
    pid: int
    cpu_seconds: float
    rss_bytes: int
    io_read_bytes: int
    io_write_bytes: int
    num_threads: int
    files_writing: tuple[OpenFile, ...]


class ProcessSampler:
    """Reads one ProcessSample per pid; counts what it could not read."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}
        self.errors_total = 0

    def sample(self, pid: int, *, with_files: bool = True) -> ProcessSample | None:
        proc = self._procs.get(pid)
        if proc is None:
            try:
                proc = self._procs[pid] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                return None
        try:
            with proc.oneshot():
                cpu = proc.cpu_times()
                mem = proc.memory_info()
                threads = proc.num_threads()
                try:
                    io = proc.io_counters()
                    # chars = bytes passed to read/write syscalls: what the
                    # process pushed, before the page cache hides it.
                    rd, wr = io.read_chars, io.write_chars
                except (psutil.AccessDenied, AttributeError):
                    rd = wr = 0
                files = _files_writing(proc) if with_files else ()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            self.forget(pid)
            return None
        except (psutil.AccessDenied, OSError) as e:
            self.errors_total += 1
            log.debug("cannot sample pid %d: %s", pid, e)
            return None
        return ProcessSample(
            pid=pid,
            cpu_seconds=cpu.user + cpu.system,
            rss_bytes=mem.rss,
            io_read_bytes=rd,
            io_write_bytes=wr,
            num_threads=threads,
            files_writing=files,
        )

    def forget(self, pid: int) -> None:
        self._procs.pop(pid, None)


def _files_writing(proc: psutil.Process) -> tuple[OpenFile, ...]:
    out = []
    try:
        handles = proc.open_files()
    except (psutil.AccessDenied, OSError):
        return ()
    for f in handles:
        if f.fd <= 2 or f.mode not in _WRITE_MODES or f.path.startswith(_SKIP_PREFIXES):
            continue
        try:
            size = os.stat(f.path).st_size
        except OSError:
            continue  # deleted or moved between listing and stat
        out.append(OpenFile(f.path, size))
    out.sort(key=lambda f: -f.size_bytes)
    return tuple(out[:MAX_FILES])
