"""Slow storage as torch.save / torch.load see it.

A checkpoint that takes minutes to write is what lets the NCCL watchdog kill a
job. To reproduce that on a laptop we write (and read) a real file on disk,
but pace the bytes: the sleeping happens inside ``write``/``read``, which
torch's zip writer/reader call from C++, so the rank's stack during the save
is the real ``torch.save -> _save`` stack plus one frame from this module.
"""

from __future__ import annotations

import io
import os
import time

# Pace in slices this big, so the file grows steadily (the agent watches the
# rank's I/O counters) instead of in one burst after a long sleep.
_CHUNK = 256 * 1024


class _Pacer:
    """Sleeps just enough that the bytes so far never beat ``rate`` bytes/s."""

    def __init__(self, rate: float):
        if rate <= 0:
            raise ValueError(f"rate must be > 0 bytes/s, got {rate}")
        self.rate = float(rate)
        self.start = time.monotonic()
        self.done = 0

    def account(self, n: int) -> None:
        self.done += n
        due = self.start + self.done / self.rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)


class ThrottledWriter(io.RawIOBase):
    """Binary, write-only, non-seekable file at ``rate`` bytes/s.

    torch.save(obj, ThrottledWriter(path, rate)) works: torch only needs
    ``write`` (and ``flush``) for a buffer target.
    """

    def __init__(self, path: str | os.PathLike, rate: float):
        super().__init__()
        self._f = open(path, "wb")
        self._pacer = _Pacer(rate)
        self._pos = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._pos

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        for i in range(0, len(view), _CHUNK):
            part = view[i : i + _CHUNK]
            self._f.write(part)
            self._f.flush()  # make the bytes real I/O now, not at close
            self._pos += len(part)
            self._pacer.account(len(part))
        return len(view)

    def flush(self) -> None:
        if not self._f.closed:
            self._f.flush()

    def close(self) -> None:
        if not self.closed:
            self._f.close()
        super().close()


class ThrottledReader(io.RawIOBase):
    """Binary, seekable, read-only file at ``rate`` bytes/s (for torch.load).

    torch.load needs ``read``, ``readinto``, ``seek`` and ``tell``; seeks are
    free, only bytes read are paced.
    """

    def __init__(self, path: str | os.PathLike, rate: float):
        super().__init__()
        self._f = open(path, "rb")
        self._pacer = _Pacer(rate)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def readinto(self, b) -> int:
        view = memoryview(b).cast("B")
        total = 0
        while total < len(view):
            n = self._f.readinto(view[total : total + _CHUNK])
            if not n:
                break
            total += n
            self._pacer.account(n)
        return total

    def close(self) -> None:
        if not self.closed:
            self._f.close()
        super().close()
