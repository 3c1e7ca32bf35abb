"""Keep the garbage collector off the daemon's long-lived tables.

A fleet's job tables are millions of long-lived objects (rank records,
their curves, interned stacks). CPython's full collections rescan all of
them, which holds the event loop for tens of milliseconds at 16k ranks at
moments nobody chooses: in a render, in a tick (bench/daemon_ingest.py
measures the loop held per render; it read 2 ms without collections and up
to 55 ms with them). Freezing moves what exists into the permanent
generation, so later collections look only at what is new. Reference cycles
frozen meanwhile are reclaimed by a full collection now and then, one pause
at a known interval instead of many at random ones.

While the tables grow (a daemon's first minute: every agent connects, every
rank is new) CPython runs a full collection each time the long-lived objects
grew by a quarter, each one over all of them: ingest at 2,048 ranks ran 1.6x
slower with them (bench/daemon_ingest.py). So what survived a full
collection is frozen at the next tick too, not only once a minute.

Memory freed meanwhile (a render's response, the reports of a burst, the
buffers of streams that closed) stays with the process until the allocator
gives it back: glibc does so only from the top of its heap. After each
freeze the daemon asks it to return the free pages it holds (``malloc_trim``,
where the C library has it): the daemon's RSS is then what it holds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import time

#: Freeze what the daemon holds this often (seconds).
FREEZE_EVERY = 60.0
#: Unfreeze and collect everything this often: frozen cycles are freed here.
RECLAIM_EVERY = 900.0


class HeapPolicy:
    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self._frozen_at = self._reclaimed_at = clock()
        self.freezes_total = 0
        self.reclaims_total = 0
        self._full = _full_collections()

    def step(self) -> None:
        """Called after each detection tick, on the event loop."""
        now = self.clock()
        if now - self._reclaimed_at >= RECLAIM_EVERY:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self._reclaimed_at = self._frozen_at = now
            self.reclaims_total += 1
            trim()
        elif now - self._frozen_at >= FREEZE_EVERY or _full_collections() != self._full:
            gc.freeze()
            self._frozen_at = now
            self.freezes_total += 1
            trim()
        self._full = _full_collections()


def _full_collections() -> int:
    """Full (oldest generation) collections CPython has run in this process."""
    return gc.get_stats()[-1]["collections"]


def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


_TRIM = _malloc_trim()


def trim() -> bool:
    """Give the free pages of the C heap back to the system; False where it cannot."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
