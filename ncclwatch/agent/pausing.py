"""When the agent may pause a rank: the one look that stops a training process.

A native dump (``py-spy dump --native``) stops the rank while it unwinds
(0.4 s at p50, up to a second). In synchronous training one paused rank
stalls every rank, so a healthy job must never pay it, and a healthy GPU
rank looks exactly like a waiting one from the CPU: it spins in a
synchronize, with no read/write syscalls and no voluntary switches, for the
whole of a long step. Stillness alone is no reason to pause.

A rank's stillness is abnormal, and worth a pause, only when:

- *its own history says so*: the rank has stepped for a while
  (``warm_rounds`` rounds of progress over ``warm_seconds``, and over at
  least ``warm_span`` times the threshold it would set: a history must have
  had the time to show still periods that long), and this still period is
  past ``factor x`` its longest normal one ``+ slack`` (never under
  ``floor``, never over ``ceiling``), as the daemon learns its hang threshold
  from normal waits. A rank that never showed a normal still period (it
  makes no syscalls at all: batches through shared memory) is never paused
  on its own history.

  Why 3x, and why the span: a normal still period is often cut short. A
  helper thread's writes, a GIL switch, a logger at the edge of the still
  rate end it mid-step, so the longest one seen early can be a third of a
  step; a peer's evaluation makes a step half as long again. At 2x with a
  20 s warm-up, the healthy 30 s-step benchmark shape was paused
  (BENCHMARKS.md);
- or *the job's shape says a stall is under way*: the daemon, which sees
  every rank, asked (``DumpStacksCommand.native``: a peer in checkpoint work
  while this rank sits still), and the rank has sat still past the floor.

Either way a budget bounds the pause: ``budget`` seconds of native dumps per
rank per hour (0 turns native dumps off). A rank whose budget is spent is
not paused again until an hour's window frees some; the agent says so once
(log, ``AgentHealth.ranks_pause_budget_spent``, ``native_dumps_refused_total``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

#: The window the pause budget is counted over (seconds).
BUDGET_WINDOW = 3600.0
#: Normal still periods kept per rank (the longest of them counts).
RECENT = 32


@dataclass(frozen=True)
class PausePolicy:
    #: Past its history, pause a rank still this long at the latest.
    ceiling: float = 60.0
    #: Abnormal: still past factor x the longest normal still period + slack.
    factor: float = 3.0
    slack: float = 2.0
    #: The rank's history counts once it made progress in this many rounds...
    warm_rounds: int = 10
    #: ...over at least this many seconds.
    warm_seconds: float = 20.0
    #: ...and over this many times the threshold it would set.
    warm_span: float = 3.0
    #: Seconds of pause (native dumps) per rank per hour; 0: no native dumps.
    budget: float = 10.0

    def threshold(self, h: StillHistory, now: float, floor: float) -> float | None:
        """Seconds of stillness past which this rank's history calls it
        abnormal (never under ``floor``); None: no history to judge by (it is
        never paused on its own history)."""
        if not h.warmed(self, now):
            return None
        limit = min(max(self.ceiling, floor), max(floor, self.factor * h.longest + self.slack))
        if now - h.first_at < self.warm_span * limit:
            return None  # not watched long enough to know what is normal this long
        return limit


class StillHistory:
    """One rank's normal still periods: the ones that ended in progress."""

    __slots__ = ("recent", "rounds", "first_at")

    def __init__(self) -> None:
        self.recent: deque[float] = deque(maxlen=RECENT)
        self.rounds = 0
        self.first_at: float | None = None

    def moved(self, now: float, still_for: float | None) -> None:
        """A round with progress; ``still_for``: the still period it ended."""
        self.rounds += 1
        if self.first_at is None:
            self.first_at = now
        if still_for is not None:
            self.recent.append(max(0.0, still_for))

    @property
    def longest(self) -> float:
        return max(self.recent, default=0.0)

    def warmed(self, policy: PausePolicy, now: float) -> bool:
        return (self.first_at is not None and self.rounds >= policy.warm_rounds
                and now - self.first_at >= policy.warm_seconds)


class PauseBudget:
    """Seconds one rank was paused over the last hour."""

    __slots__ = ("pauses", "spent_said")

    def __init__(self) -> None:
        self.pauses: deque[tuple[float, float]] = deque()
        #: The budget ran out and the agent said so (once, until it frees again).
        self.spent_said = False

    def used(self, now: float) -> float:
        while self.pauses and now - self.pauses[0][0] >= BUDGET_WINDOW:
            self.pauses.popleft()
        return sum(s for _, s in self.pauses)

    def spent(self, policy: PausePolicy, now: float) -> bool:
        return self.used(now) >= policy.budget

    def add(self, now: float, seconds: float) -> None:
        self.pauses.append((now, max(0.0, seconds)))
