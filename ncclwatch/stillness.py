"""When a rank's stillness is abnormal: the one rule the agent and the daemon share.

A rank is *still* while it makes no progress (no read/write calls, no
voluntary switches of its main thread). A healthy GPU rank is still through
every step (it spins in a synchronize), a waiting one too: stillness alone
says nothing. What says something is a still period well past the rank's own
normal ones, the still periods that ended in progress.

The agent pauses a rank (a native dump) on this rule, and the daemon counts
a rank's stillness as evidence of a wait on it; both call the functions
here, with one warm-up and one slack (two rules, below):

- ``stepped``: the rank is past its warm-up (progress in ``WARMUP.rounds``
  rounds spread over ``WARMUP.seconds``, first to last) and ended
  ``periods`` still periods since. Progress while the rank's stack showed
  checkpoint work (``torch.load`` of its weights) is no round of it, and
  start-up's own still periods (imports, rendezvous) are none of the
  periods. A rank fed through shared memory or an mmap never warms.
- ``limit``: past ``factor x`` its longest normal still period ``+ slack``,
  never under a floor, never over a ceiling.
- ``within_normal``: a still period no longer than the longest normal one of
  a rank seen making progress in ``WARMUP.rounds`` rounds: no reason even to
  look at it (a look is a non-blocking py-spy dump, no pause).

Two rules, by what a wrong call costs:

- ``PAUSE`` (3x, 3 periods): the agent pauses a rank past it. A pause stalls
  the whole synchronous job, so it must never hit a healthy step. A history
  without still periods that ended after its warm-up has no normal: a rank
  that loaded its weights and then trains with no syscall per step, a rank
  whose first step is long, and one that made progress every round and then
  stopped all look the same from /proc, and none is paused on its own
  history (the daemon, which sees the whole job, asks for a native dump when
  its shape says so: daemon/core.py). 3x: a normal still period is often
  cut short (a helper thread's writes, a GIL switch, a logger at the edge of
  the still rate), so the longest one seen early can be a third of a step; a
  peer's evaluation makes a step half as long again. At 2x the healthy 30 s-
  step benchmark shape was paused (bench/HISTORY.md).
- ``EVIDENCE`` (2x, 0 periods): the daemon counts a rank's stillness toward
  a job's shape past it. That costs nothing by itself: a finding resting on
  stillness alone also needs the rest of the job's shape (every other rank
  still past the hang ceiling, a rank at work elsewhere), and stays
  provisional until a frame or the Flight Recorder confirms it; a rank that
  stepped fast and stopped is what a hang looks like. 3x would put a 30 s-
  step job's hang 30 s later.

The per-op wait thresholds the daemon learns job-wide (daemon/waits.py) are
another quantity, with a factor of their own, and share only ``clamp``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def clamp(longest: float, factor: float, slack: float, floor: float, ceiling: float) -> float:
    """``factor x longest + slack``, never under ``floor``, never over
    ``ceiling`` (the ceiling wins: it is at least the floor)."""
    return min(max(ceiling, floor), max(floor, factor * longest + slack))


@dataclass(frozen=True)
class Warmup:
    """When a rank's start-up is over: ``StillHistory.warm``."""
    #: Rounds with progress, at least...
    rounds: int = 10
    #: ...spread over at least this many seconds (first to last of them).
    seconds: float = 20.0


#: The one warm-up, for the agent's pauses and the daemon's evidence alike.
WARMUP = Warmup()


@dataclass(frozen=True)
class StillRule:
    #: Abnormal: still past factor x the longest normal still period + slack.
    factor: float = 3.0
    slack: float = 2.0
    #: Still periods that ended after the warm-up, before the history counts.
    periods: int = 3

    def stepped(self, h: StillHistory) -> bool:
        """The rank was seen stepping: past its warm-up, and ``periods`` still
        periods ended since, so its normal is its steps' and not its start-up's."""
        return h.warm and h.periods >= self.periods

    def limit(self, h: StillHistory, floor: float, ceiling: float = math.inf) -> float:
        """Seconds of stillness past the rank's normal (``floor`` with no
        normal seen); whether the history counts at all is ``stepped``'s."""
        return clamp(h.longest, self.factor, self.slack, floor, ceiling)

    def threshold(self, h: StillHistory, now: float, floor: float,
                  ceiling: float = math.inf, span: float = 0.0) -> float | None:
        """``limit`` of a rank that stepped and was watched ``span`` times that
        long (a history must have had the time to show still periods that
        long); None: no history to judge by."""
        if not self.stepped(h):
            return None
        limit = self.limit(h, floor, ceiling)
        if now - h.first_at < span * limit:
            return None
        return limit

    def within_normal(self, h: StillHistory, still_for: float) -> bool:
        """A still period no longer than the longest normal one, once the rank
        made progress in ``WARMUP.rounds`` rounds: no reason to look at it
        (a look costs no pause; its slow round looks anyway). Looks ask less
        of a history than a pause does: the rank was seen still this long and
        come back, whatever else it did."""
        return h.rounds >= h.warmup.rounds and still_for < h.longest

    def describe(self) -> str:
        """The rule in words, for help texts and docs."""
        w = WARMUP
        return (f"{self.factor:g}x the rank's longest normal still period + {self.slack:g} s, "
                f"once it made progress in {w.rounds} rounds over {w.seconds:g} s "
                f"and then ended {self.periods} still periods")


#: When the agent may pause a rank on its own history.
PAUSE = StillRule(factor=3.0, periods=3)
#: When the daemon counts a rank's stillness as evidence of a wait.
EVIDENCE = StillRule(factor=2.0, periods=0)

#: Ended still periods per bucket of the rolling longest (two buckets: the
#: longest of the last BUCKET to 2 x BUCKET still periods, three numbers a rank).
BUCKET = 16


class StillHistory:
    """One rank's rounds of progress and the still periods they ended."""

    __slots__ = ("rounds", "first_at", "last_at", "periods", "warmup",
                 "_longest", "_before", "_count")

    def __init__(self, warmup: Warmup = WARMUP) -> None:
        self.rounds = 0
        self.first_at: float | None = None
        self.last_at = 0.0
        #: Still periods that ended once the rounds and seconds were met.
        self.periods = 0
        self.warmup = warmup
        self._longest = 0.0
        self._before = 0.0
        self._count = 0

    @property
    def warm(self) -> bool:
        """Progress in ``warmup.rounds`` rounds over ``warmup.seconds``."""
        w = self.warmup
        return (self.rounds >= w.rounds and self.first_at is not None
                and self.last_at - self.first_at >= w.seconds)

    def moved(self, now: float, still_for: float | None, stepping: bool = True) -> None:
        """A round with progress at ``now``; ``still_for``: the still period it
        ended (None: it was not still). ``stepping`` False: the rank was last
        seen in checkpoint work (loading its weights, saving): its progress
        there is no step, though the still period it ended was normal."""
        if still_for is not None:
            if stepping and self.warm:
                self.periods += 1
            if self._count >= BUCKET:
                self._before, self._longest, self._count = self._longest, 0.0, 0
            self._longest = max(self._longest, still_for)
            self._count += 1
        if stepping:
            self.rounds += 1
            self.last_at = now
            if self.first_at is None:
                self.first_at = now

    @property
    def longest(self) -> float:
        """The longest recent still period that ended in progress (0: none)."""
        return max(self._longest, self._before)
