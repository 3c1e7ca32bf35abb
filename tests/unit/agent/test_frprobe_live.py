"""The live Flight Recorder path: agent probe -> summary -> daemon analysis and budget.

The dumps are real (tests/data/flightrec/real, gloo jobs run here); the pipe
is a real FIFO with a reader thread doing what torch's reader does. The full
path with a real torch job, agent and daemon is in
tests/e2e/test_checkpoint_stall.py.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from ncclwatch.agent.discover import RankProcess
from ncclwatch.agent.frprobe import FlightRecorderProbe, summary_pb
from ncclwatch.daemon import progress
from ncclwatch.daemon.budget import BudgetConfig, timeout_for
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.flightrec import load_dump
from ncclwatch.jobid import RankIdentity
from ncclwatch.model import CollectiveOp as Op
from ncclwatch.model import RankState as S
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.paths import DATA
from tests.harness.reports import report, sample

HANG = DATA / "flightrec" / "real" / "hang"


def _hang_summary(rank: int) -> pb.FlightRecorderSummary:
    path = HANG / f"comm_lib_trace_rank_{rank}"
    return summary_pb(load_dump(path), written_at=time.time() - 2.0, now_wall=time.time())


def _hang_job(with_fr: bool, seq: int = 1, pipe: bool = True) -> pb.ReportRequest:
    """The real 'hang' job: ranks 0, 1 in all_reduce #4, rank 2 elsewhere (saving)."""
    samples = [sample("job-1", 0, 3, S.COLLECTIVE, Op.ALL_REDUCE, seconds=30),
               sample("job-1", 1, 3, S.COLLECTIVE, Op.ALL_REDUCE, seconds=30),
               sample("job-1", 2, 3, S.SAVING, seconds=30)]
    for s in samples:
        s.job.CopyFrom(pb.JobInfo(source="test", env={
            "TORCH_FR_BUFFER_SIZE": "2000",
            **({"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/tmp/p_"} if pipe else {})}))
        if with_fr:
            s.flight_recorder.CopyFrom(_hang_summary(s.identity.rank))
    return report(samples, seq=seq)


def test_summary_of_a_real_dump_is_compact_and_exact():
    s = _hang_summary(0)
    assert s.version == "2.10" and 1.5 < s.dump_age_seconds < 5
    (g,) = s.groups
    assert (g.pg_desc, g.last_enqueued, g.last_completed) == ("default_pg", 4, 3)
    assert (g.pending_op, g.pending_seq, g.pending_timeout_ms) == ("all_reduce", 4, 5000)
    assert g.pending_seconds > 0
    assert len(s.SerializeToString()) < 200


def test_daemon_names_the_missing_rank_and_takes_the_budget_from_the_dump():
    d = Daemon(DaemonConfig())
    d.ingest(_hang_job(with_fr=False), now=10.0)
    job = d.table.jobs["job-1"]
    assert timeout_for(job, BudgetConfig()) == (600.0, "default")
    d.ingest(_hang_job(with_fr=True, seq=2), now=11.0)
    assert timeout_for(job, BudgetConfig()) == (5.0, "flight_recorder")
    v = progress.view(job, since=0.0, now=11.0)
    assert v is not None and v["dumps"] == 3
    assert (v["missing_ranks"], v["waiting_ranks"], v["timeout_ms"]) == ([2], [0, 1], 5000)
    assert v["sentence"].startswith("Flight Recorder: rank(s) 2 never started all_reduce #4")
    # Dumps from before the incident began are not its evidence.
    assert progress.view(job, since=1e9, now=11.0) is None


def test_a_stalled_job_with_a_pipe_is_asked_for_dumps_rate_limited():
    d = Daemon(DaemonConfig(stall_threshold=5))
    kinds = []
    for i, now in enumerate((10.0, 11.0, 12.0, 13.0, 20.0)):
        resp = d.ingest(_hang_job(with_fr=False, seq=i + 1), now=now)
        d.tick(now=now)
        kinds += [c.WhichOneof("command") for c in resp.commands]
    assert kinds.count("dump_flight_recorder") == 1, kinds
    assert "dump_stacks" in kinds


