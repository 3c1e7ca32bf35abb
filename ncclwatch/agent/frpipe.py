"""Ask a running rank for a Flight Recorder dump through its debug-info pipe.

What torch does (ProcessGroupNCCL.hpp ``DumpPipe``, ProcessGroupNCCL.cpp
``HeartbeatMonitor::runLoop``): with ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<stem>``
and a non-zero trace buffer, the default process group (uid 0) of each rank
unlinks ``<stem><global_rank>.pipe``, ``mkfifo``\\ s it (0666) and keeps it open
``O_RDONLY | O_NONBLOCK``. Its heartbeat monitor reads up to 128 bytes from it
every ``TORCH_NCCL_COORD_CHECK_MILSEC`` (1 s) when dump-on-timeout is on, else
every ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`` (480 s); any byte read launches an
asynchronous dump and training goes on. The dump is written by
``DebugInfoWriter::write`` with a plain ``std::ofstream``: the file
``<prefix><global_rank>`` is truncated and rewritten in place, so a reader can
see it half-written. The prefix is ``TORCH_FR_DUMP_TEMP_FILE`` or
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, by default ``/tmp/nccl_trace_rank_``
(torch <= 2.6), ``$HOME/.cache/torch/nccl_trace_rank_`` (2.7, 2.8), then
``${XDG_CACHE_HOME:-$HOME/.cache}/torch/comm_lib_trace_rank_`` (2.9+); with
``TORCH_FR_DUMP_DYNAMIC_FILE_NAME=1`` the file is ``TORCH_FR_DUMP_TEMP_FILE``
itself.

So: remember the dump file's identity, write one byte to the FIFO (never
blocking: ``O_WRONLY | O_NONBLOCK``; ENXIO means no process holds it open),
and poll until the file was rewritten and is a complete pickle.

The paths here are the ones the training process sees. The agent runs as root
next to other users' processes, possibly in other mount namespaces: callers
name them through ``/proc/<pid>/root`` (``frprobe``), and the dump watcher
and the trigger resolve such names inside the rank's root, every component
(``rankfs``: ``openat2(RESOLVE_IN_ROOT)`` or an ``O_NOFOLLOW`` walk, O_PATH
first, the file checked with ``fstat``, never the name). Writing
one byte into a FIFO is harmless; this module never writes anything else, and
refuses a path that is not a FIFO (a regular file, a device, a symlink).

gloo (the CPU backend) has no debug-info pipe: the tests run a small reader
thread in each gloo rank that does exactly what ``DumpPipe`` does.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import re
import select
import time
from collections.abc import Mapping, Sequence

from ncclwatch.agent import asowner, rankfs
from ncclwatch.flightrec import (
    MAX_DUMP_BYTES,
    FlightRecorderError,
    FrDump,
    loads_dump,
    rank_from_path,
)

log = logging.getLogger(__name__)

__all__ = [
    "DumpWatcher",
    "PipeUnavailable",
    "dump_candidates",
    "dump_path",
    "pipe_path",
    "request_dump",
    "trigger",
]

DEFAULT_TIMEOUT_SECONDS = 3.0
_TRUE = ("1", "true", "yes", "on", "y", "t")


class PipeUnavailable(Exception):
    """The debug-info pipe cannot be used (not configured, or an OS error that
    needs a person: permission denied, ...). "Nobody is listening" is not this:
    trigger() answers False and request_dump() None for that. ``reason``: the
    part that is the same for every rank (the agent says it once)."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


def _version_tuple(v: str | Sequence[int] | None) -> tuple[int, int] | None:
    if v is None:
        return None
    if isinstance(v, str):
        parts = v.split("+", 1)[0].split(".")
        try:
            return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
        except ValueError:
            return None
    return int(v[0]), int(v[1]) if len(v) > 1 else 0


def _buffer_disabled(env: Mapping[str, str]) -> bool:
    """True only when the trace buffer is explicitly 0 (getCvarInt's order: FR first)."""
    for key in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        val = env.get(key)
        if val is not None and val.strip() != "":
            try:
                return int(val) <= 0
            except ValueError:
                return False
    return False


def pipe_path(env: Mapping[str, str], rank: int) -> str | None:
    """``<TORCH_NCCL_DEBUG_INFO_PIPE_FILE><global rank>.pipe``; None when the
    variable is unset or empty, or the trace buffer is explicitly 0 (torch then
    creates no pipe). When the buffer size is not set at all the path is given:
    torch < 2.11 then has no buffer and no FIFO, and trigger() answers False."""
    stem = env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "")
    if not stem or _buffer_disabled(env):
        return None
    return f"{stem}{rank}.pipe"


