"""What the agent knows about one rank across rounds.

A state's start time is never observed directly: stacks are sampled. The
tracker takes the earliest time the evidence allows (the last dump that
showed another state), tightened by the moment the rank's CPU went quiet.
Erring early makes the watchdog budget smaller, never larger.
"""

from __future__ import annotations

from ncclwatch.agent.discover import RankProcess
from ncclwatch.agent.sample import ProcessSample
from ncclwatch.model import QUIET_CPU, CollectiveOp, RankState
from ncclwatch.signatures import Classification



class RankTracker:
    __slots__ = (
        "proc", "state", "op", "state_since", "stack_id", "stack_at", "sample",
        "cpu_util", "_cpu_at", "quiet_since", "quiet_at_last_dump", "forced",
        "env_sent", "repeats", "prev_state", "flight_recorder", "scheduler_job",
    )

    def __init__(self, proc: RankProcess, now: float) -> None:
        self.proc = proc
        self.state = RankState.UNKNOWN
        self.op = CollectiveOp.NONE
        self.state_since = now
        self.stack_id = ""
        self.stack_at: float | None = None
        self.sample: ProcessSample | None = None
        self.cpu_util = 0.0
        self._cpu_at: float | None = None
        self.quiet_since: float | None = None
        self.quiet_at_last_dump = False
        self.forced = False
        self.env_sent = False
        #: Consecutive dumps that showed the same stack (0: the last one was new).
        self.repeats = 0
        #: The state the dump before the last one showed.
        self.prev_state = RankState.UNKNOWN
        #: A Flight Recorder summary read since the last report (pb), sent once.
        self.flight_recorder = None
        #: The scheduler's name and user for the rank's job (SchedulerJob), if any.
        self.scheduler_job = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def quiet(self) -> bool:
        return self.quiet_since is not None

    def observe_process(self, sample: ProcessSample, now: float) -> None:
        prev, prev_at = self.sample, self._cpu_at
        self.sample, self._cpu_at = sample, now
        if prev is None or prev_at is None or now <= prev_at:
            return
        self.cpu_util = max(0.0, (sample.cpu_seconds - prev.cpu_seconds) / (now - prev_at))
        if self.cpu_util < QUIET_CPU:
            if self.quiet_since is None:
                self.quiet_since = prev_at  # quiet over the whole last interval
        else:
            self.quiet_since = None

    def observe_stack(self, c: Classification, stack_id: str, now: float) -> None:
        self.repeats = self.repeats + 1 if stack_id == self.stack_id else 0
        self.prev_state = self.state
        if (c.state, c.op) != (self.state, self.op) or self.stack_at is None:
            self.state_since = self._start_estimate(now, c)
            self.state, self.op = c.state, c.op
        self.stack_id = stack_id
        self.stack_at = now
        self.quiet_at_last_dump = self.quiet
        self.forced = False

    def _start_estimate(self, now: float, c: Classification) -> float:
        waiting = c.op is not CollectiveOp.NONE or c.state is not RankState.COMPUTE
        if self.stack_at is None:
            # First look: if it has been quiet, it may have waited that long.
            return self.quiet_since if (waiting and self.quiet_since is not None) else now
        start = self.stack_at
        if waiting and self.quiet_since is not None:
            start = max(start, self.quiet_since)
        return start