def test_a_job_without_a_pipe_is_not_asked():
    d = Daemon(DaemonConfig(stall_threshold=5))
    kinds = []
    for i, now in enumerate((10.0, 11.0, 12.0)):
        resp = d.ingest(_hang_job(with_fr=False, seq=i + 1, pipe=False), now=now)
        d.tick(now=now)
        kinds += [c.WhichOneof("command") for c in resp.commands]
    assert "dump_flight_recorder" not in kinds and "dump_stacks" in kinds


@pytest.mark.parametrize("mutate, words", [
    (lambda g: g.ranks.append(7), "outside the world"),
    (lambda g: setattr(g, "last_completed", -5), "sequence ids"),
    (lambda g: setattr(g, "pending_seconds", float("nan")), "finite"),
    (lambda g: setattr(g, "pending_timeout_ms", 1 << 62), "over a year"),
    (lambda g: setattr(g, "pg_name", "x" * 300), "256"),
])
def test_a_bad_summary_is_left_out_alone(mutate, words):
    """A Flight Recorder summary that breaks a check of its own is dropped and
    named in the answer; the rest of the report (the rank's sample, its peers)
    is applied: one rank's dump never blinds the node."""
    d = Daemon(DaemonConfig())
    req = _hang_job(with_fr=True)
    mutate(req.report.samples[1].flight_recorder.groups[0])
    resp = d.ingest(req, now=1.0)
    [part] = [p for p in resp.dropped_parts if p.job_id == "job-1" and p.rank == 1]
    assert words in part.reason, part.reason
    job = d.table.jobs["job-1"]
    assert 1 in job.ranks and 1 not in job.flight_recorder
    assert set(job.ranks) == {r for r in range(len(req.report.samples))}


def _proc(tmp: Path, rank: int = 0) -> RankProcess:
    return RankProcess(os.getpid(), 0.0, RankIdentity("job-1", "test", rank, rank, 3),
                       {"TORCH_FR_BUFFER_SIZE": "2000",
                        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp / "pipe_"),
                        "TORCH_FR_DUMP_TEMP_FILE": str(tmp / "fr_")})


def _reader(tmp: Path, rank: int, stop: threading.Event, opened: threading.Event) -> None:
    """torch's side: hold the FIFO open, on a byte rewrite the dump file. ``opened``
    is set once it is open for reading: a writer that comes before finds no reader."""
    fifo = tmp / f"pipe_{rank}.pipe"
    os.mkfifo(fifo, 0o666)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    opened.set()
    try:
        while not stop.is_set():
            time.sleep(0.05)
            try:
                if os.read(fd, 128):
                    shutil.copyfile(HANG / f"comm_lib_trace_rank_{rank}", tmp / f"fr_{rank}")
            except BlockingIOError:
                pass
    finally:
        os.close(fd)


def test_probe_triggers_a_real_fifo_and_reads_the_rewritten_dump(tmp_path):
    stop, opened = threading.Event(), threading.Event()
    t = threading.Thread(target=_reader, args=(tmp_path, 2, stop, opened), daemon=True)
    t.start()
    try:
        assert opened.wait(5), "the reader never opened its FIFO"
        deadline = time.monotonic() + 5
        (tmp_path / "fr_2").write_bytes(b"an old dump")  # must wait for a rewrite
        probe = FlightRecorderProbe(wait=5.0)
        assert probe.request([_proc(tmp_path, 2)]) == 1
        got = {}
        while not got and time.monotonic() < deadline:
            got = probe.poll()
            time.sleep(0.05)
        summary = got[os.getpid()]
        (g,) = summary.groups
        assert (g.last_enqueued, g.last_completed, g.pending_op) == (3, 3, "")
        assert (probe.requests_total, probe.dumps_total, probe.failures_total) == (1, 1, 0)
        # Asked again within MIN_INTERVAL: not asked (the daemon's rate is not trusted).
        assert probe.request([_proc(tmp_path, 2)]) == 0
    finally:
        stop.set()
        t.join(2)


