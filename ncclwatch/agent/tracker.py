"""What the agent knows about one rank across rounds.

A state's start time is never observed directly: stacks are sampled. The
tracker takes the earliest time the evidence allows (the last dump that
showed another state), tightened by the moment the rank's CPU went quiet.
Erring early makes the watchdog budget smaller, never larger.

Ranks that wait are not always quiet (NCCL ranks spin in
cudaStreamSynchronize), so the tracker also follows progress: the rank's
read/write syscalls and its main thread's voluntary context switches. A
rank with none over a round is *still*, whatever CPU it burns.
"""

from __future__ import annotations

import math

from ncclwatch.agent.discover import RankProcess
from ncclwatch.agent.pausing import PauseBudget
from ncclwatch.agent.sample import ProcessSample
from ncclwatch.model import (CHECKPOINT_STATES, QUIET_CPU, CollectiveOp, progressed,
                             RankState, WaitEvidence)
from ncclwatch.native_signatures import NativeWait
from ncclwatch.signatures import Classification
from ncclwatch.stillness import StillHistory

#: States whose Python stack may hide a wait in C++ (issue 18): a native dump
#: of a rank still in one of them can say what it waits for.
NATIVE_CANDIDATES = frozenset({RankState.COMPUTE, RankState.UNKNOWN, RankState.DEVICE_WAIT})

#: Below this CPU (cores) of its own thread, a still rank whose Python stack
#: reads compute is idle: a frame with nothing running behind it (time.sleep,
#: a blocking C call), whatever its other threads spin.
IDLE_OWN_CPU = 0.05



