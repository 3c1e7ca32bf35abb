"""When the agent may pause a rank: the one look that stops a training process.

A native dump (``py-spy dump --native``) stops the rank while it unwinds
(0.4 s at p50, up to a second). In synchronous training one paused rank
stalls every rank, so a healthy job must never pay it, and a healthy GPU
rank looks exactly like a waiting one from the CPU: it spins in a
synchronize, with no read/write syscalls and no voluntary switches, for the
whole of a long step. Stillness alone is no reason to pause.

A rank's stillness is abnormal, and worth a pause, only when:

- *its own history says so* (ncclwatch/stillness.py, the rule the daemon
  applies too): the rank has stepped, this still period is past ``factor x``
  its longest normal one ``+ slack`` (never under ``floor``, the agent's
  ``native_after``, never over ``ceiling``), and the rank was watched at least
  ``warm_span`` times that long (a history must have had the time to show
  still periods that long). A rank that never stepped (its start-up alone
  made progress: weights loaded, then batches through shared memory or
  already on the device) is never paused on its own history;
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
from dataclasses import dataclass, field

from ncclwatch.config import non_negative_float, option, positive_float
from ncclwatch.stillness import PAUSE, StillHistory, StillRule

#: The window the pause budget is counted over (seconds).
BUDGET_WINDOW = 3600.0


@dataclass(frozen=True)
class PausePolicy:
    #: Past its history, pause a rank still this long at the latest.
    ceiling: float = option(
        60.0, "still this long, a rank that has stepped is paused for a native stack whatever "
        f"its history says (past its normal: {PAUSE.describe()}; up to this)",
        positive_float, "SECONDS", name="native_stack_ceiling")
    #: ...once it was watched this many times the threshold it would set.
    warm_span: float = 3.0
    #: Seconds of pause (native dumps) per rank per hour; 0: no native dumps.
    budget: float = option(
        10.0, "seconds per rank per hour that native stacks may pause a rank; once spent, "
        "none until the hour frees some (said once, and in "
        "ncclwatch_agent_pause_budget_spent_ranks); 0: no native stacks",
        non_negative_float, "SECONDS", name="pause_budget")
    #: When a still period is past the rank's normal (shared with the daemon).
    rule: StillRule = field(default=PAUSE)

    def threshold(self, h: StillHistory, now: float, floor: float) -> float | None:
        """Seconds of stillness past which this rank's history calls it
        abnormal (never under ``floor``); None: no history to judge by (it is
        never paused on its own history)."""
        return self.rule.threshold(h, now, floor, self.ceiling, self.warm_span)


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