def test_probe_finds_a_pipe_whose_path_redaction_would_hide(tmp_path):
    """A random-looking directory in the pipe path is redacted in what is reported,
    but the agent keeps the raw path for itself and the dump still arrives."""
    secretish = tmp_path / "Xk3jQ9vLm2Np8Rt5Wz7Yb4Hc6Df1Gs0A"
    secretish.mkdir()
    raw = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{secretish}/pipe_",
           "TORCH_FR_DUMP_TEMP_FILE": f"{secretish}/fr_"}
    proc = RankProcess.of(os.getpid(), 0.0, RankIdentity("job-1", "test", 1, 1, 3), raw)
    assert "Xk3jQ9vLm2Np8Rt5" not in proc.env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"]   # reported
    stop, opened = threading.Event(), threading.Event()
    t = threading.Thread(target=_reader, args=(secretish, 1, stop, opened), daemon=True)
    t.start()
    try:
        assert opened.wait(5), "the reader never opened its FIFO"
        deadline = time.monotonic() + 5
        probe = FlightRecorderProbe(wait=5.0)
        assert probe.request([proc]) == 1
        got = {}
        while not got and time.monotonic() < deadline:
            got = probe.poll()
            time.sleep(0.05)
        g = got[os.getpid()].groups[0]       # rank 1 of the recorded hang
        assert (g.last_enqueued, g.last_completed, g.pending_op) == (4, 3, "all_reduce")
    finally:
        stop.set()
        t.join(2)


def test_probe_with_no_reader_gives_up_at_once_and_never_blocks(tmp_path):
    os.mkfifo(tmp_path / "pipe_0.pipe")  # a FIFO nobody holds open (the rank died)
    probe = FlightRecorderProbe()
    t0 = time.monotonic()
    assert probe.request([_proc(tmp_path, 0)]) == 0
    assert time.monotonic() - t0 < 0.5
    assert probe.failures_total == 1 and not probe.waiting
    no_pipe = RankProcess(os.getpid(), 0.0, RankIdentity("job-1", "test", 1, 1, 3), {})
    assert FlightRecorderProbe().request([no_pipe]) == 0


def test_probe_times_out_when_no_dump_appears(tmp_path):
    stop = threading.Event()
    fifo = tmp_path / "pipe_0.pipe"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader that never dumps
    try:
        probe = FlightRecorderProbe(wait=0.3)
        assert probe.request([_proc(tmp_path, 0)], now=100.0) == 1
        assert probe.poll(now=100.1) == {} and probe.waiting
        assert probe.poll(now=100.5) == {} and not probe.waiting
        assert probe.failures_total == 1
    finally:
        stop.set()
        os.close(fd)


def test_probe_of_an_exited_rank_never_writes_this_hosts_pipe(tmp_path):
    """The pipe path is reached through the rank's /proc entry: once the rank is gone,
    a FIFO of the same name in the agent's own view is not written."""
    import subprocess
    import sys
    fifo = tmp_path / "pipe_0.pipe"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # someone else's live reader
    try:
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)
        proc = _proc(tmp_path, 0)
        proc = RankProcess(int(gone.stdout), 0.0, proc.identity, proc.env)
        assert FlightRecorderProbe().request([proc]) == 0
        assert os.read(fd, 128) == b""  # nothing was written (no writer: end of file)
    finally:
        os.close(fd)


