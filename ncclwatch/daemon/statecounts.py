"""Each job's counts of its ranks by what the tick asks of them first.

The tick runs every half second over every job, and its first questions
of a job (is any rank still, or in checkpoint work, or still in its wait?
how many live ranks neither wait nor sit still?) were answered by walking
the job's ranks: a tick cost as much as the jobs were big, though a
healthy job's answer is "nothing". These counts are kept as reports are
applied (the table calls ``update`` with each rank record it changed, and
``drop`` with one it forgets), so those answers cost O(1) and a quiet job
is passed over without a walk (core.Daemon.tick). They only ever let work
be skipped that could not change a verdict; whatever might, walks as before.

One rule says what a rank counts as (``key_of``); ``recount`` applies the
same rule to the whole job, and is what the tests hold the counts to.
"""

from __future__ import annotations

from ncclwatch.daemon.records import Job, RankRecord
from ncclwatch.model import CHECKPOINT_STATES, CollectiveOp, RankState

#: A rank's flags (``key_of``): live (not gone), waiting on its peers (in a
#: collective, or at a device sync: Job.waiting), still (no progress:
#: still_since set, Job.still), still in its wait (still_at set), with
#: progress readings.
LIVE, WAITING, STILL, STILL_WAIT, READ = 1, 2, 4, 8, 16

_NONE, _DEVICE_WAIT = CollectiveOp.NONE, RankState.DEVICE_WAIT
#: A key is an int, ``state index << 5 | flags``: a tuple per rank would be one
#: more object per rank for the garbage collector to walk (a 20k-rank stall's
#: tick took three times as long with them).
_STATES = tuple(RankState)
_INDEX = {s: i << 5 for i, s in enumerate(_STATES)}


def key_of(rec: RankRecord) -> int:
    """What ``rec`` counts as: its state and its flags, in one int."""
    flags = _INDEX[rec.state] | (LIVE if rec.gone_at is None else 0)
    if rec.op is not _NONE or rec.state is _DEVICE_WAIT:
        flags |= WAITING
    if rec.still_since is not None:
        flags |= STILL
    if rec.still_at is not None:
        flags |= STILL_WAIT
    if rec.progress_known:
        flags |= READ
    return flags


class StateCounts:
    """One job's ranks counted by ``key_of``, kept as its records change.

    - ``live``: ranks not gone; ``by_state``: live ranks per state;
      ``checkpoint``: live ranks in checkpoint work;
    - ``waiting``: live ranks waiting on their peers;
    - ``still``: ranks with a still period (gone ones too, as Job.still
      keeps them); ``still_live``: the live ones among them;
    - ``still_waiting``: live waiting ranks still in their wait (still_at);
    - ``unread_waiting``: live waiting ranks without progress readings;
    - ``moving``: live ranks neither waiting nor still.
    """

    __slots__ = ("job", "keys", "live", "by_state", "checkpoint", "waiting", "still",
                 "still_live", "still_waiting", "unread_waiting", "moving")

    def __init__(self, job: Job) -> None:
        #: The job counted: counts of another Job object (a job id that left
        #: the table and came back) are never read for this one.
        self.job = job
        #: Rank key -> what it was counted as.
        self.keys: dict[int, int] = {}
        self.live = self.checkpoint = self.waiting = self.still = 0
        self.still_live = self.still_waiting = self.unread_waiting = self.moving = 0
        self.by_state: dict[RankState, int] = dict.fromkeys(RankState, 0)

    @classmethod
    def recount(cls, job: Job) -> StateCounts:
        """The counts of ``job`` from a walk over its ranks."""
        out = cls(job)
        for rec in job.ranks.values():
            out.update(rec)
        return out

    def update(self, rec: RankRecord) -> None:
        """Count ``rec`` as it is now (after any change to its record)."""
        key = key_of(rec)
        keys = self.keys
        old = keys.get(rec.rank)
        if old == key:
            return
        if old is not None:
            self._count(old, -1)
        keys[rec.rank] = key
        self._count(key, 1)

    def drop(self, rank: int) -> None:
        """The job no longer holds the rank (its record left the table)."""
        old = self.keys.pop(rank, None)
        if old is not None:
            self._count(old, -1)

    def _count(self, flags: int, n: int) -> None:
        state = _STATES[flags >> 5]
        if flags & STILL:
            self.still += n
        if not flags & LIVE:
            return
        self.live += n
        self.by_state[state] += n
        if state in CHECKPOINT_STATES:
            self.checkpoint += n
        if flags & STILL:
            self.still_live += n
        if flags & WAITING:
            self.waiting += n
            if flags & STILL_WAIT:
                self.still_waiting += n
            if not flags & READ:
                self.unread_waiting += n
        elif not flags & STILL:
            self.moving += n

    def quiet(self) -> bool:
        """No rank still (live or gone), none in checkpoint work, no waiting
        rank still in its wait: what a job must be before its waits' ages
        alone can say that no detector has anything to find in it
        (core.Daemon.tick asks them of the budget's longest wait)."""
        return not (self.still or self.checkpoint or self.still_waiting)

    def snapshot(self) -> dict:
        """The counts as a plain dict (what tests compare with a recount)."""
        return {"live": self.live, "checkpoint": self.checkpoint, "waiting": self.waiting,
                "still": self.still, "still_live": self.still_live,
                "still_waiting": self.still_waiting, "unread_waiting": self.unread_waiting,
                "moving": self.moving,
                "by_state": {s: n for s, n in self.by_state.items() if n}}
