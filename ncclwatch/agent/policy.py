"""Which ranks get a py-spy dump this round: the adaptive part of sampling.

py-spy costs 10-150 ms a dump, /proc costs microseconds. So stacks are
taken where cheap signals say something may be stuck, on a slow round
otherwise, and at once when the daemon asks. The signals do not need quiet
CPUs (NCCL ranks spin while they wait): the rank stopped or resumed making
progress (tracker.py: syscalls, main-thread switches), its CPU went quiet or
woke up, it opened a file for writing, its last stack was checkpoint work, or
a wait it has not progressed out of since. Repeated looks at an unchanged
wait back off to the slow round; a per-round cap and a CPU budget bound the
agent's own CPU.

A GPU rank goes still at every step (it spins in a synchronize) and moves
again at the next batch: looking at each change cost two dumps per rank per
step, the agent's whole CPU on such jobs (BENCHMARKS.md). So a computing rank
that goes still is looked at only once the still period is past its normal
(``within_normal``: its longest still period so far, stillness.py) or the daemon sees a
stall's shape around it, and one that resumes computing is not looked at
before the slow round: it computes on, as its last stack said.

Native dumps (``native_due``) are the one look that pauses a rank: only of a
rank whose stillness is abnormal (pausing.py: past its own normal still
periods, or the daemon saw a stall's shape), still past ``native_after``
seconds while its Python stack (taken in that still period) reads compute,
unknown or device_wait, once per still period, unless its thread sleeps on a
timer (``syscalls.asleep``: ``time.sleep`` in an evaluation or a retry loop,
read from /proc without a pause: a native stack would add nothing). A rank that makes progress is
never still, so never paused; a healthy rank still through a long step is
still within its normal, so never paused either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from ncclwatch.agent.pausing import PausePolicy
from ncclwatch.agent.tracker import NATIVE_CANDIDATES, RankTracker
from ncclwatch import syscalls
from ncclwatch.config import non_negative_float, option, positive_float
from ncclwatch.model import CHECKPOINT_STATES, RankState
from ncclwatch.sanitize import for_log


@dataclass(frozen=True)
class StackPolicy:
    suspect_interval: float = option(2.0, "re-dump a possibly stuck rank this often",
                                     positive_float, "SECONDS", name="suspect_stack_interval")
    slow_interval: float = option(30.0, "re-dump every rank at least this often",
                                  positive_float, "SECONDS", name="slow_stack_interval")
    max_per_round: int = 8
    #: The agent's own CPU (py-spy included), in cores, over ``cpu_window``
    #: seconds; above it only what the daemon asked for and ranks never seen
    #: are dumped, one per round, until use falls back under the budget.
    cpu_budget: float = option(0.25, "the agent's own CPU (py-spy included) in cores; above "
                               "it only the stacks the daemon asks for are taken",
                               positive_float, "CORES")
    cpu_window: float = 10.0
    #: Seconds a rank must have sat still before a native dump, at least (below
    #: the daemon's 5 s stall threshold: the wait it shows is dated from the
    #: start of the still period, so the verdict can follow at once); 0: never.
    native_after: float = option(
        3.0, "the least stillness before one native stack (py-spy --native, which pauses the "
        "rank for the unwind) of a rank whose Python stack shows no wait; taken only where "
        "the rank's own history (its normal still periods) or the job's shape (a peer in "
        "checkpoint work, every rank still) says the stillness is abnormal; once per still "
        "period; 0: never", non_negative_float, "SECONDS", name="native_stack_after")
    max_native_per_round: int = 2
    #: When stillness is abnormal enough to pause, and the pause budget.
    pause: PausePolicy = field(default_factory=PausePolicy)

    def native_due(self, trackers: Iterable[RankTracker], now: float) -> list[RankTracker]:
        """Ranks whose stillness asks for one native dump now, longest still
        first (the pause budget is the caller's to apply: it says so)."""
        if self.native_after <= 0 or self.pause.budget <= 0:
            return []
        due = [t for t in trackers
               if t.still_since is not None and t.native_for != t.still_since
               and now - t.still_since >= self.native_after
               and t.state in NATIVE_CANDIDATES
               # Its Python stack was read in this still period (and said no more).
               and t.stack_at is not None and t.stack_at >= t.still_since
               # Asleep on a timer through its still period: no wait to unwind.
               and not (t.sample is not None and syscalls.asleep(t.sample.blocked_in))
               and self.abnormal(t, now)]
        due.sort(key=lambda t: t.still_since)
        return due[: self.max_native_per_round]

    def abnormal(self, t: RankTracker, now: float) -> bool:
        """The rank's stillness is past its normal (its history), or the daemon
        saw a stall's shape while it sat still (pausing.py)."""
        if t.still_since is None:
            return False
        if t.native_asked is not None and t.native_asked >= t.still_since:
            return True
        limit = self.pause.threshold(t.history, now, self.native_after)
        return limit is not None and now - t.still_since >= limit

    def why(self, t: RankTracker, now: float) -> str:
        """Why a rank is paused, in words for the agent's log (an operator
        who sees a rank stopped asks first)."""
        still = now - (t.still_since or now)
        seen = (f"; its Python stack ({t.state.value}, read {now - t.stack_at:.1f}s ago) "
                "shows no wait" if t.stack_at is not None else "")
        if t.native_asked is not None and t.still_since is not None \
                and t.native_asked >= t.still_since:
            shape = f" ({for_log(t.native_reason)})" if t.native_reason else ""
            return f"still {still:.1f}s while the daemon sees a stall's shape{shape}{seen}"
        h = t.history
        limit = self.pause.threshold(h, now, self.native_after)
        return (f"still {still:.1f}s, past its normal (threshold {limit or 0:.1f}s: longest "
                f"normal still period {h.longest:.1f}s, {h.rounds} rounds of progress "
                f"over {h.last_at - (h.first_at or h.last_at):.0f}s){seen}")

    def due(self, trackers: Iterable[RankTracker], now: float,
            over_budget: bool = False) -> list[RankTracker]:
        ranked: list[tuple[int, float, RankTracker]] = []
        for t in trackers:
            prio = self._priority(t, now)
            if prio is not None and (not over_budget or prio <= 1):
                ranked.append((prio, t.stack_at or 0.0, t))
        ranked.sort(key=lambda x: (x[0], x[1]))
        return [t for _, _, t in ranked[: 1 if over_budget else self.max_per_round]]

    def _priority(self, t: RankTracker, now: float) -> int | None:
        if t.forced:
            return 0
        if t.stack_at is None:
            return 1
        age = now - t.stack_at
        wait = self.suspect_wait(t, now)
        if wait is not None and age >= wait:
            return 2
        if age >= self.slow_interval:
            return 3
        return None

    def suspect_wait(self, t: RankTracker, now: float) -> float | None:
        """How soon to look again at a rank that may be stuck (None: not suspect)."""
        if t.quiet != t.quiet_at_last_dump or self.still_news(t, now) or t.files_changed():
            return self.suspect_interval  # something changed since the last look
        if t.quiet or t.state in CHECKPOINT_STATES or _may_be_stuck(t):
            # The same picture again and again: look less often, down to the slow
            # round (the daemon forces fresh stacks of a job it suspects).
            backoff = 2.0 ** min(max(t.repeats - 2, 0), 4)
            return min(self.slow_interval, self.suspect_interval * backoff)
        return None

    def still_news(self, t: RankTracker, now: float) -> bool:
        """The rank went still, or moved again, since its last stack, and its
        last stack cannot stand for it: it showed a wait, or (computing) the
        still period is past the rank's normal."""
        if t.still:
            if t.stack_at is not None and t.stack_at >= t.still_since:
                return False  # looked at in this still period
            return t.state is not RankState.COMPUTE or not self.within_normal(t, now)
        # Moving again: a wait it was seen in is over; computing, it computes on.
        return t.still_at_last_dump and t.state is not RankState.COMPUTE

    def within_normal(self, t: RankTracker, now: float) -> bool:
        """A still period no longer than the rank's longest normal one (of a
        rank that stepped, stillness.py), and no stall's shape seen around it."""
        if t.still_since is None:
            return False
        if t.native_asked is not None and t.native_asked >= t.still_since:
            return False
        return self.pause.rule.within_normal(t.history, now - t.still_since)


def _may_be_stuck(t: RankTracker) -> bool:
    """A wait worth a second look: one the rank has not progressed out of.

    Healthy training is in a collective much of the time; a rank whose
    syscalls and main-thread switches went on since its last stack has
    moved on and can wait for the slow round, even if the stack is the same
    (a loop's next all_reduce). Without progress readings: a wait just
    entered, or the same stack again.
    """
    if t.state is RankState.COMPUTE:
        return False
    if t.events_at_dump is not None:
        return not t.progressed_since_dump()
    entered = t.prev_state in (RankState.COMPUTE, RankState.UNKNOWN)
    return entered or t.repeats >= 1


class CpuMeter:
    """The agent's CPU use in cores over a sliding window of round readings."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._points: list[tuple[float, float]] = []

    def add(self, now: float, cpu_seconds: float) -> float:
        """Record a reading; return the use (cores) over the window so far."""
        self._points.append((now, cpu_seconds))
        while len(self._points) > 2 and now - self._points[1][0] >= self.window:
            self._points.pop(0)
        t0, c0 = self._points[0]
        return (cpu_seconds - c0) / (now - t0) if now > t0 else 0.0
