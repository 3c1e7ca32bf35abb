"""A member's number learned from what the job holds: Ray Train's log of the
worker, the Flight Recorder pipe's name, a set-up frame's locals in a real
nonblocking py-spy dump; sources that disagree number nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ncclwatch.agent import frpipe, ranklocals, raytrainlog
from ncclwatch.agent.discover import RankProcess
from ncclwatch.agent.pyspy import find_pyspy
from ncclwatch.agent.ranklearn import LOCALS_DUMPS, Learned, RankLearner, numbered
from ncclwatch.jobid import UNKNOWN_RANK, UNKNOWN_SOURCE, RankIdentity
from tests.harness import paths

DATA = paths.DATA / "raytrain"
#: A real Ray Train (2.60, V2) system log of the worker pid 5289, world rank 1 of 3.
SYS_LOG = (DATA / "ray-train-sys-worker.log").read_text()


def _member(pid: int, create: float = 1.0, job: str = "ray:gcs/01000000",
            source: str = "ray") -> RankProcess:
    ident = RankIdentity(job_id=job, job_source=source, rank=UNKNOWN_RANK, local_rank=-1,
                         world_size=0, rank_source=UNKNOWN_SOURCE)
    return RankProcess(pid, create, ident, {})


def test_ray_train_log_names_its_own_writer_only() -> None:
    assert raytrainlog.parse(SYS_LOG, frozenset({5289})) == (1, 3)
    # Another process's lines say nothing of this one (a shared file, a reused pid).
    assert raytrainlog.parse(SYS_LOG, frozenset({5290})) is None
    # Two numbers for one process: neither.
    other = SYS_LOG.splitlines()[0].replace('"world_rank": 1', '"world_rank": 2')
    assert raytrainlog.parse(SYS_LOG + other + "\n", frozenset({5289})) is None
    # Hostile shapes: not JSON, not a number, a bool, a huge number, a cut line.
    for bad in ('{"process": 5289, "world_rank": "1"}', '{"process": 5289, "world_rank": true}',
                '{"process": 5289, "world_rank": 99999999999}', '{"process": 5289, "world_ra',
                '[1, 2]', '{"process": 5289, "world_rank": -1}'):
        assert raytrainlog.parse(bad, frozenset({5289})) is None, bad


_HOLDER = """
import os, sys, time
path = sys.argv[1]
f = open(path, "a")
f.write(sys.argv[2].replace("PID", str(os.getpid())) + "\\n")
f.flush()
print("ready", flush=True)
time.sleep(60)
"""


def _hold(tmp_path: Path, name: str, text: str) -> subprocess.Popen:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path), text],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_ray_train_log_is_read_through_the_workers_own_descriptor(tmp_path) -> None:
    line = json.dumps({"message": "Setting up process group for: env:// [rank=2, world_size=4]",
                       "process": 0, "world_rank": 2}).replace('"process": 0', '"process": PID')
    p = _hold(tmp_path, "logs/train/ray-train-sys-worker-" + "ab" * 28 + ".log", line)
    try:
        assert raytrainlog.world_rank(p.pid) == (2, 4)
        # A log of that name the worker does not hold open is not read.
        assert raytrainlog.world_rank(os.getpid()) is None
    finally:
        p.kill()
        p.wait()


def test_the_flight_recorder_pipe_names_the_rank(tmp_path) -> None:
    stem = str(tmp_path / "nccl_pipe_")
    os.mkfifo(stem + "3.pipe")
    holder = subprocess.Popen([sys.executable, "-c",
                               "import os,sys,time; os.open(sys.argv[1], os.O_RDONLY | "
                               "os.O_NONBLOCK); print('ready', flush=True); time.sleep(60)",
                               stem + "3.pipe"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        assert frpipe.pipe_rank(holder.pid, stem) == 3
        assert frpipe.pipe_rank(holder.pid, str(tmp_path / "other_")) is None
        assert frpipe.pipe_rank(holder.pid, "") is None
    finally:
        holder.kill()
        holder.wait()


def _frame(name: str, path: str, **values) -> dict:
    return {"name": name, "filename": path, "line": 1,
            "locals": [{"name": k, "repr": v, "arg": True} for k, v in values.items()]}


def test_locals_table_takes_set_up_frames_only() -> None:
    threads = [{"frames": [
        _frame("train", "/job/train.py", rank="7"),          # the script's own: never taken
        _frame("init_process_group", "/v/torch/distributed/distributed_c10d.py",
               rank="-1", world_size="-1"),                   # "from the environment"
        _frame("_setup_torch_process_group", "/v/ray/train/torch/config.py",
               world_rank="1", world_size="3", backend='"gloo"'),
        _frame("x", "/v/lightning/fabric/utilities/distributed.py", global_rank="5"),
        _frame("_init_dist_connection", "/v/lightning/fabric/utilities/distributed.py",
               global_rank="<int at 0x1>"),                   # not digits
    ]}]
    assert ranklocals.claims(threads) == [("locals:_setup_torch_process_group", 1, 3)]
    assert ranklocals.claims("nonsense") == [] and ranklocals.claims([{"frames": 3}]) == []


_IN_INIT = """
import time
def init_process_group(backend="gloo", world_size=-1, rank=-1):
    print("ready", flush=True)
    time.sleep(60)
