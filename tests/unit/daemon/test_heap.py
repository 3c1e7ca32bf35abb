"""The daemon's collector policy: freeze what is held, reclaim frozen cycles."""

from __future__ import annotations

import gc
import weakref

import pytest

from ncclwatch.daemon.heap import FREEZE_EVERY, RECLAIM_EVERY, HeapPolicy


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Node:
    def __init__(self) -> None:
        self.other = self  # a reference cycle: only the collector frees it


@pytest.fixture
def thawed():
    gc.unfreeze()  # an in-process daemon of an earlier test may have frozen the heap
    yield
    gc.unfreeze()


def test_held_objects_are_frozen_and_frozen_cycles_reclaimed(thawed) -> None:
    clock = Clock()
    heap = HeapPolicy(clock)
    cycle = Node()
    gone = weakref.ref(cycle)
    heap.step()
    assert gc.get_freeze_count() == 0  # nothing is due yet
    clock.t += FREEZE_EVERY
    heap.step()
    assert gc.get_freeze_count() > 0 and heap.freezes_total == 1
    del cycle
    gc.collect()
    assert gone() is not None  # frozen: a collection does not see it
    clock.t += RECLAIM_EVERY
    heap.step()
    assert gone() is None and heap.reclaims_total == 1
    assert gc.get_freeze_count() > 0  # what is still held is frozen again


def test_what_survived_a_full_collection_is_frozen_at_the_next_step(thawed) -> None:
    """While the tables grow, each full collection rescans them all: what it
    left is long-lived and is frozen at once, not a minute later."""
    clock = Clock()
    heap = HeapPolicy(clock)
    heap.step()
    assert gc.get_freeze_count() == 0
    held = [Node() for _ in range(100)]
    gc.collect()  # a full collection, as CPython runs one when the heap grew
    heap.step()
    assert gc.get_freeze_count() >= len(held) and heap.freezes_total == 1
    heap.step()
    assert heap.freezes_total == 1  # no full collection since