def pipe_rank(pid: int, stem: str, proc: str = "/proc") -> int | None:
    """The global rank in the name of the debug-info pipe rank ``pid`` holds
    open (``<stem><rank>.pipe``: torch names it by the rank's number), or None.
    Only the descriptors' link texts are read; nothing is opened."""
    if not stem:
        return None
    for _name, target in rankfs.fd_targets(pid, proc):
        tail = target[len(stem):-len(".pipe")] if target.startswith(stem) \
            and target.endswith(".pipe") else ""
        if tail.isascii() and tail.isdigit() and len(tail) <= 9:
            return int(tail)
    return None


def _cache_root(env: Mapping[str, str], *, xdg: bool) -> str:
    if xdg and env.get("XDG_CACHE_HOME"):
        return env["XDG_CACHE_HOME"]
    return (env.get("HOME") or "/tmp") + "/.cache"


def dump_candidates(env: Mapping[str, str], rank: int,
                    torch_version: str | Sequence[int] | None = None) -> list[str]:
    """Every file the rank may write its dump to, the likeliest first."""
    dynamic = env.get("TORCH_FR_DUMP_DYNAMIC_FILE_NAME", "").strip().lower() in _TRUE
    out: list[str] = []
    fr, nccl = env.get("TORCH_FR_DUMP_TEMP_FILE"), env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if dynamic and fr:
        out.append(fr)
    if fr:
        out.append(f"{fr}{rank}")
    if nccl:
        out.append(f"{nccl}{rank}")   # torch before TORCH_FR_DUMP_TEMP_FILE reads only this one
    if not out:
        v = _version_tuple(torch_version)
        newest = [f"{_cache_root(env, xdg=True)}/torch/comm_lib_trace_rank_{rank}",
                  f"{_cache_root(env, xdg=False)}/torch/comm_lib_trace_rank_{rank}"]
        middle = [f"{_cache_root(env, xdg=False)}/torch/nccl_trace_rank_{rank}"]
        oldest = [f"/tmp/nccl_trace_rank_{rank}"]
        if v is None or v >= (2, 9):
            out = newest + middle + oldest
        elif v >= (2, 7):
            out = middle + newest + oldest
        else:
            out = oldest + middle + newest
    seen: set[str] = set()
    return [p for p in out if not (p in seen or seen.add(p))]


def dump_path(env: Mapping[str, str], rank: int,
              torch_version: str | Sequence[int] | None = None) -> str:
    """The file the rank writes its dump to (the newest torch's default when
    the version is unknown); dump_candidates() lists the alternatives."""
    return dump_candidates(env, rank, torch_version)[0]


# ------------------------------------------------------------------ trigger


#: Errors that mean "no FIFO with a reader there": trigger() answers False.
_NOBODY = (errno.ENXIO, errno.ENOENT, errno.ELOOP, errno.ENOTDIR)
_RANK_PATH = re.compile(r"^/proc/(\d+)/(?:root|cwd)(?:/|$)")


def _open_fifo(pipe: str) -> int | None:
    """A non-blocking write fd on the FIFO, or None when there is no FIFO with a
    reader. ``pipe`` is walked inside the rank's root (``rankfs.open_named``:
    every component, not only the last), named with O_PATH and checked to be
    a FIFO before that very inode is opened for writing. torch's FIFO is the
    training user's, 0644 under the usual umask: where root may not write it
    the same inode is opened as its owner (``asowner``)."""
    try:
        got = rankfs.open_named(pipe, rankfs.FIFO, os.O_WRONLY)
    except OSError as e:
        if e.errno in _NOBODY:
            return None      # no reader / gone / a symlink where none may be
        if e.errno != errno.EACCES:
            raise PipeUnavailable(f"{pipe}: {e.strerror}", reason=e.strerror or "") from None
        return _open_as_owner(pipe)   # EACCES: it was a FIFO, root may not write it
    if got is None:
        log.warning("%s is not a FIFO: not writing to it", pipe)
        return None
    return got[0]


def _open_as_owner(pipe: str) -> int | None:
    """``_open_fifo``'s answer for a FIFO root may not write, opened as its
    owner. Only a rank's path (``/proc/PID/root/...``), and only a FIFO of
    that rank's user."""
    m = _RANK_PATH.match(pipe)
    try:
        if m is None:
            raise PermissionError(errno.EACCES, "not a rank's path: not opened as its owner")
        rank_uid = os.stat(f"/proc/{m.group(1)}").st_uid
        got = rankfs.open_named(pipe, rankfs.FIFO, os.O_PATH)
        if got is None:
            return None                # no longer a FIFO: never written
        opath, st = got
        try:
            return asowner.open_fifo(opath, st, rank_uid)
        finally:
            os.close(opath)
    except asowner.NoOwnerSwitch as e:
        raise PipeUnavailable(f"{pipe}: permission denied, and {e.strerror}",
                              reason=e.strerror) from None
    except OSError as e:
        if e.errno in _NOBODY:
            return None
        raise PipeUnavailable(f"{pipe}: {e.strerror}", reason=e.strerror or "") from None


