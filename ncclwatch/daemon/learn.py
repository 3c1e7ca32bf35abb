"""What each progress reading teaches: a rank's still periods, the job's waits.

A report's ``still_seconds`` per rank feeds the rank's history (stillness.py:
its normal still periods, whether it stepped) and its job's per-op wait
learner (waits.py: the adaptive hang threshold).
"""

from __future__ import annotations

import math

from ncclwatch.daemon.records import Job, RankRecord
from ncclwatch.model import CHECKPOINT_STATES, CollectiveOp, RankState

#: Seconds over which ``RankRecord.cpu_recent`` forgets: a rank that stopped
#: computing reads idle after a few of them, one starved round does not.
CPU_RECENT_TAU = 2.0


def smooth_cpu(avg: float, value: float, dt: float) -> float:
    """Exponential average of CPU use over ``CPU_RECENT_TAU`` seconds."""
    if dt <= 0 or dt > 60 * CPU_RECENT_TAU:
        return value
    a = 1.0 - math.exp(-dt / CPU_RECENT_TAU)
    return avg + a * (value - avg)


def take_progress(job: Job, rec: RankRecord, still: float, changed: bool, at: float,
              interval: float) -> None:
    """Apply a progress reading (still_seconds) to the rank and its job's learner.

    ``at``: when the report was built, on the daemon's clock (the table's
    anchor), not when it arrived: a still reading counts back from the moment
    it was read, as the states' ages do, or a report that sat in the agent's
    queue (a daemon restart's backlog) dates the wait that much late."""
    if still > 0 and not changed:
        # The round of every rank in a long wait (100k of them in a big job's
        # stall): still, its state as before. follow_wait is called only where it
        # has something to do: end a wait whose op moved, or start following one.
        rec.still_since = at - still
        job.still.add(rec.rank)
        op = rec.op
        wop = op if op is not CollectiveOp.NONE else (
            CollectiveOp.WAIT if rec.state is RankState.DEVICE_WAIT else CollectiveOp.NONE)
        if rec.still_at is not None:
            if wop is rec.still_op:
                return
        elif wop is CollectiveOp.NONE or rec.stack_at is None or rec.stack_at < at - still:
            return
        follow_wait(job, rec, rec.state, op, still, False, at, interval)
        return
    if still <= 0:
        ended = None if rec.still_since is None else at - rec.still_since
        if ended is not None:
            job.waits.still_ended(ended)
        rec.history.moved(at, ended, stepping=rec.state not in CHECKPOINT_STATES)
    if still > 0:
        rec.still_since = at - still
        job.still.add(rec.rank)
    else:
        rec.still_since = None
        job.still.discard(rec.rank)
    follow_wait(job, rec, rec.state, rec.op, still, changed, at, interval)


def follow_wait(job: Job, rec: RankRecord, state: RankState, op: CollectiveOp,
                 still: float, changed: bool, at: float, interval: float) -> None:
    """Track the rank's still wait and teach the job's learner when one ends.

    A wait is the run of rounds a rank sits still in one op. It ends when the
    rank makes progress or its stack shows another state; its length is
    taken up to this report (an upper bound: the learner errs long).
    """
    if op is CollectiveOp.NONE and state is not RankState.DEVICE_WAIT:
        wop = CollectiveOp.NONE
    else:
        wop = op if op is not CollectiveOp.NONE else CollectiveOp.WAIT
    if rec.still_at is not None and (changed or still <= 0 or wop is not rec.still_op):
        job.waits.ended(rec.still_op, at - rec.still_at, at)
        rec.still_at = None
    if still <= 0:
        job.waits.stepped(at)
    if wop is CollectiveOp.NONE:
        return
    if still <= 0:
        # Progress after the stack that placed the rank in the op: it got out.
        # (Progress in the round the stack was taken may be how it got in.)
        if rec.stack_at is not None and at - rec.stack_at >= interval:
            job.waits.progressed(wop, at)
    elif rec.still_at is None and rec.stack_at is not None and rec.stack_at >= at - still:
        # Only a stack taken while the rank sat still says where it sits.
        rec.still_at = max(rec.since, at - still)
        rec.still_op = wop
