"""Which ranks get a py-spy dump this round: the adaptive part of sampling.

py-spy costs 10-150 ms a dump, /proc costs microseconds. So stacks are
taken where cheap signals say something may be stuck (CPU went quiet or
woke up, last state was a wait), on a slow round otherwise, and at once when
the daemon asks. A per-round cap bounds the agent's own CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ncclwatch.agent.tracker import RankTracker
from ncclwatch.model import RankState


@dataclass(frozen=True)
class StackPolicy:
    suspect_interval: float = 2.0   # re-dump a rank that may be stuck
    slow_interval: float = 20.0     # re-dump every rank at least this often
    max_per_round: int = 8

    def due(self, trackers: Iterable[RankTracker], now: float) -> list[RankTracker]:
        ranked: list[tuple[int, float, RankTracker]] = []
        for t in trackers:
            prio = self._priority(t, now)
            if prio is not None:
                ranked.append((prio, t.stack_at or 0.0, t))
        ranked.sort(key=lambda x: (x[0], x[1]))
        return [t for _, _, t in ranked[: self.max_per_round]]

    def _priority(self, t: RankTracker, now: float) -> int | None:
        if t.forced:
            return 0
        if t.stack_at is None:
            return 1
        age = now - t.stack_at
        suspect = (t.quiet or t.quiet != t.quiet_at_last_dump
                   or t.state is not RankState.COMPUTE)
        if suspect and age >= self.suspect_interval:
            return 2
        if age >= self.slow_interval:
            return 3
        return None
