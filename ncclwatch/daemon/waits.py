"""Each job's normal waits, learned from its samples: the adaptive hang threshold.

A fixed hang threshold is wrong for every job: too slow for one whose ranks
leave each all_reduce within milliseconds, too fast for one whose ranks wait
20 s in a barrier while rank 0 evaluates. So the daemon learns, per job and
per collective op, how long ranks sit still in it (no progress: the agent's
``still_seconds``) and flags a hang only when a wait is well outside that:

    threshold(op) = clamp(factor * longest recent normal wait + slack, floor, ceiling)

(``stillness.clamp``; a single rank's still periods are judged by the rule
in stillness.py, these are the job's waits per op, with a factor of their own.)

Evidence is what ended: a wait that ended (the rank made progress again or
moved on), and a round in which a rank last seen in the op made progress
(its wait there ended within a round; stacks are samples, so the waits they
catch are the long ones, a fair test). A wait still going on teaches nothing.
An op's threshold is learned once the job has stepped and the op itself has
``min_op_evidence``; until then it is the ceiling, the fixed
``--hang-threshold`` (a finding says which: ``basis``). A job has stepped
once ``min_steps`` of its step collectives were seen to end (a rank caught
in one, then progress: a completed step) over ``step_warmup`` seconds, or,
with no step collective caught (steps too fast to sample), after
``min_evidence`` rounds of progress over ``warmup`` seconds, counted only
where the ranks judged made progress themselves (``waiters_warm``: each
one's own history is warm): a late rank busy reading or computing makes
progress every round, and its own rounds must not make its waiting peers'
first long wait look like a stepping job's. A few seen
steps are proof enough: start-up (imports, loading, rendezvous) ends no
step collective. So a job's first long wait at start-up (rank 0 loading
data while the others sit in a barrier) and a first long wait in an op the
job never showed before (a 20 s evaluation behind a barrier) keep the ceiling.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from ncclwatch.model import CollectiveOp
from ncclwatch.stillness import EVIDENCE, StillRule, clamp

#: The collectives a training step runs (DDP, FSDP; WAIT: NCCL's CPU side at
#: a device sync). Never sighted, they are presumed as short as the job's
#: other still periods once it steps; sync points (barrier, broadcast, the
#: *_object calls) that surround evaluations, checkpoints and start-up keep
#: the ceiling until the job shows how long they take.
STEP_OPS = frozenset({CollectiveOp.ALL_REDUCE, CollectiveOp.REDUCE_SCATTER,
                      CollectiveOp.ALL_GATHER, CollectiveOp.WAIT})


@dataclass(frozen=True)
class WaitPolicy:
    #: Never flag a hang sooner than this (seconds), whatever was learned.
    floor: float = 5.0
    #: Never later: the fixed --hang-threshold, also used until warmed up.
    ceiling: float = 30.0
    #: A hang is this many times the longest normal wait...
    factor: float = 2.0
    #: ...plus this (still_seconds have the agent round's resolution).
    slack: float = 2.0
    #: Rounds of progress (any rank) before the job counts as stepping...
    min_evidence: int = 30
    #: ...over at least this many seconds.
    warmup: float = 20.0
    #: Or: step collectives (STEP_OPS) seen to end, job-wide...
    min_steps: int = 3
    #: ...since the job's first progress at least this many seconds ago.
    step_warmup: float = 5.0
    #: Evidence about an op (ended waits, progress rounds) before trusting it.
    min_op_evidence: int = 2
    #: When one rank's stillness is evidence of a wait (the job's shape): the
    #: rule the agent pauses by (stillness.py).
    rank: StillRule = field(default=EVIDENCE)


#: ``WaitLearner.basis``: the threshold learned from the job, or the fixed ceiling.
LEARNED, CEILING = "learned", "ceiling"

#: Whether the ranks being judged stepped themselves (each one's own rounds
#: of progress, stillness.StillHistory.warm); None: not asked (views).
WaitersWarm = Callable[[], bool] | None

#: Ended waits kept per op (the longest of them sets the threshold).
RECENT = 64


class OpWaits:
    """What one job showed about waits in one collective op."""

    __slots__ = ("evidence", "recent")

    def __init__(self) -> None:
        self.evidence = 0
        self.recent: deque[float] = deque(maxlen=RECENT)

    @property
    def longest(self) -> float:
        return max(self.recent, default=0.0)


class WaitLearner:
    """Per-op evidence of one job; ``threshold`` turns it into seconds."""

    __slots__ = ("ops", "rounds", "first_at", "still")

    def __init__(self) -> None:
        self.ops: dict[CollectiveOp, OpWaits] = {}
        self.rounds = 0                     # rounds in which a rank made progress
        self.first_at: float | None = None  # the first of them
        #: Still periods of any rank in any state that ended (job-wide).
        self.still = OpWaits()

    def _op(self, op: CollectiveOp) -> OpWaits:
        w = self.ops.get(op)
        if w is None:
            w = self.ops[op] = OpWaits()
        return w

    def stepped(self, now: float, ranks: int = 1) -> None:
        """``ranks`` ranks of the job made progress this round (whatever their state)."""
        self.rounds += ranks
        if self.first_at is None:
            self.first_at = now

    def still_ended(self, seconds: float) -> None:
        """A rank made progress again after ``seconds`` without (any state)."""
        self.still.recent.append(max(0.0, seconds))

    def progressed(self, op: CollectiveOp, now: float) -> None:
        """A rank last seen waiting in ``op`` made progress this round."""
        self._op(op).evidence += 1

    def ended(self, op: CollectiveOp, seconds: float, now: float) -> None:
        """A still wait in ``op`` ended after ``seconds`` (an upper bound)."""
        w = self._op(op)
        w.evidence += 1
        w.recent.append(max(0.0, seconds))

    def steps(self) -> int:
        """Step collectives seen to end (progress out of, or waits ended in, STEP_OPS)."""
        return sum(w.evidence for op, w in self.ops.items() if op in STEP_OPS)

    def stepping(self, policy: WaitPolicy, now: float, waiters_warm: WaitersWarm = None) -> bool:
        """Past start-up: a few steps seen to end, or ranks made progress often
        enough for long enough, the judged ranks among them (``waiters_warm``)."""
        if self.first_at is None:
            return False
        since = now - self.first_at
        if self.steps() >= policy.min_steps and since >= policy.step_warmup:
            return True
        return (self.rounds >= policy.min_evidence and since >= policy.warmup
                and (waiters_warm is None or waiters_warm()))

    def warmed(self, op: CollectiveOp, policy: WaitPolicy, now: float,
               waiters_warm: WaitersWarm = None) -> bool:
        w = self.ops.get(op)
        return (w is not None and w.evidence >= policy.min_op_evidence
                and self.stepping(policy, now, waiters_warm))

    def basis(self, op: CollectiveOp, policy: WaitPolicy, now: float,
              waiters_warm: WaitersWarm = None) -> str:
        """How ``threshold(op)`` is set: "learned" from the job's own waits,
        or "ceiling" (before its first steps, or an op it never showed)."""
        if self.warmed(op, policy, now, waiters_warm) or (
                op in STEP_OPS and self.stepping(policy, now, waiters_warm)):
            return LEARNED
        return CEILING

    def threshold(self, op: CollectiveOp, policy: WaitPolicy, now: float,
                  waiters_warm: WaitersWarm = None) -> float:
        """Seconds of stillness in ``op`` after which a wait is a hang."""
        if self.warmed(op, policy, now, waiters_warm):
            longest = self.ops[op].longest
        elif op in STEP_OPS and self.stepping(policy, now, waiters_warm):
            longest = self.still.longest
        else:
            return policy.ceiling
        return clamp(longest, policy.factor, policy.slack, policy.floor, policy.ceiling)

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
                           "learned": self.warmed(op, policy, now),
                           "basis": self.basis(op, policy, now),
                           "step_op": op in STEP_OPS}
                for op, w in sorted(self.ops.items(), key=lambda kv: kv[0].value)}
