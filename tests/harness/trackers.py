"""A rank as the agent's tracker and stack policy see it, fed one round a second.

The readings are those GPU-shaped ranks give: a step's still period (the main
thread spins in a synchronize: no read/write calls, no voluntary switches) and,
per step, a burst of reads (a batch arriving) or nothing at all.
"""

from __future__ import annotations

from ncclwatch.agent.discover import RankIdentity, RankProcess
from ncclwatch.agent.policy import StackPolicy
from ncclwatch.agent.sample import ProcessSample
from ncclwatch.agent.tracker import RankTracker
from ncclwatch.model import RankState
from ncclwatch.signatures import Classification

COMPUTE = Classification(RankState.COMPUTE)
POLICY = StackPolicy()  # the defaults a user gets


def rank_tracker(pid: int = 4242) -> RankTracker:
    """The tracker of rank 1 of a 3-rank job "j", started at 0."""
    ident = RankIdentity(job_id="j", rank=1, local_rank=1, world_size=3, job_source="test",
                         rank_source="env:RANK")
    return RankTracker(RankProcess(pid=pid, create_time=0.0, identity=ident, env={}), 0.0)


class Rank:
    """A tracker fed one round a second; counts the rounds a native dump was due."""

    def __init__(self, policy: StackPolicy = POLICY) -> None:
        self.t, self.policy = rank_tracker(), policy
        self.now, self.events, self.cpu = 0.0, 0, 0.0
        self.blocked = ""   # what the agent reads its thread is blocked in
        self.due_at: list[float] = []
        self._round(0)

    def _round(self, events: int) -> None:
        self.events += events
        self.cpu += 1.0  # spinning: the CPU is busy whether it works or waits
        self.t.observe_process(ProcessSample(pid=self.t.pid, cpu_seconds=self.cpu, rss_bytes=1,
                                             io_read_bytes=0, io_write_bytes=0, num_threads=8,
                                             files_writing=(), progress_events=self.events,
                                             blocked_in=self.blocked),
                               self.now)
        if self.t.still and (self.t.stack_at is None or self.t.stack_at < self.t.still_since):
            self.t.observe_stack(COMPUTE, "spin", self.now)  # the Python stack reads compute
        if self.policy.native_due([self.t], self.now):
            self.due_at.append(self.now)
            self.t.observe_native(None, self.now)  # taken: once per still period
        self.now += 1.0

    def step(self, seconds: int, reads: int = 20) -> None:
        """A step: ``reads`` read calls at its start (a batch), then still."""
        self._round(reads)
        for _ in range(seconds - 1):
            self._round(0)

    def still(self, seconds: int) -> None:
        for _ in range(seconds):
            self._round(0)