init_process_group(world_size=4, rank=2)
"""


def test_a_real_nonblocking_dump_with_locals_shows_init_process_group(tmp_path) -> None:
    pyspy = find_pyspy()
    assert pyspy, "py-spy missing from the venv"
    src = tmp_path / "torch" / "distributed" / "distributed_c10d.py"
    src.parent.mkdir(parents=True)
    src.write_text(_IN_INIT)
    p = subprocess.Popen([sys.executable, str(src)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        out = subprocess.run([pyspy, "dump", "--json", "--locals", "--nonblocking", "--pid",
                              str(p.pid)], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert ranklocals.claims(json.loads(out.stdout)) == [("locals:init_process_group", 2, 4)]
    finally:
        p.kill()
        p.wait()


def test_sources_agree_or_number_nothing() -> None:
    got = Learned()
    assert got.verdict() is None
    assert got.claim("ray_train_log", 1, 3)
    assert not got.claim("ray_train_log", 1, 3)            # nothing new
    assert got.claim("locals:_setup_torch_process_group", 1, 0)
    assert got.verdict() == (1, 3, "ray_train_log", "")
    assert got.claim("flight_recorder", 2)
    rank, _, source, conflict = got.verdict()
    assert (rank, source) == (-1, "")
    assert conflict == "flight_recorder:2 ray_train_log:1 locals:_setup_torch_process_group:1"
    rp = _member(10)
    shown = numbered(rp, got.verdict())
    assert not shown.identity.known and shown.identity.rank_conflict == conflict
    assert numbered(rp, None) is rp


def test_locals_are_asked_for_a_bounded_number_of_dumps() -> None:
    learner, rp = RankLearner(), _member(10, source="master")
    asked = sum(learner.wants_locals(rp) for _ in range(LOCALS_DUMPS + 10))
    assert asked == LOCALS_DUMPS
    numbered_rp = numbered(rp, (3, 4, "ray_train_log", ""))
    assert not learner.wants_locals(numbered_rp)          # a numbered rank: plain dumps
    # A dump with locals that failed (over the output cap, too slow): no more.
    other = _member(11, source="master")
    assert learner.wants_locals(other)
    learner.no_locals(other)
    assert not learner.wants_locals(other)


def test_the_learner_numbers_a_ray_worker_from_its_log(tmp_path) -> None:
    line = json.dumps({"process": 0, "world_rank": 1}).replace('"process": 0', '"process": PID')
    p = _hold(tmp_path, "logs/train/ray-train-sys-worker-" + "cd" * 28 + ".log", line)
    try:
        learner = RankLearner()
        rp = _member(p.pid)
        (out,) = learner.apply([rp], time.monotonic())
        assert (out.identity.rank, out.identity.rank_source) == (1, "ray_train_log")
        assert out.identity.job_id == rp.identity.job_id
        # A non-Ray member is never looked for in Ray's logs.
        (other,) = RankLearner().apply([_member(p.pid, source="master")], time.monotonic())
        assert not other.identity.known
    finally:
        p.kill()
        p.wait()


class _Found:
    """A discovery that finds one unnumbered member, whatever is learned."""

    def __init__(self, rp: RankProcess) -> None:
        self.rp = rp

    def scan(self, budget: float | None = None) -> list[RankProcess]:
        return [self.rp]


def test_a_member_numbered_later_keeps_its_history_and_leaves_as_a_member() -> None:
    import asyncio

    import psutil

    from ncclwatch.agent.agent import Agent
    from ncclwatch.agent.gpu import NvmlGpuReader
    from ncclwatch.agent.settings import AgentConfig
    from tests.harness.procs import free_port

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        rp = _member(p.pid, create=psutil.Process(p.pid).create_time())

        async def go():
            agent = Agent(AgentConfig(collector=f"127.0.0.1:{free_port()}", interval=0.1,
                                      node="n"), gpu=NvmlGpuReader(), discovery=_Found(rp))
            agent._scan_and_sample()
            t = agent.trackers[p.pid]
            assert not t.proc.identity.known
            agent.ranks_learned._of(rp).claim("ray_train_log", 1, 3)
            agent._scan_and_sample()
            # The same tracker (its states and stillness kept), under its number.
            assert agent.trackers[p.pid] is t
            i = t.proc.identity
            assert (i.rank, i.rank_source, i.world_size) == (1, "ray_train_log", 3)
            assert [e.identity.rank for e in agent._exited] == [UNKNOWN_RANK]
            agent._scan_and_sample()                  # steady: nothing more leaves
            assert len(agent._exited) == 1 and agent.trackers[p.pid] is t

        asyncio.run(go())
    finally:
        p.kill()
        p.wait()


def test_a_ray_jobs_store_server_is_checked_against_rays_log(tmp_path) -> None:
    """Rank 0 found as the TCPStore's server stays as found when Ray's log
    agrees, and is unnumbered, both shown, when it does not."""
    from dataclasses import replace

    from ncclwatch.agent.raytrain import STORE_SOURCE
    for logged, expected in ((0, (0, STORE_SOURCE, "")),
                             (2, (UNKNOWN_RANK, UNKNOWN_SOURCE,
                                  "tcpstore_server:0 ray_train_log:2"))):
        line = json.dumps({"process": 0, "world_rank": logged}).replace(
            '"process": 0', '"process": PID')
        p = _hold(tmp_path, f"{logged}/logs/train/ray-train-sys-worker-" + "ef" * 28 + ".log",
                  line)
        try:
            rp = _member(p.pid)
            rp = replace(rp, identity=replace(rp.identity, rank=0, rank_source=STORE_SOURCE))
            (out,) = RankLearner().apply([rp], time.monotonic())
            i = out.identity
            assert (i.rank, i.rank_source, i.rank_conflict) == expected
            if logged == 0:
                assert out is rp
        finally:
            p.kill()
            p.wait()