class RankTracker:
    __slots__ = (
        "proc", "state", "op", "state_since", "stack_id", "stack_at", "sample",
        "cpu_util", "_cpu_at", "quiet_since", "quiet_at_last_dump", "forced",
        "env_sent", "repeats", "prev_state", "flight_recorder", "scheduler_job",
        "still_since", "still_at_last_dump", "events_at_dump", "files_at_dump",
        "progress_tid", "packages", "maps_at",
        "_cpu_before", "quiet_from", "still_from",
        "evidence", "native", "native_for", "native_stack", "native_dump_id", "forgiven", "pause_base",
        "own_cpu_util", "side_base", "history", "budget", "native_asked", "native_reason",
        "locals_timeout",
    )

    def __init__(self, proc: RankProcess, now: float) -> None:
        self.proc = proc
        #: Top-level packages the rank has imported, by the node's evidence
        #: (agent/imports.py), and when its maps were last read for them.
        self.packages: frozenset[str] = frozenset()
        self.maps_at: float | None = None
        self.state = RankState.UNKNOWN
        self.op = CollectiveOp.NONE
        self.state_since = now
        #: The thread whose progress is the rank's, when not its main thread (a
        #: Ray Train worker's TrainingThread, stacks.HOSTED_THREADS); 0: the process.
        self.progress_tid = 0
        self.stack_id = ""
        self.stack_at: float | None = None
        self.sample: ProcessSample | None = None
        self.cpu_util = 0.0
        #: CPU of the rank's own thread (None: not read).
        self.own_cpu_util: float | None = None
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
        #: (seconds, source) of the timeout a set-up frame's locals showed while
        #: the rank started (ranklocals.timeout_claim); kept for the process's life.
        self.locals_timeout: tuple[float, str] = (0.0, "")
        #: Since when the rank has made no progress (None: it made some last round).
        self.still_since: float | None = None
        self.still_at_last_dump = False
        #: Progress events when the last stack was taken (None: no sample then).
        self.events_at_dump: int | None = None
        #: The files the rank had open for writing when the last stack was taken.
        self.files_at_dump: frozenset[str] = frozenset()
        #: The process sample before the last one (its time).
        self._cpu_before: float | None = None
        #: The earliest the present quiet (still) spell can have begun: the start
        #: of the last interval that was not quiet (still), in which it set in.
        self.quiet_from: float | None = None
        self.still_from: float | None = None
        #: How the rank's waiting (state/op) was established.
        self.evidence = WaitEvidence.NONE
        #: The wait a native dump showed, held while the rank sits still with the
        #: same Python stack (``native_stack``); None: none shown.
        self.native: NativeWait | None = None
        #: The still period (its still_since) a native dump was taken in: once each.
        self.native_for: float | None = None
        self.native_stack = ""
        #: The interned stack (Stack.id) of the native dump of ``native_for``.
        self.native_dump_id = ""
        #: Progress events our own native dump caused (ptrace stops the threads:
        #: voluntary switches), not counted as progress in the next round.
        self.forgiven = 0
        #: While a native dump pauses the rank: its progress events when last
        #: read (the dump's own ptrace stops come after); None: no dump running.
        self.pause_base: int | None = None
        #: While a Flight Recorder dump asked of this still rank is written: the
        #: read/write calls of its other threads when last read (torch's own
        #: thread reads the pipe and writes the dump: the dump's calls, not
        #: progress). None: no dump asked.
        self.side_base: int | None = None
        #: The rank's normal still periods (pausing.py: when a pause is warranted).
        self.history = StillHistory()
        #: Seconds it was paused over the last hour (the pause budget).
        self.budget = PauseBudget()
        #: When the daemon last saw a stall's shape around this rank (its ask
        #: for native dumps, on the agent's clock); None: never.
        self.native_asked: float | None = None
        #: The shape the daemon saw, in its words ("every rank still", ...).
        self.native_reason = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def quiet(self) -> bool:
        return self.quiet_since is not None

    @property
    def still(self) -> bool:
        return self.still_since is not None

    @property
    def shown_state(self) -> RankState:
        """The state reported: the stack's, except a still rank whose stack
        reads compute while its own thread burns no CPU and is not runnable
        is idle (on a starved machine a computing thread gets little CPU, but
        the scheduler holds it runnable: it computes)."""
        if (self.state is RankState.COMPUTE and self.still_since is not None
                and self.own_cpu_util is not None and self.own_cpu_util < IDLE_OWN_CPU
                and (self.sample is None or self.sample.main_thread_state != "R")):
            return RankState.IDLE
        return self.state

    def still_seconds(self, now: float) -> float:
        """How long the rank has made no progress (0: it made some last round)."""
        return max(0.0, now - self.still_since) if self.still_since is not None else 0.0

    def progressed_since_dump(self) -> bool:
        """Progress events since the last stack beyond what a still rank shows."""
        if self.sample is None or self.events_at_dump is None or self.stack_at is None:
            return False
        return progressed(self.sample.progress_events - self.events_at_dump,
                          max(0.0, (self._cpu_at or 0.0) - self.stack_at))

    def moved_since_sample(self, events: int | None, now: float) -> bool:
        """Progress beyond a still rank's since the round's sample (``events``
        read now, as the samples read them): the rank moved on after it was
        last judged still. A pause is decided on a sample up to a round old and
        on Python stacks read after it; a rank whose wait ended between the two
        (a peer's long evaluation over, CI) must not be paused for it."""
        if self.sample is None or events is None or self._cpu_at is None:
            return False
        return progressed(events - self.sample.progress_events - self.forgiven,
                          max(1.0, now - self._cpu_at))

    def files_changed(self) -> bool:
        """A file opened for writing since the last stack: a save may have begun."""
        if self.sample is None:
            return False
        return any(f.path not in self.files_at_dump for f in self.sample.files_writing)

    def forgive(self, events: int) -> None:
        """``events`` progress events were ours (a native dump's ptrace stops)."""
        if events > 0:
            self.forgiven += events
            if self.events_at_dump is not None:
                self.events_at_dump += events

    def dump_asked(self, side: int | None) -> None:
        """A Flight Recorder dump was asked of the rank (``side``: side_events).

        Writing it is no progress: a still rank stays still through it (a
        reset would restart the hang ceiling, and leave the dump older than
        the still period it was asked in). Its own thread's progress counts
        as always; a rank whose progress is one thread's already leaves the
        others out."""
        if self.still_since is not None and not self.progress_tid and side is not None:
            self.side_base = side

    def dump_written(self, side: int | None, done: bool) -> None:
        """Before a sample while a dump is asked: the other threads' calls since
        the last reading are the dump's. ``done``: the dump was read (or given
        up on) in an earlier round, so this is the last reading."""
        if self.side_base is None:
            return
        if side is not None:
            self.forgive(side - self.side_base)
        self.side_base = None if done or side is None else side

    def pause_begins(self, events: int | None) -> None:
        """A native dump starts: progress read until it ends is the dump's own."""
        self.pause_base = events

    def pause_ends(self, events: int | None) -> None:
        base, self.pause_base = self.pause_base, None
        if base is not None and events is not None:
            self.forgive(events - base)

    def asked(self, native: bool, now: float, reason: str = "") -> None:
        """The daemon asked for the job's stacks: Python dumps at once, or
        (``native``: the job's shape says a stall is under way, ``reason``
        says which) leave to pause this rank if it sits still with a stack
        that says nothing."""
        if native:
            self.native_asked = now
            self.native_reason = reason
        else:
            self.forced = True

    def no_native_now(self) -> None:
        """No native dump in this still period (taken, failed or refused)."""
        self.native_for = self.still_since

    def job_changed(self) -> None:
        """What the rank says of its job changed: send the job info again."""
        self.env_sent = False

    def timeout_shown(self, shown: tuple[float, str]) -> None:
        """A timeout a set-up frame held (a new one sends the job info again)."""
        if shown[0] and shown != self.locals_timeout:
            self.locals_timeout = shown
            self.env_sent = False

    def stated_timeout(self) -> tuple[float, str]:
        """(seconds, source) the rank states: what its set-up frame passed to
        init_process_group, else its environment, command line or config file."""
        return self.locals_timeout if self.locals_timeout[0] else (
            self.proc.timeout, self.proc.timeout_source)

    def named(self, job) -> None:
        """The scheduler's name for the rank's job (a change sends it again)."""
        if job != self.scheduler_job:
            self.scheduler_job = job
            self.env_sent = False

    def imported(self, found: set[str], limit: int) -> None:
        """Packages the rank was seen to import (at most ``limit`` kept)."""
        if not found <= self.packages and len(self.packages) < limit:
            self.packages = frozenset(sorted(self.packages | found)[:limit])
            self.env_sent = False

    def hosted_in(self, tid: int) -> None:
        """The rank runs in thread ``tid``, not the process's main thread (a
        Ray actor's TrainingThread): its progress is that thread's."""
        self.progress_tid = tid

    def observe_flight_recorder(self, summary) -> None:
        """A Flight Recorder dump read from the rank's pipe (sent once)."""
        self.flight_recorder = summary

    def reported(self) -> None:
        """The sample went out: the job info and the Flight Recorder dump with it."""
        self.env_sent = True
        self.flight_recorder = None

    def observe_process(self, sample: ProcessSample, now: float) -> None:
        prev, prev_at, before = self.sample, self._cpu_at, self._cpu_before
        if self.pause_base is not None and prev is not None:
            # Mid-dump: the rank is stopped; what moved is ptrace's, not progress.
            moved = max(0, sample.progress_events - prev.progress_events)
            if self.events_at_dump is not None:
                self.events_at_dump += moved
            self.pause_base = sample.progress_events
            self.sample, self._cpu_at, self._cpu_before = sample, now, prev_at
            return
        self.sample, self._cpu_at, self._cpu_before = sample, now, prev_at
        if prev is None or prev_at is None or now <= prev_at:
            return
        # A spell that shows over [prev_at, now] may have set in anywhere in the
        # interval before (busy on average, not throughout): ``*_from``.
        # No sample before: it may have set in any time before (-inf: unbounded).
        began = before if before is not None else -math.inf
        self.cpu_util = max(0.0, (sample.cpu_seconds - prev.cpu_seconds) / (now - prev_at))
        self.own_cpu_util = (max(0.0, (sample.main_cpu_seconds - prev.main_cpu_seconds)
                                 / (now - prev_at))
                             if sample.main_cpu_seconds is not None
                             and prev.main_cpu_seconds is not None else None)
        if self.cpu_util < QUIET_CPU:
            if self.quiet_since is None:
                self.quiet_since = prev_at  # quiet over the whole last interval
                self.quiet_from = began
        else:
            self.quiet_since = self.quiet_from = None
        events = sample.progress_events - prev.progress_events - self.forgiven
        self.forgiven = 0
        if not progressed(events, now - prev_at):
            if self.still_since is None:
                self.still_since = prev_at  # still over the whole last interval
                self.still_from = began
        else:
            # A normal still period ended (its upper bound: erring long errs
            # toward pausing less).
            self.history.moved(now, None if self.still_since is None
                               else now - self.still_since,
                               stepping=self.state not in CHECKPOINT_STATES)
            self.still_since = self.still_from = None

    @property
    def native_no_wait(self) -> bool:
        """A native dump of this still period found no wait."""
        return (self.native is None and self.still_since is not None
                and self.native_for == self.still_since)

    @property
    def native_stack_id_now(self) -> str:
        """The native dump's stack while it is of this still period ("" after)."""
        return (self.native_dump_id if self.still_since is not None
                and self.native_for == self.still_since else "")

    def native_held(self, stack_id: str) -> bool:
        """The native wait still stands: the rank sat still since, same Python stack."""
        return (self.native is not None and self.still_since is not None
                and self.native_for == self.still_since and stack_id == self.native_stack)

    def observe_native(self, w: NativeWait | None, now: float, dump_id: str = "") -> None:
        """A native dump of this still period: ``w`` the wait it showed, if any;
        ``dump_id``: its main thread's stack as interned for the daemon.

        The wait began when the rank went still: its Python stack showed the
        same frames since (a dump is taken only after one in this still period).
        """
        self.native_for, self.native_dump_id = self.still_since, dump_id
        if w is None:
            return
        self.native, self.native_stack = w, self.stack_id
        self.prev_state = self.state
        if (w.state, w.op) != (self.state, self.op):
            self.state_since = self.still_since if self.still_since is not None else now
            self.state, self.op = w.state, w.op
        self.evidence = WaitEvidence.NATIVE_FRAME

    def observe_stack(self, c: Classification, stack_id: str, now: float) -> None:
        if self.native_held(stack_id):
            c = Classification(self.native.state, self.native.op)
        else:
            self.native = None
        self.repeats = self.repeats + 1 if stack_id == self.stack_id else 0
        self.prev_state = self.state
        same = (c.state, c.op) == (self.state, self.op) and self.stack_at is not None
        if not same or self._new_wait(c):
            self.state_since = self._start_estimate(now, c, new_wait=same)
            self.state, self.op = c.state, c.op
        self.stack_id = stack_id
        self.stack_at = now
        if self.native is not None:
            self.evidence = WaitEvidence.NATIVE_FRAME
        elif c.op is not CollectiveOp.NONE or c.state is RankState.DEVICE_WAIT:
            self.evidence = WaitEvidence.PYTHON_FRAME
        else:
            self.evidence = WaitEvidence.NONE
        self.quiet_at_last_dump = self.quiet
        self.still_at_last_dump = self.still
        if self.sample is not None:
            self.events_at_dump = self.sample.progress_events
            self.files_at_dump = frozenset(f.path for f in self.sample.files_writing)
        self.forced = False

    def _new_wait(self, c: Classification) -> bool:
        """The same wait as last time, but the rank made progress in between: a
        new wait (a loop's next all_reduce at the same line), not a longer one.

        Caveat: a waiting rank whose other threads make more than
        STILL_EVENTS_PER_S read/write calls would look like that at every
        dump. The gloo ranks measured here make none while they wait; NCCL's
        helper threads (watchdog, heartbeat) should not either (not checked
        on a GPU). Checkpoint work is one activity however many collectives
        it runs: a rank waiting tensor by tensor inside a state-dict gather
        keeps its start.
        """
        plain_wait = c.state in (RankState.COLLECTIVE, RankState.DEVICE_WAIT)
        return plain_wait and self.progressed_since_dump()

    def _start_estimate(self, now: float, c: Classification, new_wait: bool = False) -> float:
        """The earliest moment the evidence allows: the last dump that showed
        another state, tightened only by marks that are themselves earliest
        bounds (``quiet_from``/``still_from``, not ``*_since``: a wait that set
        in mid-interval leaves that interval busy on average). A new wait in
        the same state (``new_wait``) may have begun before the last dump,
        which showed that state too: only the marks bound it."""
        waiting = c.op is not CollectiveOp.NONE or c.state is not RankState.COMPUTE
        # An unbounded mark (-inf: no sample before the spell) counts from the
        # agent's first sample of it: the earliest moment it knows of.
        marks = [max(f, s) if f == -math.inf else f  # type: ignore[type-var]
                 for f, s in ((self.quiet_from, self.quiet_since),
                              (self.still_from, self.still_since)) if f is not None]
        if self.stack_at is None:
            # First look: if it has been quiet or still, it may have waited that
            # long (at least: since the agent's first samples, for all it knows).
            return min(marks) if (waiting and marks) else now
        start = self.stack_at
        if new_wait and waiting:
            return max(marks) if marks else start
        if waiting and self.quiet_from is not None:
            start = max(start, self.quiet_from)
        if waiting and self.still_from is not None:
            start = max(start, self.still_from)
        return start
