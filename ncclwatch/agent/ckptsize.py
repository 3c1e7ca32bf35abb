"""The expected size of the files a rank is writing, read from the files themselves.

Per file open for writing, in order of trust:

1. ``copy_source``: the process also holds a regular file open for reading
   whose first bytes are the ones written so far (Lightning's
   ``_atomic_save`` moving fsspec's temp file, ``shutil.copy``): the copy
   ends at the source's size.
2. The checkpoint's own header (``ncclwatch.ckpthead``): torch.save's
   ``data.pkl`` or safetensors' JSON, both written before any tensor data.

Reads are read-only and bounded: through ``/proc/PID/fd/N`` (the very file
the rank has open, not whatever its path names now), ``O_RDONLY |
O_NONBLOCK``, at most ``MAX_HEAD_BYTES`` (``COPY_PROBE`` for a copy), once
per file and size (a first 16 KiB, more only if the header goes on): a file
whose header gave a size or an error is not read again, and one still too short is read again only once it has grown, at most
``MAX_READS`` times.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from ncclwatch.agent import rankfs
from ncclwatch.ckpthead import (MAX_HEAD_BYTES, HeaderError, HeaderIncomplete, HeaderSize,
                                expected_size)

log = logging.getLogger(__name__)

#: The first read of a file: the format, and the whole header of most checkpoints.
FIRST_READ = 16 * 1024
#: Bytes compared between a written file and a candidate copy source.
COPY_PROBE = 4096
#: A copy is only matched once this much of it is written (no coincidences).
COPY_MIN = 512
#: Reads of one file before its header is given up on.
MAX_READS = 12
#: Files remembered across rounds (per sampler).
MAX_TRACKED = 512


@dataclass(frozen=True, slots=True)
class Expected:
    bytes: int = 0          # 0: unknown
    source: str = ""        # torch_zip_header | safetensors_header | copy_source
    copy_source: str = ""   # the file being copied, for copy_source
    error: str = ""         # why the header gave no size (kept for the record)


UNKNOWN = Expected()


@dataclass(slots=True)
class _State:
    size: int = -1          # the file size at the last read
    reads: int = 0
    result: Expected = UNKNOWN
    final: bool = False


class SizeReader:
    """Remembers what each written file's header said; reads only on change."""

    def __init__(self, max_head: int = MAX_HEAD_BYTES) -> None:
        self._max_head = max_head
        self._files: dict[tuple[int, int, str], _State] = {}
        self._copies: dict[tuple[int, int, str, str], bool] = {}
        self.reads_total = 0
        self.bytes_read_total = 0

    def expected(self, pid: int, fd: int, path: str, size: int,
                 readers: list[tuple[int, str, int]]) -> Expected:
        """What the file will weigh once written; ``readers``: (fd, path, size)
        of the regular files the process has open for reading."""
        copy = self._copy_source(pid, fd, path, size, readers)
        if copy is not None:
            return copy
        key = (pid, fd, path)
        st = self._files.get(key)
        if st is None:
            if len(self._files) >= MAX_TRACKED:
                self._files.pop(next(iter(self._files)))
            st = self._files[key] = _State()
        if st.final or size == st.size or size == 0:
            return st.result
        st.size, st.reads = size, st.reads + 1
        try:
            hs = self._header(pid, fd, path, size)
        except OSError:
            st.final, st.result = True, Expected(error="cannot read the file")
            return st.result
        except HeaderIncomplete as e:
            if st.reads >= MAX_READS:
                st.final = True
                st.result = Expected(error=f"header incomplete after {MAX_READS} reads: {e}")
            return st.result
        except HeaderError as e:
            st.final, st.result = True, Expected(error=str(e))
            log.debug("no size from %s: %s", path, e)
            return st.result
        st.final = True
        st.result = Expected(hs.total_bytes, f"{hs.format}_header")
        return st.result

    def retain(self, pids: set[int]) -> None:
        """Forget the files of processes no longer sampled."""
        for d in (self._files, self._copies):
            for key in [k for k in d if k[0] not in pids]:
                del d[key]

    def _header(self, pid: int, fd: int, path: str, size: int) -> HeaderSize:
        """Read a first slice (enough for the format, and most headers), then up
        to ``max_head`` only if the header goes on: a log file costs one small read."""
        first = min(size, FIRST_READ)
        head = self._read(pid, fd, first)
        if head is None:
            raise OSError("cannot read")
        try:
            return expected_size(head, path)
        except HeaderIncomplete:
            if size <= first or len(head) < first:
                raise
        head = self._read(pid, fd, min(size, self._max_head))
        if head is None:
            raise OSError("cannot read")
        return expected_size(head, path)

    # -- copies ------------------------------------------------------------------

    def _copy_source(self, pid: int, fd: int, path: str, size: int,
                     readers: list[tuple[int, str, int]]) -> Expected | None:
        if size < COPY_MIN:
            return None
        # Highest fd first: a copy opens its source just before its target.
        for rfd, rpath, rsize in sorted(readers, reverse=True):
            if rsize < size or rpath == path:
                continue
            key = (pid, fd, path, rpath)
            match = self._copies.get(key)
            if match is None:
                match = self._same_start(pid, fd, rfd, min(size, COPY_PROBE))
                if match is None:
                    continue
                if len(self._copies) >= MAX_TRACKED:
                    self._copies.pop(next(iter(self._copies)))
                self._copies[key] = match
            if match:
                return Expected(rsize, "copy_source", copy_source=rpath)
        return None

    def _same_start(self, pid: int, wfd: int, rfd: int, n: int) -> bool | None:
        a = self._read(pid, wfd, n)
        b = self._read(pid, rfd, n)
        if a is None or b is None or len(a) < n or len(b) < n:
            return None
        return a == b

    # -- reading -----------------------------------------------------------------

    def _read(self, pid: int, fd: int, n: int) -> bytes | None:
        """Up to n bytes from the start of the rank's open file, never blocking
        on it (O_NONBLOCK), never through a path that may name another file."""
        try:
            # O_PATH first: a FIFO or device the rank holds is never opened.
            got = rankfs.open_regular(f"/proc/{pid}/fd/{fd}")
        except OSError:
            return None
        if got is None:
            return None
        own, _ = got
        try:
            self.reads_total += 1
            data = os.pread(own, n, 0)
            self.bytes_read_total += len(data)
            return data
        except OSError:
            return None
        finally:
            os.close(own)
