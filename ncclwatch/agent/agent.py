"""The agent's round: discover, sample, dump stacks where due, report.

Everything that touches the training processes is read-only: psutil reads
/proc, py-spy runs ``--nonblocking``. Blocking reads run in a worker thread
so the agent can share an event loop with the daemon (``ncclwatch run``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import psutil

from ncclwatch import __version__
from ncclwatch.agent import caps, imports, ranklocals
from ncclwatch.agent.alive import touch as mark_alive
from ncclwatch.agent.discover import Discovery, RankProcess
from ncclwatch.agent.frprobe import FlightRecorderProbe
from ncclwatch.agent.launchers import read_maps
from ncclwatch.agent.gpu import EMPTY, GpuReader, GpuReading, NvmlGpuReader, expected_gpus
from ncclwatch.agent.policy import CpuMeter
from ncclwatch.agent.pyspy import PySpy, PySpyError
from ncclwatch.agent.ranklearn import RankLearner
from ncclwatch.agent.report import (PARTS, AgentHealthCounts, admit, build_report, sample_pb,
                                    stack_pb)
from ncclwatch.agent.sample import ProcessSampler, progress_events, side_events
from ncclwatch.agent.scheduler import SchedulerLookup
from ncclwatch.agent.settings import AgentConfig
from ncclwatch.agent.tracker import RankTracker
from ncclwatch.agent.route import Router
from ncclwatch.sanitize import COUNTS, for_log, install_log_escaping
from ncclwatch.sdnotify import Notifier
from ncclwatch.native_signatures import classify_native_rank
from ncclwatch.signatures import DEFAULT_CLASSIFIER, Classifier
from ncclwatch.stacks import main_thread
from ncclwatch.v1 import collector_pb2 as pb

log = logging.getLogger(__name__)

#: Resend each rank's job info (env) every this many rounds. A daemon that
#: lacks it gets it sooner: a new stream, or a resync it asks for, resends it.
JOB_INFO_EVERY = 600
#: Stacks kept for resending after a reconnect, beyond those in use.
STACK_CACHE = 1024
#: A rank's /proc/PID/maps is read for its imported packages at most this often (s).
MAPS_EVERY = 30.0


class Agent:
    def __init__(self, config: AgentConfig, *, gpu: GpuReader | None = None,
                 pyspy: PySpy | None = None, classifier: Classifier = DEFAULT_CLASSIFIER,
                 discovery: Discovery | None = None, notifier: Notifier | None = None,
                 scheduler: SchedulerLookup | None = None) -> None:
        install_log_escaping()      # a rank's text never forges a log line
        self.config = config
        self.notifier = notifier
        self.agent_id = uuid.uuid4().hex
        self.discovery = discovery or Discovery(config.node, ranks=config.ranks,
                                                pods_root=config.pods_log_dir)
        self.sampler = ProcessSampler()
        self.frprobe = FlightRecorderProbe()
        #: Numbers of unnumbered members, learned from what the job holds.
        self.ranks_learned = RankLearner()
        self.frame_packages = imports.FramePackages()
        self.scheduler = scheduler or SchedulerLookup()
        self.gpu = gpu if gpu is not None else NvmlGpuReader()
        self.gpus_expected = expected_gpus()
        self.pyspy = pyspy or PySpy(timeout=config.pyspy_timeout, view_socket=config.view_helper)
        self.classifier = classifier
        self.trackers: dict[int, RankTracker] = {}
        self.stacks: dict[str, pb.Stack] = {}
        self._sent_ids: dict[str, str] = {}   # raw stack id -> the id of the stack as sent
        self.uplink = Router(config.collector, self.stacks, max_queue=config.max_queue,
                              on_command=self._on_command, on_connect=self._on_connect,
                              tls=config.tls)
        self.seq = 0
        self.rounds = 0
        self._exited: list[RankProcess] = []
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()
        self._sem = asyncio.Semaphore(max(1, config.pyspy_concurrency))
        #: pid -> its native dump in flight (at most one per rank).
        self._native: dict[int, asyncio.Task] = {}
        #: Pids whose sample failed: said once at info (the daemon then counts the
        #: rank gone on a full round), later at debug.
        self._left_out: set[int] = set()
        #: Native dumps a rank's stillness asked for that its spent pause budget refused.
        self.native_refused_total = 0
        self._self = psutil.Process()
        self._cpu = CpuMeter(config.policy.cpu_window)
        self.cpu_cores = 0.0

    # -- control -----------------------------------------------------------

    def stop(self) -> None:
        self._stopped.set()
        for task in list(self._native.values()):
            task.cancel()
        self._wake.set()
        self.uplink.stop()

    async def run(self) -> None:
        uplink = asyncio.create_task(self.uplink.run(), name="ncclwatch-uplink")
        try:
            await self.run_rounds()
        finally:
            self.uplink.stop()
            await uplink

    async def run_rounds(self) -> None:
        next_at = time.monotonic()
        while not self._stopped.is_set():
            try:
                await self.round()
            except Exception:  # a bad round must not end the agent
                log.exception("agent round failed")
            else:
                # READY after the first round, watchdog pings after each: a
                # wedged loop stops them. The collector's state does not
                # matter here: reports queue while it is away.
                if self.notifier:
                    self.notifier.alive(self.status_line)
                if self.config.alive_file:
                    mark_alive(self.config.alive_file)
            next_at += self.config.interval
            delay = next_at - time.monotonic()
            if delay < 0:  # overran: skip ahead instead of bursting
                next_at, delay = time.monotonic(), 0.0
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
            except asyncio.TimeoutError:
                pass

    def _on_command(self, cmd: pb.Command) -> None:
        if cmd.HasField("dump_stacks"):
            job = cmd.dump_stacks.job_id
            hit, now = 0, time.monotonic()
            for t in self.trackers.values():
                if t.proc.identity.job_id == job:
                    # native: the job's shape says a stall is under way (still
                    # ranks whose stacks say nothing may be paused,
                    # policy.abnormal); no Python dumps forced with it.
                    t.asked(cmd.dump_stacks.native, now, cmd.dump_stacks.reason)
                    hit += 1
            if hit:
                log.debug("daemon asked for stacks of %s (%s)", for_log(job),
                          for_log(cmd.dump_stacks.reason))
                self._wake.set()
        elif cmd.HasField("dump_flight_recorder"):
            job = cmd.dump_flight_recorder.job_id
            mine = [t for t in self.trackers.values() if t.proc.identity.job_id == job]
            # Read before asking: torch's thread may write the dump at once.
            before = {t.pid: side_events(t.pid) for t in mine if t.side_base is None}
            n = self.frprobe.request([t.proc for t in mine])
            for t in mine:
                if t.pid in before and self.frprobe.pending(t.pid):
                    t.dump_asked(before[t.pid])
            if n:
                log.info("asked %d rank(s) of %s for a Flight Recorder dump (%s)", n,
                         for_log(job), for_log(cmd.dump_flight_recorder.reason))

    def _on_connect(self) -> None:
        # A new stream may be a new daemon: send every rank's job info again.
        for t in self.trackers.values():
            t.job_changed()

    def status_line(self) -> str:
        """One line for ``systemctl status``: what is watched, where it goes."""
        ranks = len(self.trackers)
        jobs = len({t.proc.identity.job_id for t in self.trackers.values()})
        watching = (f"watching {ranks} rank{'' if ranks == 1 else 's'} of {jobs} "
                    f"job{'' if jobs == 1 else 's'}" if ranks else "no ranks found")
        return f"{watching}, {self.uplink.status()}"

    # -- one round -----------------------------------------------------------

    async def round(self) -> pb.NodeReport:
        gpu_reading = await asyncio.to_thread(self._scan_and_sample)
        now = time.monotonic()
        due = self.config.policy.due(self.trackers.values(), now,
                                     over_budget=self.cpu_cores > self.config.policy.cpu_budget)
        if due and self.pyspy.available:
            await asyncio.gather(*(self._dump(t) for t in due))
        if self.pyspy.available:
            # Native dumps run beside the rounds (one takes up to a second of
            # py-spy's symbol loading): a round never waits for one.
            room = self.config.policy.max_native_per_round - len(self._native)
            now = time.monotonic()
            for t in self.config.policy.native_due(
                    [t for t in self.trackers.values() if t.pid not in self._native],
                    now)[:max(0, room)]:
                if self._budget_spent(t, now):
                    continue
                log.info("native dump of rank %s of %s (pid %d), which pauses it: %s",
                         t.proc.identity.rank, for_log(t.proc.identity.job_id), t.pid,
                         self.config.policy.why(t, now))
                task = asyncio.create_task(self._dump_native(t), name=f"native-{t.pid}")
                self._native[t.pid] = task
                task.add_done_callback(lambda _t, pid=t.pid: self._native.pop(pid, None))
        if self.frprobe.waiting:
            for pid, summary in (await asyncio.to_thread(self.frprobe.poll)).items():
                t = self.trackers.get(pid)
                if t is not None:
                    t.observe_flight_recorder(summary)
        report = self._build(gpu_reading)
        self.uplink.submit(report)
        self.rounds += 1
        return report

    def _scan_and_sample(self) -> GpuReading:
        procs = self.discovery.scan(self.config.interval * caps.SCAN_SHARE)
        now = time.monotonic()
        procs = self.ranks_learned.apply(procs, now)
        alive = {p.pid: p for p in procs}
        for pid in list(self.trackers):
            t = self.trackers[pid]
            new = alive.get(pid)
            if new is not None and _numbered_later(t.proc, new):
                # The job showed the member's number (ranklearn): the same
                # process goes on under it, its history kept; the daemon sees
                # the unnumbered member leave as the rank appears.
                if new.identity.rank != t.proc.identity.rank:
                    self._exited.append(t.proc)
                    log.info("rank %d of job %s is pid %d (rank from %s)", new.identity.rank,
                             for_log(new.identity.job_id), pid,
                             for_log(new.identity.rank_source))
                t.proc = new
                continue
            # A changed identity (a Lightning child numbered once its siblings
            # are all up) ends the old one: the daemon sees it exit.
            if pid not in alive or alive[pid].create_time != t.proc.create_time \
                    or alive[pid].identity != t.proc.identity:
                self._exited.append(t.proc)
                self.sampler.forget(pid)
                self.frprobe.forget(pid)
                self.frame_packages.forget(pid)
                del self.trackers[pid]
                self._left_out.discard(pid)
                if pid not in alive or alive[pid].create_time != t.proc.create_time:
                    log.info("stopped watching rank %s of job %s (pid %d): %s",
                             t.proc.identity.rank if t.proc.identity.known else "?",
                             for_log(t.proc.identity.job_id), pid,
                             "no longer seen as a rank" if _running(pid) else "exited")
        for pid, proc in alive.items():
            if pid not in self.trackers:
                self.trackers[pid] = RankTracker(proc, now)
                log.info("watching rank %s of job %s (pid %d, rank from %s)",
                         proc.identity.rank if proc.identity.known else "?",
                         for_log(proc.identity.job_id), pid, for_log(proc.identity.rank_source))
        for pid, t in list(self.trackers.items()):
            asked = t.side_base is not None   # a Flight Recorder dump we asked for
            sample = self.sampler.sample(pid, tid=t.progress_tid, side=asked)
            if sample is None:  # exited between scan and sample
                self._exited.append(t.proc)
                self.frprobe.forget(pid)
                del self.trackers[pid]
                self._left_out.discard(pid)
                continue
            if asked:   # the other threads' calls since the last reading are the dump's
                t.dump_written(sample.side_events, done=not self.frprobe.pending(pid))
            t.observe_process(sample, time.monotonic())
            try:
                self._name_job(t)
            except Exception as e:  # noqa: BLE001 - one rank's strange job must not fail the round
                COUNTS.fields_dropped_total += 1
                log.debug("no scheduler job for pid %d: %s", pid, for_log(repr(e)))
        return self.gpu.read() if self.gpu.up else EMPTY

    def _budget_spent(self, t: RankTracker, now: float) -> bool:
        """The rank's pause budget is spent: refuse this still period's dump
        (counted once), and say so once until the budget frees again."""
        pause = self.config.policy.pause
        if not t.budget.spent(pause, now):
            return False
        t.no_native_now()  # not asked again in this still period
        self.native_refused_total += 1
        if not t.budget.spent_said:
            t.budget.spent_said = True
            log.warning("pause budget of rank %s of job %s (pid %d) spent: %.1fs of native "
                        "stacks in the last hour (--pause-budget %.1f); no more until the "
                        "hour frees some", t.proc.identity.rank, for_log(t.proc.identity.job_id),
                        t.pid, t.budget.used(now), pause.budget)
        return True

    def _ranks_budget_spent(self, now: float) -> int:
        pause, n = self.config.policy.pause, 0
        for t in self.trackers.values():
            if t.budget.spent(pause, now):
                n += 1
            else:
                t.budget.spent_said = False
        return n

    def _name_job(self, t: RankTracker) -> None:
        """The scheduler's job name and user (a query per job id, cached, bounded)."""
        if t.scheduler_job is not None and t.scheduler_job.complete:
            return
        t.named(self.scheduler.job(t.proc.env))

    async def _dump(self, t: RankTracker) -> None:
        async with self._sem:
            if self._stopped.is_set() or t.pid not in self.trackers:
                return
            raw: list | None = [] if self.ranks_learned.wants_locals(t.proc) else None
            try:
                threads = await self.pyspy.dump(t.pid, raw=raw)
            except PySpyError as e:
                log.debug("%s", e)
                if raw is not None:   # locals cost the stack (too long, too slow): no more
                    self.ranks_learned.no_locals(t.proc)
                return
        if raw:
            self.ranks_learned.from_locals(t.proc, raw)
            t.timeout_shown(ranklocals.timeout_claim(raw))
        # Within the caps first (a recursion 5,000 deep keeps its innermost and
        # outermost frames): what is classified is what is sent.
        threads = caps.trim_threads(threads)
        # the main thread, or the rank's own thread it waits on (an async save)
        seen = self.classifier.classify_rank(threads, t.pid)
        if seen is None:
            return
        c, stack = seen
        # A rank hosted in another thread (a Ray actor's TrainingThread): its
        # progress is that thread's, not the busy process's (Ray's own I/O).
        main = main_thread(threads, t.pid)
        if main is not None and main.os_thread_id not in (0, t.pid):
            t.hosted_in(main.os_thread_id)
        # Named by the id of the stack as sent (its gated frames), the one the
        # daemon checks; the raw id only finds it again without gating anew.
        sid = self._sent_ids.get(stack.id)
        if sid is None or sid not in self.stacks:
            spb = stack_pb(stack)
            sid = self._sent_ids[stack.id] = spb.id
            self.stacks[sid] = spb
        now = time.monotonic()
        self._note_imports(t, [f.filename for f in stack.frames], now)
        t.observe_stack(c, sid, now)

    def _intern_native(self, threads, pid: int) -> str:
        """The native dump's main thread as a stack the reports carry (its id)."""
        main = main_thread(list(caps.trim_threads(threads)), pid)
        if main is None or not main.stack.frames:
            return ""
        spb = stack_pb(main.stack)
        self.stacks.setdefault(spb.id, spb)
        return spb.id

    def _note_imports(self, t: RankTracker, files: list[str], now: float) -> None:
        """What the rank imported (frameworks.py decides by it): its mapped shared
        objects (read again at most every MAPS_EVERY s) and its stack's files."""
        found = set(self.frame_packages.of_files(t.pid, files))
        if t.maps_at is None or now - t.maps_at > MAPS_EVERY:
            t.maps_at = now
            maps = read_maps(t.pid)
            if maps:
                found |= imports.of_maps(maps)
        t.imported(found, imports.MAX_PACKAGES)

    async def _dump_native(self, t: RankTracker) -> None:
        """One native dump of a rank still past the threshold (it pauses the rank)."""
        # Not under the round's py-spy semaphore: at most max_native_per_round
        # run at once (round() bounds them), and one per rank (PySpy's lock).
        # Still by this round's /proc sample, taken just before: a rank that made
        # progress in its last round is never paused.
        if self._stopped.is_set() or t.pid not in self.trackers or not t.still \
                or self.pyspy.busy(t.pid):
            return  # (busy: a Python dump of it runs; the next round asks again)
        # And still now: its progress read again just before the pause.
        events = progress_events(t.pid, t.progress_tid)
        if t.moved_since_sample(events, time.monotonic()):
            log.info("native dump of pid %d not taken: it moved on since its last sample",
                     t.pid)
            return
        still_for = t.still_since
        t.pause_begins(events)
        began = time.monotonic()
        try:
            threads = await self.pyspy.dump_native(t.pid)
        except PySpyError as e:
            t.native_for = still_for  # once per still period, failed or not (it may
            # have moved on meanwhile: the still period the dump was of)
            log.info("native stack of pid %d: %s", t.pid, e)
            return
        finally:
            # py-spy's whole run: an upper bound on the pause, charged to the budget.
            t.budget.add(began, time.monotonic() - began)
            # ptrace stops count as the thread's voluntary switches: the dump's
            # own, not progress of the rank (else it would end the very still
            # period it looked at, and be taken again). Read as the samples
            # read it: the rank's own thread where it has one (Ray Train).
            t.pause_ends(progress_events(t.pid, t.progress_tid))
        if t.still_since != still_for:
            return  # it moved while we looked
        w = classify_native_rank(threads, t.pid)
        t.observe_native(w, time.monotonic(), self._intern_native(threads, t.pid))
        if w is not None:
            self._wake.set()  # report the wait now, not at the next round
            log.info("rank %s of %s waits in %s (native frame %s)", t.proc.identity.rank,
                     t.proc.identity.job_id, w.op.value if w.op.value != "none"
                     else w.state.value, w.frame)

    def _build(self, gpu_reading: GpuReading) -> pb.NodeReport:
        now = time.monotonic()
        by_pid = gpu_reading.by_pid()
        devices = {d.index: d for d in gpu_reading.devices}
        built: list[pb.RankSample] = []
        refresh = self.rounds % JOB_INFO_EVERY == 0
        for t in self.trackers.values():
            with_job = refresh or not t.env_sent
            try:
                built.append(sample_pb(t, now, by_pid.get(t.pid, ()), devices, with_job))
            except Exception as e:  # noqa: BLE001 - one rank never fails the round
                COUNTS.fields_dropped_total += 1
                (log.debug if t.pid in self._left_out else log.info)(
                    "left pid %d out of this round: %s", t.pid, for_log(repr(e)))
                self._left_out.add(t.pid)
                continue
            t.reported()
        # The numbers are final here (ranklearn ran in the scan): each sample
        # within the daemon's rules, one process per (job, rank).
        samples = admit(built)
        self._trim_stacks()
        self.seq += 1
        cpu = self._self.cpu_times()
        self.cpu_cores = self._cpu.add(now, cpu.user + cpu.system + cpu.children_user
                                       + cpu.children_system)
        health = AgentHealthCounts(
            version=__version__, nvml_up=self.gpu.up, gpus_expected=self.gpus_expected,
            pyspy_runs_total=self.pyspy.runs_total,
            pyspy_failures_total=self.pyspy.failures_total,
            pyspy_seconds_total=self.pyspy.seconds_total,
            native_dumps_total=self.pyspy.native_total,
            native_dump_failures_total=self.pyspy.native_failures_total,
            native_dump_seconds_total=self.pyspy.native_seconds_total,
            native_dump_buckets=tuple(self.pyspy.native_buckets),
            pause_budget_seconds=self.config.policy.pause.budget,
            native_dumps_refused_total=self.native_refused_total,
            ranks_pause_budget_spent=self._ranks_budget_spent(now),
            reports_dropped_total=self.uplink.dropped_total,
            queue_length=self.uplink.queue_length,
            # py-spy runs as our child: its CPU is our cost too.
            cpu_seconds_total=cpu.user + cpu.system + cpu.children_user + cpu.children_system,
            fields_dropped_total=COUNTS.fields_dropped_total,
            texts_escaped_total=COUNTS.escaped_total,
            texts_truncated_total=COUNTS.truncated_total,
            stacks_trimmed_total=caps.COUNTS.stacks_trimmed_total,
            flight_recorder_trimmed_total=caps.COUNTS.flight_recorder_trimmed_total,
            rank_budget_hits=tuple(caps.COUNTS.budget_list()),
            parts_left_out=tuple(PARTS.as_list()),
        )
        exited, self._exited = self._exited, []
        return build_report(node=self.config.node, agent_id=self.agent_id, seq=self.seq,
                            now=now, wall=time.time(), interval=self.config.interval,
                            samples=samples, exited=exited, health=health,
                            ranks_watched=len(self.trackers))

    def _trim_stacks(self) -> None:
        if len(self.stacks) <= STACK_CACHE:
            return
        in_use = {sid for t in self.trackers.values() for sid in (t.stack_id, t.native_dump_id)}
        for sid in list(self.stacks)[: len(self.stacks) - STACK_CACHE]:
            if sid not in in_use:
                del self.stacks[sid]
        self._sent_ids = {raw: sid for raw, sid in self._sent_ids.items() if sid in self.stacks}


def _numbered_later(old: RankProcess, new: RankProcess) -> bool:
    """``new`` is ``old`` given a number (or a disagreement) the job showed."""
    return (old.create_time == new.create_time and not old.identity.known
            and old.identity.job_id == new.identity.job_id
            and (new.identity.known or new.identity.rank_conflict != old.identity.rank_conflict))


def _running(pid: int) -> bool:
    """The pid is a live process (a zombie has exited: its parent has not reaped it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
