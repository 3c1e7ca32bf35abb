"""Each job's normal waits, learned from its samples: the adaptive hang threshold.

A fixed hang threshold is wrong for every job: too slow for one whose ranks
leave each all_reduce within milliseconds, too fast for one whose ranks wait
20 s in a barrier while rank 0 evaluates. So the daemon learns, per job and
per collective op, how long ranks sit still in it (no progress: the agent's
``still_seconds``) and flags a hang only when a wait is well outside that:

    threshold(op) = clamp(factor * longest recent normal wait + slack, floor, ceiling)

Evidence is what ended: a wait that ended (the rank made progress again or
moved on) and rounds in which a rank last seen in the op made progress (its
waits there end within a round). A wait still going on teaches nothing, so a
job's first long wait (start-up: rank 0 loading data while the others sit in
a barrier) keeps the ceiling, the fixed ``--hang-threshold``, until the op has
``min_evidence`` pieces of evidence over ``warmup`` seconds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ncclwatch.model import CollectiveOp


@dataclass(frozen=True)
class WaitPolicy:
    #: Never flag a hang sooner than this (seconds), whatever was learned.
    floor: float = 6.0
    #: Never later: the fixed --hang-threshold, also used until warmed up.
    ceiling: float = 30.0
    #: A hang is this many times the longest normal wait...
    factor: float = 2.0
    #: ...plus this (still_seconds have the agent round's resolution).
    slack: float = 2.0
    #: Evidence (ended waits and progress rounds) before trusting what was learned.
    min_evidence: int = 20
    #: Seconds from an op's first evidence before trusting it.
    warmup: float = 10.0


#: Ended waits kept per op (the longest of them sets the threshold).
RECENT = 64


class OpWaits:
    """What one job showed about waits in one collective op."""

    __slots__ = ("first_at", "evidence", "recent")

    def __init__(self, now: float) -> None:
        self.first_at = now
        self.evidence = 0
        self.recent: deque[float] = deque(maxlen=RECENT)

    @property
    def longest(self) -> float:
        return max(self.recent, default=0.0)


class WaitLearner:
    """Per-op evidence of one job; ``threshold`` turns it into seconds."""

    __slots__ = ("ops",)

    def __init__(self) -> None:
        self.ops: dict[CollectiveOp, OpWaits] = {}

    def _op(self, op: CollectiveOp, now: float) -> OpWaits:
        w = self.ops.get(op)
        if w is None:
            w = self.ops[op] = OpWaits(now)
        return w

    def progressed(self, op: CollectiveOp, now: float) -> None:
        """A rank last seen waiting in ``op`` made progress this round."""
        self._op(op, now).evidence += 1

    def ended(self, op: CollectiveOp, seconds: float, now: float) -> None:
        """A still wait in ``op`` ended after ``seconds`` (an upper bound)."""
        w = self._op(op, now)
        w.evidence += 1
        w.recent.append(max(0.0, seconds))

    def warmed(self, op: CollectiveOp, policy: WaitPolicy, now: float) -> bool:
        w = self.ops.get(op)
        return (w is not None and w.evidence >= policy.min_evidence
                and now - w.first_at >= policy.warmup)

    def threshold(self, op: CollectiveOp, policy: WaitPolicy, now: float) -> float:
        """Seconds of stillness in ``op`` after which a wait is a hang."""
        if not self.warmed(op, policy, now):
            return policy.ceiling
        learned = policy.factor * self.ops[op].longest + policy.slack
        return min(policy.ceiling, max(policy.floor, learned))

    def current(self, waiting_ops: set[CollectiveOp], policy: WaitPolicy, now: float) -> float:
        """The job's threshold now: the tightest over the ops its ranks wait in,
        else that of the op it showed most (its step's collective)."""
        if waiting_ops:
            return min(self.threshold(op, policy, now) for op in waiting_ops)
        if not self.ops:
            return policy.ceiling
        op = max(self.ops.items(), key=lambda kv: (kv[1].evidence, kv[0].value))[0]
        return self.threshold(op, policy, now)

    def view(self, policy: WaitPolicy, now: float) -> dict[str, dict]:
        """Per op: the threshold, the longest normal wait, the evidence (for the API)."""
        return {op.value: {"threshold_seconds": round(self.threshold(op, policy, now), 1),
                           "longest_wait_seconds": round(w.longest, 1),
                           "waits_ended": len(w.recent), "evidence": w.evidence,
                           "learned": self.warmed(op, policy, now)}
                for op, w in sorted(self.ops.items(), key=lambda kv: kv[0].value)}