def test_ranks_still_with_fresh_stacks_and_no_frame_are_asked_for_dumps():
    """NCCL-shaped: every rank reads compute (no frame shows a wait) and has sat
    still past the stall threshold, its stack already fresh: the Flight Recorder
    is what can name the rank the others wait for, so it is asked for."""
    def still_job(seq: int, still: float, pipe: bool = True) -> pb.ReportRequest:
        samples = [sample("job-1", r, 3, S.COMPUTE, seconds=still + 1.0) for r in range(3)]
        for s in samples:
            s.still_seconds = still
            s.stack_age_seconds = 0.5            # taken during the stillness
            s.job.CopyFrom(pb.JobInfo(source="test", env=(
                {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/tmp/p_"} if pipe else {})))
        return report(samples, seq=seq)

    for pipe in (True, False):
        d = Daemon(DaemonConfig(stall_threshold=5))
        kinds = []
        for i, (now, still) in enumerate(((10.0, 1.0), (12.0, 3.0), (14.0, 5.0), (16.0, 7.0))):
            resp = d.ingest(still_job(i + 1, still, pipe), now=now)
            d.tick(now=now)
            kinds.append([c.WhichOneof("command") for c in resp.commands])
        asked = [i for i, k in enumerate(kinds) if "dump_flight_recorder" in k]
        # Asked once the stillness passed the threshold (the reply to the next report).
        assert asked == ([3] if pipe else []), kinds


# -- a still rank stays still while it writes the dump it was asked for --------------

#: A rank waiting in a collective with torch's debug-info pipe: its main thread
#: blocks; torch's own thread reads the pipe and writes the dump (a real one).
_DUMPING_RANK = """
import os, sys, threading
stem, prefix, trace = sys.argv[1], sys.argv[2], open(sys.argv[3], "rb").read()
os.mkfifo(stem + "0.pipe", 0o666)
fd = os.open(stem + "0.pipe", os.O_RDWR)   # held open as torch does; a read waits for a byte
def serve():
    while True:
        os.read(fd, 128)
        with open(prefix + "0", "wb") as f:
            f.write(trace)
threading.Thread(target=serve, daemon=True).start()
print("up", flush=True)
threading.Event().wait()
"""


class _Found:
    """Discovery of one known process (the rank's identity is not what is tested)."""

    def __init__(self, proc: RankProcess) -> None:
        self.proc = proc

    def scan(self, budget: float | None = None) -> list[RankProcess]:
        return [self.proc]


def test_a_still_rank_stays_still_while_it_writes_the_dump_asked_of_it(tmp_path) -> None:
    """The dump's read and write are torch's thread's, asked for by ncclwatch:
    counted as progress they ended the rank's still period, so the hang
    ceiling began again and the dump was older than the stillness it was
    asked in (a hang found 69 s late in CI, issue 27)."""
    import asyncio
    import subprocess
    import sys

    from ncclwatch.agent.agent import Agent, AgentConfig
    from tests.harness.procs import free_port
    stem, prefix = str(tmp_path / "pipe_"), str(tmp_path / "fr_")
    p = subprocess.Popen([sys.executable, "-c", _DUMPING_RANK, stem, prefix,
                          str(HANG / "comm_lib_trace_rank_0")],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "up\n"
        env = {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": stem, "TORCH_FR_DUMP_TEMP_FILE": prefix,
               "TORCH_FR_BUFFER_SIZE": "2000"}
        rank = RankProcess.of(p.pid, 0.0, RankIdentity("job-1", "test", 0, 0, 2), env)
        agent = Agent(AgentConfig(collector=f"127.0.0.1:{free_port()}"), discovery=_Found(rank))

        async def rounds() -> tuple[float, list[float | None]]:
            t = None
            for _ in range(20):          # rounds 0.5 s apart: one call in one is progress
                await agent.round()
                t = agent.trackers[p.pid]
                if t.still_since is not None:
                    break
                await asyncio.sleep(0.5)
            assert t is not None and t.still_since is not None, "the rank never sat still"
            before = t.still_since
            agent._on_command(pb.Command(dump_flight_recorder=pb.DumpFlightRecorderCommand(
                job_id="job-1", reason="test")))
            assert agent.frprobe.pending(p.pid)
            after = []
            for _ in range(40):
                await asyncio.sleep(0.5)
                report = await agent.round()
                after.append(t.still_since)
                if agent.frprobe.dumps_total and len(after) >= 4:
                    break
            assert report is not None
            return before, after

        before, after = asyncio.run(rounds())
        agent.stop()
        assert agent.frprobe.dumps_total == 1, "the rank never wrote its dump"
        assert os.path.getsize(prefix + "0") > 0
        assert set(after) == {before}, (before, after)
    finally:
        p.kill()
        p.wait()
