"""Interned stacks by content id, bounded in count and in text (LRU).

Ranks refer to their stack by id; thousands of ranks in one wait share one
stack. What is evicted is re-sent by the agent (it sends a stack once).
"""

from __future__ import annotations

import collections

from ncclwatch.stacks import Frame, Stack
from ncclwatch.v1 import collector_pb2 as pb

#: Stacks kept by content id; least recently referenced go first.
MAX_STACKS = 200_000


def _text_of(st: Stack) -> int:
    return len(st.thread_name) + sum(len(f.name) + len(f.filename) for f in st.frames)


class StackStore:
    """Interned stacks by id, bounded LRU."""

    def __init__(self, limit: int = MAX_STACKS, max_bytes: int = 64 << 20) -> None:
        self._stacks: collections.OrderedDict[str, Stack] = collections.OrderedDict()
        self._limit = limit
        #: Text (names, file names) of the stacks kept, and its bound: by
        #: count alone 30 reports of 9 MB stacks took 270 MiB (issue 20).
        self.max_bytes = max_bytes
        self.bytes = 0
        #: Stacks evicted to stay under ``max_bytes`` (a bound hit each).
        self.evicted_for_bytes_total = 0
        #: id -> (wire digest, text) of each kept stack as it was sent, before
        #: it was escaped (admission.Held): sent again alike, it is not
        #: checked, escaped or stored again, only touched.
        self.held: dict[str, tuple[bytes, int]] = {}

    def __contains__(self, sid: str) -> bool:
        return sid in self._stacks

    def __len__(self) -> int:
        return len(self._stacks)

    def add(self, s: pb.Stack) -> None:
        if s.id in self._stacks:
            self._stacks.move_to_end(s.id)
            return
        st = self._stacks[s.id] = Stack(
            frames=tuple(Frame(f.name, f.filename, f.line) for f in s.frames),
            thread_name=s.thread_name,
        )
        self.bytes += _text_of(st)
        while len(self._stacks) > self._limit:
            self._evict()
        while self.bytes > self.max_bytes and len(self._stacks) > 1:
            self._evict()
            self.evicted_for_bytes_total += 1

    def _evict(self) -> None:
        sid, st = self._stacks.popitem(last=False)
        self.bytes -= _text_of(st)
        self.held.pop(sid, None)

    def remember(self, wire: dict[str, tuple[bytes, int]]) -> None:
        """The wire digests (admission.Admission.wire) of stacks just added;
        one not kept (evicted at once) or already known is left alone."""
        for sid, w in wire.items():
            if sid in self._stacks and sid not in self.held:
                self.held[sid] = w

    def get(self, sid: str) -> Stack | None:
        return self._stacks.get(sid)

    def touch(self, sid: str) -> bool:
        if sid in self._stacks:
            self._stacks.move_to_end(sid)
            return True
        return False