def _write_byte(fd: int) -> bool:
    try:
        os.write(fd, b"1")
    except BlockingIOError:
        return True      # the pipe is full of unread requests: one is pending already
    except BrokenPipeError:
        return False     # the reader closed it between open and write
    return True


def trigger(pipe: str) -> bool:
    """Write one byte to the rank's debug-info FIFO. True when a live reader
    holds it open; False (at once, never blocking) when the path is missing,
    nobody reads it (ENXIO), or it is not a FIFO (never written to)."""
    fd = _open_fifo(pipe)
    if fd is None:
        return False
    try:
        return _write_byte(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------ watcher


def _sig(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns)


def _signature(path: str) -> tuple[int, int, int, int] | None:
    """The dump file's identity, judged on the file (O_PATH + fstat), never
    following a last symlink: None unless it is a regular file."""
    try:
        got = rankfs.open_regular(path)
    except OSError:
        return None
    if got is None:
        return None
    fd, st = got
    os.close(fd)
    return _sig(st)


def _read_open(fd: int, max_bytes: int) -> bytes | None:
    try:
        chunks, left = [], max_bytes + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)
    except OSError:
        return None


class DumpWatcher:
    """Notices a rewrite of a rank's dump file and returns it once complete.

    Made before the trigger: it remembers each candidate file's
    (mtime_ns, size, inode, ctime_ns). poll() returns the dump when a file's
    identity changed and its bytes load as a dump; a half-written file (torch
    truncates and rewrites in place) is tried again on the next poll, never an
    error. After returning a dump it waits for the next rewrite.
    """

    def __init__(self, paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                 rank: int | None = None, max_bytes: int = MAX_DUMP_BYTES) -> None:
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self.paths = [os.fspath(p) for p in paths]
        self.rank = rank
        self.max_bytes = max_bytes
        self._seen = {p: _signature(p) for p in self.paths}

    def poll(self) -> FrDump | None:
        for path in self.paths:
            # One open per look: the file that is judged (a regular file, not a
            # symlink, FIFO or device a rank swapped in) is the file that is read.
            try:
                got = rankfs.open_regular(path)
            except OSError:
                continue
            if got is None:
                continue
            fd, st = got
            try:
                sig = _sig(st)
                if sig == self._seen[path]:
                    continue
                data = _read_open(fd, self.max_bytes)
                if data is None or _sig(os.fstat(fd)) != sig:
                    continue             # changed while reading: still being written
            finally:
                os.close(fd)
            if len(data) > self.max_bytes:
                self._seen[path] = sig   # never going to load; wait for the next rewrite
                log.warning("%s: over %d bytes, ignored", path, self.max_bytes)
                continue
            rank = self.rank if self.rank is not None else rank_from_path(path)
            try:
                dump = loads_dump(data, rank=rank, where=path)
            except FlightRecorderError:
                continue                 # half-written: next poll
            self._seen[path] = sig
            return dataclasses.replace(dump, path=path)
        return None


def request_dump(env: Mapping[str, str], rank: int, *, timeout: float = DEFAULT_TIMEOUT_SECONDS,
                 poll_interval: float = 0.05,
                 torch_version: str | Sequence[int] | None = None) -> FrDump | None:
    """Trigger a dump of ``rank`` (its environment ``env``) and wait for it.

    Returns the fresh dump, or None when nobody holds the pipe open, the reader
    went away meanwhile (noticed at once: the FIFO's write end reports POLLERR
    when it has no reader), or no complete dump appeared within ``timeout``
    seconds; it never blocks longer than that. Raises PipeUnavailable when the
    rank has no pipe configured. torch polls its pipe every second only with
    dump-on-timeout on (the default); otherwise every heartbeat timeout.
    """
    pipe = pipe_path(env, rank)
    if pipe is None:
        raise PipeUnavailable(f"rank {rank}: TORCH_NCCL_DEBUG_INFO_PIPE_FILE is not set "
                              "(or the Flight Recorder buffer is 0)")
    deadline = time.monotonic() + timeout
    watcher = DumpWatcher(dump_candidates(env, rank, torch_version), rank=rank)
    fd = _open_fifo(pipe)
    if fd is None:
        return None
    try:
        if not _write_byte(fd):
            return None
        poller = select.poll()
        poller.register(fd, select.POLLERR | select.POLLHUP)
        while True:
            dump = watcher.poll()
            if dump is not None:
                return dump
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            events = poller.poll(max(1, int(min(poll_interval, left) * 1000)))
            if any(ev & (select.POLLERR | select.POLLHUP) for _, ev in events):
                return watcher.poll()    # the reader is gone; it may have dumped first
    finally:
        os.close(fd)
