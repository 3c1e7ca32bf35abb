"""Waits the Python stack does not show (issue 18): how each rank's waiting
is established (python frame, native frame, stillness), in the agent's
tracker and policy, on the wire, and in the daemon's verdict and views."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import time

import pytest

from ncclwatch.agent.discover import RankIdentity, RankProcess
from ncclwatch.agent.pausing import PausePolicy
from ncclwatch.agent.policy import StackPolicy
from ncclwatch.agent.pyspy import NATIVE_BUCKETS, PySpy, find_pyspy, native_argv
from ncclwatch.agent.report import sample_pb
from ncclwatch.agent.sample import ProcessSample, progress_events
from ncclwatch.agent.tracker import RankTracker
from ncclwatch.daemon.api import incident_view, jobs_view
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.model import CollectiveOp, RankState, StallKind, WaitEvidence
from ncclwatch.native_signatures import NativeWait, classify_native_rank
from ncclwatch.signatures import Classification
from ncclwatch.stacks import stack_id
from ncclwatch.status import render
from ncclwatch.stillness import StillHistory, StillRule, Warmup
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.reports import SAVE, report, sample, stack_pb

S, Op, E = RankState, CollectiveOp, WaitEvidence
COMPUTE = Classification(S.COMPUTE)
REDUCER = NativeWait(S.COLLECTIVE, Op.ALL_REDUCE, "c10d::Reducer::finalize_backward")


def _tracker() -> RankTracker:
    ident = RankIdentity(job_id="j", rank=1, local_rank=1, world_size=2, job_source="test",
                         rank_source="env:RANK")
    return RankTracker(RankProcess(pid=4242, create_time=0.0, identity=ident, env={}), 0.0)


def _proc(events: int, cpu: float = 0.0) -> ProcessSample:
    return ProcessSample(pid=4242, cpu_seconds=cpu, rss_bytes=1, io_read_bytes=0,
                         io_write_bytes=0, num_threads=4, files_writing=(),
                         progress_events=events)


def _still_rank(still_for: float) -> RankTracker:
    """A rank that computed, then sat still (spinning: CPU busy) for ``still_for`` s."""
    t = _tracker()
    t.history = StillHistory(INSTANT)  # judged by WARM at once (the others: never)
    t.observe_process(_proc(0, 0.0), 0.0)
    t.observe_process(_proc(500, 1.0), 1.0)       # progress: stepping
    t.observe_stack(COMPUTE, "py-stack", 1.0)
    t.observe_process(_proc(500, 2.0), 2.0)       # still since 1.0, CPU busy
    t.observe_stack(COMPUTE, "py-stack", 2.5)     # the Python stack in the still period
    t.observe_process(_proc(500, 1.0 + still_for), 1.0 + still_for)
    return t


#: A rank's history counts after one round of progress (the default wants 10 over
#: 20 s, then 3 still periods ended, and over 3x the threshold it sets).
INSTANT = Warmup(rounds=1, seconds=0.0)
WARM = PausePolicy(warm_span=0.0, rule=StillRule(periods=0))


def test_native_dump_only_of_a_rank_still_past_the_threshold() -> None:
    policy = StackPolicy(native_after=3.0, pause=WARM)
    assert policy.native_due([_still_rank(2.0)], 3.0) == []
    t = _still_rank(4.0)
    assert policy.native_due([t], 5.0) == [t]
    # Without a history that says this stillness is abnormal, nor an ask of the
    # daemon, nobody is paused (a healthy GPU rank sits still through each step).
    assert StackPolicy(native_after=3.0).native_due([t], 5.0) == []
    t.native_asked = 4.0
    assert StackPolicy(native_after=3.0).native_due([t], 5.0) == [t]
    t.native_asked = None
    # A rank making progress is never paused.
    moving = _still_rank(4.0)
    moving.observe_process(_proc(900, 6.0), 6.0)
    assert not moving.still and policy.native_due([moving], 6.0) == []
    # Nor one whose Python stack already says where it waits.
    barrier = _still_rank(4.0)
    barrier.observe_stack(Classification(S.COLLECTIVE, Op.BARRIER), "b", 4.5)
    assert policy.native_due([barrier], 5.0) == []
    assert barrier.evidence is E.PYTHON_FRAME
    # Nor without a Python stack taken in this still period.
    t2 = _tracker()
    t2.observe_process(_proc(0), 0.0)
    t2.observe_stack(COMPUTE, "s", 0.1)
    t2.observe_process(_proc(0), 5.0)   # still since 0.0 ... stack at 0.1 counts
    t2.stack_at = -1.0
    assert policy.native_due([t2], 5.0) == []
    assert StackPolicy(native_after=0).native_due([t], 5.0) == []


def test_once_per_still_period_and_the_wait_dates_from_it() -> None:
    policy = StackPolicy(native_after=3.0, pause=WARM)
    t = _still_rank(4.0)
    t.observe_native(REDUCER, 5.0, "native-stack")
    assert (t.state, t.op, t.evidence) == (S.COLLECTIVE, Op.ALL_REDUCE, E.NATIVE_FRAME)
    assert t.state_since == t.still_since == 1.0
    assert policy.native_due([t], 9.0) == []          # once per wait
    # The next Python dump shows the same frames: the native wait stands.
    t.observe_stack(COMPUTE, "py-stack", 7.0)
    assert (t.state, t.op, t.evidence) == (S.COLLECTIVE, Op.ALL_REDUCE, E.NATIVE_FRAME)
    s = sample_pb(t, 8.0, (), {}, False)
    assert s.evidence == E.NATIVE_FRAME.to_proto() and s.native_frame == REDUCER.frame
    assert s.native_stack_id == "native-stack"   # the dump's frames, for evidence bundles
    assert s.state_seconds == pytest.approx(7.0)
    # Progress ends it: the next stack decides again, and a new still period may be dumped.
    t.observe_process(_proc(1500, 9.0), 9.0)
    t.observe_stack(COMPUTE, "py-stack", 9.1)
    assert (t.state, t.evidence) == (S.COMPUTE, E.NONE)
    assert sample_pb(t, 9.2, (), {}, False).native_stack_id == ""


def test_a_native_dump_that_finds_no_wait_leaves_the_rank_unexplained() -> None:
    t = _still_rank(4.0)
    t.observe_native(None, 5.0)
    assert t.state is S.COMPUTE and t.evidence is E.NONE and t.native_no_wait
    assert sample_pb(t, 6.0, (), {}, False).native_no_wait
    assert StackPolicy().native_due([t], 9.0) == []


def test_a_native_dumps_own_ptrace_stops_are_not_progress() -> None:
    """Rounds during the dump and the round after it see the stops as events."""
    t = _still_rank(4.0)
    since = t.still_since
    t.pause_begins(500)
    t.observe_process(_proc(530, 5.5), 5.5)          # a round mid-dump: 30 ptrace events
    t.pause_ends(560)                                # 30 more before it detached
    t.observe_process(_proc(561, 6.5), 6.5)          # the next round: 1 real event
    assert t.still_since == since
    # Without the pause bookkeeping the same readings end the still period.
    u = _still_rank(4.0)
    u.observe_process(_proc(530, 5.5), 5.5)
    assert u.still_since is None


def test_native_argv_pauses_and_never_claims_nonblocking() -> None:
    argv = native_argv("/x/py-spy", 7)
    assert "--native" in argv and "--nonblocking" not in argv and argv[-1] == "7"


@pytest.mark.skipif(find_pyspy() is None, reason="py-spy not installed")
def test_real_native_dump_is_timed_into_the_histogram() -> None:
    """A real process, a real --native dump: counted, timed, nothing invented
    (a thread in Event.wait is no collective wait)."""
    child = subprocess.Popen([sys.executable, "-c",
                              "import threading,sys; print('up', flush=True); "
                              "threading.Event().wait(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        spy = PySpy()
        before = progress_events(child.pid)
        threads = asyncio.run(spy.dump_native(child.pid))
        caused = progress_events(child.pid) - before
        # The pause itself shows as the main thread's voluntary switches: the
        # tracker forgives them, so the dump never ends the still period it read.
        assert caused >= 1
        assert threads and any(f.line == 0 for t in threads for f in t.stack.frames)
        assert classify_native_rank(threads, child.pid) is None
        assert spy.native_total == 1 and spy.native_failures_total == 0
        assert 0 < spy.native_seconds_total < 10
        assert spy.native_buckets[-1] == 1 and len(spy.native_buckets) == len(NATIVE_BUCKETS) + 1
        assert child.poll() is None  # the rank carries on after the pause
    finally:
        child.kill()
        child.wait()


def _own(events: int, cpu: float, own: float) -> ProcessSample:
    return dataclasses.replace(_proc(events, cpu), main_cpu_seconds=own)


def test_a_still_rank_whose_own_thread_burns_nothing_is_idle() -> None:
    # The process burns 60% of a core (a helper thread spins, as NCCL's do) while
    # the rank's own thread sleeps under a frame that reads compute.
    t = _tracker()
    t.observe_process(_own(0, 0.0, 0.0), 0.0)
    t.observe_process(_own(500, 1.0, 0.9), 1.0)
    t.observe_stack(COMPUTE, "py-stack", 1.0)
    assert t.shown_state is S.COMPUTE              # stepping: its own CPU is busy
    t.observe_process(_own(500, 1.6, 0.9), 2.0)    # still, process busy, own thread idle
    assert t.still and t.cpu_util > 0.5 and t.shown_state is S.IDLE
    assert t.state is S.COMPUTE                    # the stack's reading is kept (native dumps)
    t.observe_process(_own(500, 2.6, 1.9), 3.0)    # still, computing in its own thread
    assert t.shown_state is S.COMPUTE
    # No reading of its own thread: the stack's state, never a guess.
    t2 = _tracker()
    for i, at in enumerate((0.0, 1.0, 2.0)):
        t2.observe_process(_proc(0 if i == 0 else 500, at), at)
    t2.observe_stack(COMPUTE, "py-stack", 2.0)
    assert t2.still and t2.shown_state is S.COMPUTE


def test_a_starved_rank_that_computes_is_not_idle() -> None:
    # hang-compute in a CI run: the late rank computes in a tight loop, but on the
    # loaded 2-core machine its thread got under 5% of a core between two samples,
    # and the hang was blamed on an idle rank. The scheduler holds it runnable.
    t = _tracker()
    t.observe_process(_own(0, 0.0, 0.0), 0.0)
    t.observe_process(_own(500, 1.0, 0.9), 1.0)
    t.observe_stack(COMPUTE, "py-stack", 1.0)
    starved = dataclasses.replace(_own(500, 1.6, 0.92), main_thread_state="R")
    t.observe_process(starved, 2.0)
    assert t.still and t.own_cpu_util < 0.05 and t.shown_state is S.COMPUTE
    asleep = dataclasses.replace(_own(500, 2.2, 0.92), main_thread_state="S")
    t.observe_process(asleep, 3.0)
    assert t.shown_state is S.IDLE


def test_own_thread_state_is_read_with_its_cpu() -> None:
    from ncclwatch.agent.sample import ProcessSampler
    code = ("import hashlib, sys, time\n"
            "print('ready', flush=True)\n"
            "if sys.argv[1] == 'spin':\n"
            "    end = time.time() + 60\n"
            "    while time.time() < end: pass\n"
            "time.sleep(60)\n")
    for mode, want in (("sleep", {"S"}), ("spin", {"R"})):
        child = subprocess.Popen([sys.executable, "-c", code, mode], stdout=subprocess.PIPE,
                                 text=True)
        try:
            assert child.stdout.readline().strip() == "ready"
            time.sleep(0.3)
            states = {ProcessSampler().sample(child.pid, with_files=False).main_thread_state
                      for _ in range(3)}
            assert states == want, (mode, states)
        finally:
            child.kill()
            child.wait()


def test_own_thread_cpu_is_read_apart_from_the_process() -> None:
    from ncclwatch.agent.sample import ProcessSampler
    code = ("import threading, time, hashlib\n"
            "def spin():\n"
            "    b = b'x' * (1 << 20)\n"
            "    while True: hashlib.sha256(b).digest()\n"
            "threading.Thread(target=spin, daemon=True).start()\n"
            "print('ready', flush=True); time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        sampler = ProcessSampler()
        a = sampler.sample(child.pid, with_files=False)
        deadline = time.monotonic() + 60
        while True:   # until the spinner has had its share of a loaded machine's CPU
            time.sleep(0.5)
            b = sampler.sample(child.pid, with_files=False)
            assert a is not None and b is not None and b.main_cpu_seconds is not None
            process = b.cpu_seconds - a.cpu_seconds
            if process >= 0.5 or time.monotonic() > deadline:
                break
        own = b.main_cpu_seconds - a.main_cpu_seconds
        assert own < 0.05 and process > own + 0.1, (process, own)
    finally:
        child.kill()
        child.wait()


# -- the daemon ------------------------------------------------------------------------

def _s(rank, state, op=Op.NONE, secs=0.0, still=None, ev=E.NONE, frame="", no_wait=False,
       stack=""):
    s = sample("job-1", rank, 3, state, op, seconds=secs, stack=stack)
    s.process.cpu_utilization = 0.6
    if still is not None:
        s.still_seconds = still
    s.evidence, s.native_frame, s.native_no_wait = ev.to_proto(), frame, no_wait
    return s


NOW = 1010.0


def _feed(d: Daemon, samples, now: float, seq: int) -> None:
    d.ingest(report(samples, seq=seq, stacks=[stack_pb(SAVE)]), now=now)
    d.tick(now=now)


def _save(secs: float):
    return _s(0, S.SAVING, secs=secs, still=0.0, stack=stack_id(SAVE))


def test_native_frame_waiters_make_the_checkpoint_gather() -> None:
    d = Daemon(DaemonConfig())
    _feed(d, [_save(20), *(_s(r, S.COLLECTIVE, Op.ALL_REDUCE, 8, still=8, ev=E.NATIVE_FRAME,
                              frame="c10d::Reducer::finalize_backward") for r in (1, 2))],
          1000.0, 1)
    inc = d.incidents.active[("job-1", StallKind.CHECKPOINT_GATHER)]
    assert [c.rank for c in inc.finding.culprits] == [0]
    assert not inc.finding.provisional
    view = incident_view(d, inc, 1000.0)
    assert view["waiting"]["evidence"] == {"native_frame": [1, 2]}
    ranks = {r["rank"]: r for r in jobs_view(d, ranks=True, now=NOW)["jobs"][0]["ranks"]}
    assert ranks[1]["evidence"] == "native_frame"
    assert ranks[1]["native_frame"] == "c10d::Reducer::finalize_backward"
    assert "by native_frame: 1-2" in render(jobs_view(d, now=NOW))


def test_stillness_alone_is_provisional_then_confirmed() -> None:
    d = Daemon(DaemonConfig())
    # Ranks 1-2 read compute from Python frames, but have sat still 7 s while rank 0 saves.
    _feed(d, [_save(8), *(_s(r, S.COMPUTE, secs=30, still=7) for r in (1, 2))], 1000.0, 1)
    d.tick(now=1006.0)   # a culprit's stack after the wait began (the daemon confirms)
    _feed(d, [_save(14), *(_s(r, S.COMPUTE, secs=36, still=13) for r in (1, 2))], 1006.0, 2)
    inc = d.incidents.active[("job-1", StallKind.CHECKPOINT_GATHER)]
    assert inc.finding.provisional and [c.rank for c in inc.finding.culprits] == [0]
    view = incident_view(d, inc, 1006.0)
    assert view["waiting"] == {**view["waiting"], "evidence": {"stillness": [1, 2]},
                               "provisional": True, "ranks": [1, 2]}
    assert "PROVISIONAL" in render(jobs_view(d, now=NOW))
    # A native dump confirms: the same incident, no longer provisional.
    _feed(d, [_save(15), *(_s(r, S.COLLECTIVE, Op.WAIT, 14, still=14, ev=E.NATIVE_FRAME,
                              frame="c10d::Work::wait") for r in (1, 2))], 1007.0, 3)
    same = d.incidents.active[("job-1", StallKind.CHECKPOINT_GATHER)]
    assert same.id == inc.id and not same.finding.provisional


def test_stillness_withdrawn_when_a_native_dump_finds_no_wait() -> None:
    d = Daemon(DaemonConfig())
    _feed(d, [_save(20), _s(1, S.COMPUTE, secs=30, still=10),
              _s(2, S.COMPUTE, secs=30, still=10, no_wait=True)], 1000.0, 1)
    d.tick(now=1010.0)
    assert not d.incidents.active
    ranks = {r["rank"]: r for r in jobs_view(d, ranks=True, now=NOW)["jobs"][0]["ranks"]}
    assert ranks[2]["still_reason"] == "unknown" and ranks[2]["evidence"] is None


@pytest.mark.parametrize("name, samples", [
    # Long evaluation on one rank while the others sit still: no checkpoint work, silent.
    ("long eval", [_s(0, S.COMPUTE, secs=30, still=0.0),
                   *(_s(r, S.COMPUTE, secs=30, still=20) for r in (1, 2))]),
    # Spinning threads but progress on every rank: training.
    ("spinning, stepping", [_save(20), *(_s(r, S.COMPUTE, secs=30, still=0.0) for r in (1, 2))]),
    # Slow data loading on the still ranks: not all still-and-unexplained... still no save.
    ("slow data", [_s(r, S.DATALOADER, secs=30, still=20) for r in range(3)]),
    # A short save: the saver not yet past the threshold.
    ("short save", [_save(3), *(_s(r, S.COMPUTE, secs=30, still=3) for r in (1, 2))]),
    # One peer moves: the shape breaks.
    ("one peer moves", [_save(20), _s(1, S.COMPUTE, secs=30, still=10),
                        _s(2, S.COMPUTE, secs=30, still=0.0)]),
])
def test_healthy_shapes_stay_silent(name, samples) -> None:
    d = Daemon(DaemonConfig())
    _feed(d, samples, 1000.0, 1)
    d.tick(now=1010.0)
    assert not d.incidents.active, name


def _fr(s, enqueued: int, completed: int, pending: str = "") -> None:
    s.flight_recorder.CopyFrom(pb.FlightRecorderSummary(dump_age_seconds=0.5, version="2.10",
                                                        groups=[pb.ProcessGroupProgress(
        pg_id="0", pg_name="0", pg_desc="default_pg", ranks=[0, 1, 2],
        last_enqueued=enqueued, last_started=enqueued, last_completed=completed,
        pending_op=pending, pending_seq=enqueued if pending else 0,
        pending_timeout_ms=90_000)]))


def test_the_live_flight_recorder_confirms_by_sequence_numbers() -> None:
    d = Daemon(DaemonConfig())
    _feed(d, [_save(8), *(_s(r, S.COMPUTE, secs=30, still=7) for r in (1, 2))], 1000.0, 1)
    d.tick(now=1006.0)
    saver = _save(14)
    _fr(saver, 11, 11)  # rank 0 never enqueued all_reduce #12
    peers = [_s(r, S.COMPUTE, secs=36, still=13) for r in (1, 2)]
    for p in peers:
        _fr(p, 12, 11, "all_reduce")
    _feed(d, [saver, *peers], 1006.0, 2)
    inc = d.incidents.active[("job-1", StallKind.CHECKPOINT_GATHER)]
    f = inc.finding
    assert not f.provisional and f.waiting == (1, 2)
    assert dict(f.evidence) == {1: E.FLIGHT_RECORDER, 2: E.FLIGHT_RECORDER}
    assert f.waiting_ops == (Op.ALL_REDUCE,)
    assert "all_reduce #12 of default_pg" in f.summary
    assert incident_view(d, inc, 1006.0)["waiting"]["evidence"] == {"flight_recorder": [1, 2]}


def test_a_flight_recorder_that_blames_nobody_working_confirms_nothing() -> None:
    d = Daemon(DaemonConfig())
    _feed(d, [_save(8), *(_s(r, S.COMPUTE, secs=30, still=7) for r in (1, 2))], 1000.0, 1)
    d.tick(now=1006.0)
    saver = _save(14)
    _fr(saver, 12, 11, "all_reduce")  # rank 0 enqueued it too: it does not block the others
    peers = [_s(r, S.COMPUTE, secs=36, still=13) for r in (1, 2)]
    for p in peers:
        _fr(p, 12, 11, "all_reduce")
    _feed(d, [saver, *peers], 1006.0, 2)
    f = d.incidents.active[("job-1", StallKind.CHECKPOINT_GATHER)].finding
    assert f.provisional and dict(f.evidence) == {1: E.STILLNESS, 2: E.STILLNESS}


def test_native_dump_pause_is_exported_as_a_histogram() -> None:
    from ncclwatch.daemon.export import DaemonCollector

    d = Daemon(DaemonConfig())
    req = report([_save(3)], seq=1, stacks=[stack_pb(SAVE)])
    req.report.health.CopyFrom(pb.AgentHealth(
        native_dumps_total=3, native_dump_failures_total=1, native_dump_seconds_total=1.9,
        native_dump_bucket_counts=[0, 0, 0, 1, 2, 3, 3, 3]))
    d.ingest(req, now=1000.0)
    text = DaemonCollector(d).exposition().decode()
    assert 'ncclwatch_agent_native_dump_seconds_bucket{node="node-a",le="0.5"} 1.0' in text
    assert 'ncclwatch_agent_native_dump_seconds_bucket{node="node-a",le="+Inf"} 3.0' in text
    assert 'ncclwatch_agent_native_dump_seconds_count{node="node-a"} 3.0' in text
    assert 'ncclwatch_agent_native_dump_seconds_sum{node="node-a"} 1.9' in text
    assert 'ncclwatch_agent_native_dump_failures_total{node="node-a"} 1.0' in text


# -- the job's shape outside checkpoint work (collective_hang) ----------------------------

def _stepped(d: Daemon, before: float = 930.0) -> None:
    """25 rounds of every rank making progress (a job that has stepped), from
    ``before``: its stillness since means something (shape.stepped)."""
    for i in range(25):
        _feed(d, [_s(r, S.COMPUTE, secs=1, still=0.0) for r in range(3)], before + i, 100 + i)


def _hang(d: Daemon, samples, now: float = 1000.0, stepped: bool = True) -> list:
    if stepped:
        _stepped(d)
    _feed(d, samples, now, 1000)
    d.tick(now=now + 1)
    return [inc for (job, kind), inc in d.incidents.active.items()
            if kind is StallKind.COLLECTIVE_HANG]


def test_one_rank_at_work_while_the_rest_sit_still_is_a_provisional_hang() -> None:
    # Rank 1 makes progress (a slow data pipeline, say); ranks 0 and 2 read compute
    # from Python frames and have sat still 40 s: NCCL-shaped waiters, no frame says so.
    d = Daemon(DaemonConfig())
    [inc] = _hang(d, [_s(1, S.DATALOADER, secs=45, still=0.0),
                      *(_s(r, S.COMPUTE, secs=45, still=40) for r in (0, 2))])
    f = inc.finding
    assert f.provisional and [c.rank for c in f.culprits] == [1] and f.waiting == (0, 2)
    assert dict(f.evidence) == {0: E.STILLNESS, 2: E.STILLNESS}
    assert "provisional" in f.summary and "rank(s) 1 never joined (dataloader)" in f.summary


def test_a_rank_never_seen_stepping_is_no_evidence() -> None:
    # The same picture from ranks the daemon never saw make progress (fed by
    # shared memory: still since they started): silent.
    d = Daemon(DaemonConfig())
    assert not _hang(d, [_s(1, S.DATALOADER, secs=45, still=0.0),
                         *(_s(r, S.COMPUTE, secs=45, still=40) for r in (0, 2))],
                     stepped=False)


def test_the_shape_waits_for_the_hang_ceiling() -> None:
    # Still 20 s: a long evaluation's wait, below the 30 s ceiling. Silent.
    d = Daemon(DaemonConfig())
    assert not _hang(d, [_s(1, S.COMPUTE, secs=25, still=0.0),
                         *(_s(r, S.COMPUTE, secs=25, still=20) for r in (0, 2))])


def test_every_rank_still_and_the_flight_recorder_names_the_missing_one() -> None:
    # Rank 1 sits still too (a long sleep, a pure-compute loop): stillness cannot say
    # who is late; the Flight Recorder can, by sequence numbers.
    d = Daemon(DaemonConfig())
    late = _s(1, S.COMPUTE, secs=45, still=40)
    _fr(late, 11, 11)
    peers = [_s(r, S.COMPUTE, secs=45, still=40) for r in (0, 2)]
    for p in peers:
        _fr(p, 12, 11, "all_reduce")
    [inc] = _hang(d, [late, *peers])
    f = inc.finding
    assert not f.provisional and [c.rank for c in f.culprits] == [1] and f.waiting == (0, 2)
    assert dict(f.evidence) == {0: E.FLIGHT_RECORDER, 2: E.FLIGHT_RECORDER}
    assert f.waiting_ops == (Op.ALL_REDUCE,) and "all_reduce #12 of default_pg" in f.summary
    # Without the Flight Recorder the same stillness blames nobody.
    d2 = Daemon(DaemonConfig())
    assert not _hang(d2, [_s(r, S.COMPUTE, secs=45, still=40) for r in range(3)])


def test_the_flight_recorder_turns_a_compute_reading_into_a_waiter() -> None:
    # Rank 0 waits in a barrier (a Python frame); rank 2 reads compute but its
    # Flight Recorder has all_reduce #12 pending that rank 1 never enqueued.
    d = Daemon(DaemonConfig())
    late = _s(1, S.COMPUTE, secs=45, still=0.0)
    _fr(late, 11, 11)
    w0 = _s(0, S.COLLECTIVE, Op.BARRIER, secs=45, still=40)
    w2 = _s(2, S.COMPUTE, secs=45, still=40)
    for p in (w0, w2):
        _fr(p, 12, 11, "all_reduce")
    _feed(d, [late, w0, w2], 1000.0, 1)
    d.tick(now=1001.0)
    _feed(d, [late, w0, w2], 1001.0, 2)  # a stack taken during the stillness
    hangs = [i for (_, k), i in d.incidents.active.items() if k is StallKind.COLLECTIVE_HANG]
    [f] = [i.finding for i in hangs]
    assert [c.rank for c in f.culprits] == [1] and f.waiting == (0, 2)
    assert dict(f.evidence)[2] is E.FLIGHT_RECORDER
    assert "Flight Recorder: all_reduce #12 of default_pg" in f.summary


@pytest.mark.parametrize("name, samples", [
    # Everyone still, no Flight Recorder: nobody to blame.
    ("all still", [_s(r, S.DATALOADER, secs=45, still=40) for r in range(3)]),
    # One rank at work, but a peer only briefly still: no shape yet.
    ("a peer just paused", [_s(1, S.COMPUTE, secs=45, still=0.0),
                            _s(0, S.COMPUTE, secs=45, still=40),
                            _s(2, S.COMPUTE, secs=45, still=4)]),
    # A peer's native dump found no wait: still, reason unknown.
    ("no wait found", [_s(1, S.COMPUTE, secs=45, still=0.0),
                       _s(0, S.COMPUTE, secs=45, still=40),
                       _s(2, S.COMPUTE, secs=45, still=40, no_wait=True)]),
    # Every rank at work.
    ("training", [_s(r, S.COMPUTE, secs=45, still=0.0) for r in range(3)]),
])
def test_healthy_hang_shapes_stay_silent(name, samples) -> None:
    assert not _hang(Daemon(DaemonConfig()), samples), name


# -- a hang's culprits: a peer still and idle may be a waiter not yet looked at ----------

def _idle_peers(d: Daemon, now: float, seq: int, rank0: dict, rank1: dict, waited: float) -> None:
    """Rank 2 waits in work.wait() (native frame) for ``waited`` s; ranks 0 and 1
    sit still, idle (no CPU of their own, a stack that says nothing). The job
    stepped with 1 s waits before: its hang threshold is learned (5 s)."""
    r0 = (_s(0, S.COLLECTIVE, Op.WAIT, waited, still=waited + 1, **rank0)
          if rank0.get("ev") is E.NATIVE_FRAME else
          _s(0, S.IDLE, secs=waited + 20, still=waited + 1, **rank0))
    d.ingest(report([r0,
                     _s(1, S.IDLE, secs=waited + 20, still=waited + 1, **rank1),
                     _s(2, S.COLLECTIVE, Op.WAIT, waited, still=waited, ev=E.NATIVE_FRAME,
                        frame="c10d::Work::wait")], seq=seq), now=now)
    waits = d.table.jobs["job-1"].waits
    waits.first_at, waits.rounds = now - 600.0, 600
    for _ in range(20):
        waits.ended(Op.WAIT, 1.0, now)
    assert waits.threshold(Op.WAIT, d.detect_cfg.waits, now) == 5.0
    d.tick(now=now)


def _hang_culprits(d: Daemon) -> list[int] | None:
    inc = d.incidents.active.get(("job-1", StallKind.COLLECTIVE_HANG))
    return None if inc is None else [c.rank for c in inc.finding.culprits]


def test_a_still_idle_rank_not_yet_looked_at_natively_is_not_named_beside_a_decided_one() -> None:
    # nccl-shaped-hang in CI: rank 2's native dump named its wait a round before
    # rank 0's did; rank 0 (a waiter) was named beside rank 1 (asleep).
    d = Daemon(DaemonConfig())
    _idle_peers(d, 1000.0, 1, {}, {"no_wait": True}, waited=12.0)
    assert _hang_culprits(d) == [1]


def test_when_no_absent_rank_is_decided_the_hang_waits_for_a_native_verdict() -> None:
    d = Daemon(DaemonConfig())
    _idle_peers(d, 1000.0, 1, {}, {}, waited=12.0)
    assert _hang_culprits(d) is None  # either may be a waiter: not yet
    _idle_peers(d, 1002.0, 2, {"ev": E.NATIVE_FRAME, "frame": "c10d::Work::wait"},
          {"no_wait": True}, waited=14.0)
    # rank 0's own dump names its wait: it is a waiter, not a culprit
    assert _hang_culprits(d) == [1]


def test_past_the_hang_ceiling_undecided_ranks_are_named() -> None:
    # Native dumps off (or the pause budget spent): the verdict never comes.
    d = Daemon(DaemonConfig())
    _idle_peers(d, 1000.0, 1, {}, {}, waited=12.0)
    assert _hang_culprits(d) is None
    _idle_peers(d, 1020.0, 2, {}, {}, waited=32.0)
    assert _hang_culprits(d) == [0, 1]
