"""Where a job's process-group timeout is learned, each value with its source.

The agent's tables (agent/timeouts.py: environment, command line in each
framework's syntax, the config file it names; agent/ranklocals.py: a set-up
frame's plain-number local, read by the real py-spy), and the daemon's
order (budget.timeout_for): the Flight Recorder of the waiters' group, its
default group, what the job states, the config, a previous incarnation,
the default. The Flight Recorder dumps are the real gloo ones of
tests/data/flightrec/real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ncclwatch.agent import ranklocals
from ncclwatch.agent.discover import read_config
from ncclwatch.agent.frprobe import summary_pb
from ncclwatch.agent.timeouts import (
    CONFIG_KEYS, FRAMEWORK_DEFAULTS, MAX_CONFIG_BYTES, TIMEOUT_ARGS, args_timeout_from,
    config_timeout_from, stated_timeout,
)
from ncclwatch.daemon import jobfacts
from ncclwatch.daemon.budget import BudgetConfig, budget, timeout_for
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.flightrec import load_dump
from ncclwatch.model import CollectiveOp as Op
from ncclwatch.model import RankState as S
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.paths import DATA
from tests.harness.reports import report, sample

MULTIPG = DATA / "flightrec" / "real" / "multipg"
PYSPY = Path(sys.executable).parent / "py-spy"
TORCHRUN = ["/venv/bin/python", "-m", "torch.distributed.run", "--nproc-per-node", "8",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29500"]


# -- the command line, as the launchers leave it in the rank's argv ----------

@pytest.mark.parametrize("argv,expected", [
    # Hugging Face TrainingArguments (seconds), both spellings HfArgumentParser takes
    (["/venv/bin/python", "-u", "run_clm.py", "--ddp_timeout", "3600", "--do_train"],
     (3600.0, "args:--ddp_timeout")),
    (["run_clm.py", "--ddp-timeout=5400"], (5400.0, "args:--ddp-timeout")),
    # Megatron-LM: whole minutes
    (["/venv/bin/python", "-u", "pretrain_gpt.py", "--tensor-model-parallel-size", "2",
      "--distributed-timeout-minutes", "2", "--bf16"],
     (120.0, "args:--distributed-timeout-minutes")),
    # torchtitan: the steady-state timeout after the first step (argparse and tyro spellings)
    (["/venv/bin/python", "-m", "torchtitan.train", "--comm.train_timeout_seconds", "120"],
     (120.0, "args:--comm.train_timeout_seconds")),
    (["-m", "torchtitan.train", "--comm.train-timeout-seconds=45"],
     (45.0, "args:--comm.train-timeout-seconds")),
    # the last one given wins; nonsense states nothing
    (["t.py", "--ddp_timeout", "900", "--distributed-timeout-minutes", "3"],
     (180.0, "args:--distributed-timeout-minutes")),
    (["t.py", "--distributed-timeout-minutes", "soon"], (0.0, "")),
    (["t.py", "--comm.init_timeout_seconds", "300"], (0.0, "")),   # only until the first step
    (["t.py", "--timeout", "3600"], (0.0, "")),
])
def test_each_command_line_row_is_read_with_its_unit_and_source(argv, expected) -> None:
    assert args_timeout_from(argv) == expected


def test_every_table_row_is_exercised() -> None:
    """A row added without a test of its own fails here."""
    tested = {"--ddp_timeout", "--ddp-timeout", "--distributed-timeout-minutes",
              "--comm.train_timeout_seconds", "--comm.train-timeout-seconds"}
    assert {opt for opt, _ in TIMEOUT_ARGS} == tested
    assert [k for _, k, _ in CONFIG_KEYS] == ["comm.train_timeout_seconds"]
    assert {o for o, _, _ in FRAMEWORK_DEFAULTS} == {"--job.config_file", "--job.config-file"}
    assert {f for f, _, _, _ in ranklocals.TIMEOUT_FRAMES} == {"_setup_torch_process_group"}


# -- torchtitan's TOML, read inside the rank's root --------------------------

TITAN_TOML = b"""
[job]
dump_folder = "./outputs"
description = "Llama 3 debug training"

[comm]
init_timeout_seconds = 600
train_timeout_seconds = 240
trace_buf_size = 20000
"""


def _reader(pid: int):
    return lambda path, limit: read_config(pid, path, limit)


def test_torchtitan_toml_named_on_the_command_line_is_read_in_the_ranks_root(tmp_path) -> None:
    cfg = tmp_path / "llama3_debug.toml"
    cfg.write_bytes(TITAN_TOML)
    argv = ["-m", "torchtitan.train", "--job.config_file", str(cfg)]
    # A real process as the rank: its root and working directory are where the walk starts.
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], cwd=tmp_path)
    try:
        assert stated_timeout({}, argv, _reader(p.pid)) == \
            (240.0, "config:comm.train_timeout_seconds")
        # relative to the rank's working directory, not the agent's
        assert stated_timeout({}, ["--job.config_file=llama3_debug.toml"], _reader(p.pid)) == \
            (240.0, "config:comm.train_timeout_seconds")
        # the command line overrides the file, as torchtitan merges them
        assert stated_timeout({}, argv + ["--comm.train_timeout_seconds", "60"], _reader(p.pid)) \
            == (60.0, "args:--comm.train_timeout_seconds")
        # no [comm] value: torchtitan's own default (100 s after the first step), said so
        cfg.write_bytes(b"[job]\ndescription = 'x'\n")
        assert stated_timeout({}, argv, _reader(p.pid)) == (100.0, "framework_default:torchtitan")
        # too large, not a regular file, malformed, absent: states nothing from the file
        cfg.write_bytes(b"[comm]\ntrain_timeout_seconds = 240\n" + b"#" * MAX_CONFIG_BYTES)
        assert read_config(p.pid, str(cfg), MAX_CONFIG_BYTES) is None
        fifo = tmp_path / "fifo.toml"
        os.mkfifo(fifo)
        assert read_config(p.pid, str(fifo), MAX_CONFIG_BYTES) is None   # never opened: no block
        assert read_config(p.pid, str(tmp_path / "absent.toml"), MAX_CONFIG_BYTES) is None
    finally:
        p.kill()
        p.wait()
    assert config_timeout_from(b"[comm\ntrain_timeout_seconds = 240", "toml") == (0.0, "")
    assert config_timeout_from(b"[comm]\ntrain_timeout_seconds = true", "toml") == (0.0, "")
    assert config_timeout_from(b"[comm]\ntrain_timeout_seconds = '240'", "toml") == (0.0, "")


def test_order_of_what_the_rank_states() -> None:
    """ncclwatch's own variable > command line > config file > DEEPSPEED_TIMEOUT
    (only deepspeed.init_distributed's default) > a framework's default."""
    megatron = ["pretrain_gpt.py", "--distributed-timeout-minutes", "20"]
    assert stated_timeout({"NCCLWATCH_PG_TIMEOUT_S": "90"}, megatron) == \
        (90.0, "env:NCCLWATCH_PG_TIMEOUT_S")
    assert stated_timeout({"DEEPSPEED_TIMEOUT": "30"}, megatron) == \
        (1200.0, "args:--distributed-timeout-minutes")
    assert stated_timeout({"DEEPSPEED_TIMEOUT": "30"}, ["train.py"]) == \
        (1800.0, "env:DEEPSPEED_TIMEOUT")
    assert stated_timeout({}, ["train.py"]) == (0.0, "")


# -- a set-up frame's locals, as the real py-spy shows them ------------------

SETUP = """
import sys, time
from datetime import timedelta
def init_process_group(backend=None, timeout=None, rank=-1):
    print("ready", flush=True)
    time.sleep(60)
def _setup_torch_process_group(backend, world_rank, world_size, init_method, timeout_s=1800):
    init_process_group(backend, timeout=timedelta(seconds=timeout_s), rank=world_rank)
_setup_torch_process_group("gloo", 3, 4, "env://", timeout_s=int(sys.argv[1]))
"""


def _locals_dump(tmp_path: Path, seconds: str) -> list:
    ray = tmp_path / "ray" / "train" / "torch"
    ray.mkdir(parents=True)
    (ray / "config.py").write_text(SETUP)
    p = subprocess.Popen([sys.executable, str(ray / "config.py"), seconds],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        out = subprocess.run([str(PYSPY), "dump", "--json", "--locals", "--nonblocking",
                              "--pid", str(p.pid)], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)
    finally:
        p.kill()
        p.wait()


def test_ray_trains_timeout_s_is_read_from_its_frame_and_a_timedelta_is_not(tmp_path) -> None:
    threads = _locals_dump(tmp_path, "90")
    frames = {f["name"]: f for t in threads for f in t["frames"]}
    # What py-spy shows of init_process_group(timeout=timedelta(...)): no number in it.
    shown = {v["name"]: v["repr"] for v in frames["init_process_group"]["locals"]}
    assert shown["timeout"].startswith("<datetime.timedelta at 0x")
    assert ranklocals.timeout_claim(threads) == (90.0, "locals:_setup_torch_process_group")
    assert ("locals:_setup_torch_process_group", 3, 4) in ranklocals.claims(threads)
    # The same function in another file is the training script's, never read.
    for f in frames.values():
        f["filename"] = f["filename"].replace("ray/train/torch", "mine")
    assert ranklocals.timeout_claim(threads) == (0.0, "")


# -- the daemon's order, per process group, previous incarnations -------------

def _fr(rank: int, timeout_ms: dict[str, int] | None = None) -> pb.FlightRecorderSummary:
    """A real multipg dump's summary; ``timeout_ms``: group desc -> timeout as
    ``new_group(timeout=...)`` would have set it."""
    s = summary_pb(load_dump(MULTIPG / f"comm_lib_trace_rank_{rank}"),
                   written_at=time.time() - 1.0, now_wall=time.time())
    for g in s.groups:
        if timeout_ms and g.pg_desc in timeout_ms:
            g.pending_timeout_ms = timeout_ms[g.pg_desc]
    return s


def _multipg(seq: int, *, fr: bool, stated: tuple[float, str] = (0.0, ""),
             pair23_ms: int = 30_000, job: str = "job-m", wait: float = 20.0):
    """The real multipg job: rank 2 waits in pair23's all_reduce (rank 3 never came)."""
    samples = [sample(job, 0, 4, S.COMPUTE, seconds=wait),
               sample(job, 1, 4, S.COMPUTE, seconds=wait),
               sample(job, 2, 4, S.COLLECTIVE, Op.ALL_REDUCE, seconds=wait),
               sample(job, 3, 4, S.COMPUTE, seconds=wait)]
    for s in samples:
        s.job.CopyFrom(pb.JobInfo(source="test", watchdog_timeout_seconds=stated[0],
                                  watchdog_timeout_source=stated[1]))
        if fr:
            s.flight_recorder.CopyFrom(_fr(s.identity.rank, {"pair23": pair23_ms}))
    return report(samples, seq=seq)


def test_the_waiters_group_timeout_is_the_budgets_not_the_default_groups() -> None:
    d = Daemon(DaemonConfig())
    d.ingest(_multipg(1, fr=True), now=100.0)
    job = d.table.jobs["job-m"]
    assert job.fr_timeout == 5.0                      # default_pg's, from every dump
    assert 2 in job.waiting
    since = job.ranks[2].since
    # rank 2 waits in pair23 (its dump, written during the wait, shows it pending)
    assert jobfacts.group_timeout(job, 2, since) == (30.0, "flight_recorder:group pair23")
    assert timeout_for(job, BudgetConfig(), 2, since) == (30.0, "flight_recorder:group pair23")
    b = budget(job, d.table, 101.0, BudgetConfig())
    assert (b.timeout, b.source, b.blocked_rank) == (30.0, "flight_recorder:group pair23", 2)
    # Its group unknown (no dump of this wait, or another rank): today's rule.
    assert timeout_for(job, BudgetConfig(), 2, since + 1e6) == (5.0, "flight_recorder")
    assert timeout_for(job, BudgetConfig(), 0, since) == (5.0, "flight_recorder")
    # The default group is named as the Flight Recorder's plain source.
    fr2 = job.flight_recorder[2][1]
    for g in fr2.groups:
        g.pending_op, g.pending_timeout_ms = ("", g.pending_timeout_ms) if g.pg_desc == "pair23" \
            else ("all_reduce", 7000)
    assert jobfacts.group_timeout(job, 2, since) == (7.0, "flight_recorder")


def test_precedence_exact_fr_then_stated_then_config_then_previous_run_then_default() -> None:
    cfg = BudgetConfig(job_timeouts={"job-*": 1500.0})
    d = Daemon(DaemonConfig())
    d.ingest(_multipg(1, fr=False, stated=(120.0, "args:--distributed-timeout-minutes")), now=10.0)
    job = d.table.jobs["job-m"]
    assert timeout_for(job, cfg) == (120.0, "args:--distributed-timeout-minutes")
    assert timeout_for(job, BudgetConfig()) == (120.0, "args:--distributed-timeout-minutes")
    d.ingest(_multipg(2, fr=True, stated=(120.0, "args:--distributed-timeout-minutes")), now=11.0)
    assert timeout_for(job, cfg) == (5.0, "flight_recorder")
    # an older agent states a timeout without its source: "job", as before
    d2 = Daemon(DaemonConfig())
    d2.ingest(_multipg(1, fr=False, stated=(300.0, ""), job="job-old"), now=10.0)
    assert timeout_for(d2.table.jobs["job-old"], BudgetConfig()) == (300.0, "job")
    # nothing stated: the config's per-job timeout, then the default (assumed)
    d3 = Daemon(DaemonConfig())
    d3.ingest(_multipg(1, fr=False, job="job-x"), now=10.0)
    assert timeout_for(d3.table.jobs["job-x"], cfg) == (1500.0, "config")
    assert timeout_for(d3.table.jobs["job-x"], BudgetConfig()) == (600.0, "default")


def _end(d: Daemon, job_id: str, now: float) -> float:
    """Every rank of the job exits; ticks until the daemon forgets the job."""
    for r in list(d.table.jobs[job_id].ranks):
        d.table._gone(job_id, r, None, now)
    t = now
    while job_id in d.table.jobs:
        t += 30.0
        d.tick(now=t)
        assert t < now + 3600
    return t


def test_a_restart_starts_from_its_previous_runs_timeout_until_it_states_its_own() -> None:
    d = Daemon(DaemonConfig())
    cfg = BudgetConfig()
    d.ingest(_multipg(1, fr=False, stated=(120.0, "args:--distributed-timeout-minutes")), now=10.0)
    t = _end(d, "job-m", 20.0)
    # the same job id comes back (a Slurm requeue), stating nothing yet
    d.ingest(_multipg(2, fr=False), now=t + 60.0)
    job = d.table.jobs["job-m"]
    assert timeout_for(job, cfg) == (120.0, "previous_run:args:--distributed-timeout-minutes")
    # the config's word for the job beats an earlier run's
    assert timeout_for(job, BudgetConfig(job_timeouts={"job-m": 900.0})) == (900.0, "config")
    # it states its own: that one
    d.ingest(_multipg(3, fr=False, stated=(45.0, "env:NCCLWATCH_PG_TIMEOUT_S")), now=t + 61.0)
    assert timeout_for(job, cfg) == (45.0, "env:NCCLWATCH_PG_TIMEOUT_S")
    # a second restart inherits the newest, with its original source (no chain of prefixes)
    t2 = _end(d, "job-m", t + 70.0)
    d.ingest(_multipg(4, fr=False), now=t2 + 1.0)
    assert timeout_for(d.table.jobs["job-m"], cfg) == \
        (45.0, "previous_run:env:NCCLWATCH_PG_TIMEOUT_S")
    # ... and a third, still stating nothing, inherits the same (not previous_run:previous_run:)
    t3 = _end(d, "job-m", t2 + 5.0)
    d.ingest(_multipg(5, fr=False), now=t3 + 1.0)
    assert timeout_for(d.table.jobs["job-m"], cfg) == \
        (45.0, "previous_run:env:NCCLWATCH_PG_TIMEOUT_S")
    # after a day, forgotten: the default again
    t4 = _end(d, "job-m", t3 + 5.0)
    d.ingest(_multipg(6, fr=False), now=t4 + jobfacts.PAST_KEEP + 1.0)
    assert timeout_for(d.table.jobs["job-m"], cfg) == (600.0, "default")


def test_past_timeouts_are_bounded_and_a_measured_kill_is_kept_only_without_a_better_one() -> None:
    from ncclwatch.daemon.records import Job

    past = jobfacts.PastTimeouts(limit=2)
    jobs = [Job(f"j{i}", 2, 0.0) for i in range(3)]
    for j in jobs:
        past.carry(j, 0.0)
        jobfacts.observed_kill(j, 95.0, 1.0)
    assert len(past._notes) == 2                          # j0 forgotten first
    again = [Job(f"j{i}", 2, 10.0) for i in range(3)]
    for j in (again[1], again[2], again[0]):
        past.carry(j, 10.0)
    assert [j.previous_timeout for j in again] == [(0.0, ""), (95.0, "observed_kill"),
                                                  (95.0, "observed_kill")]
    # a stated timeout is not replaced by a measured one
    j = again[1]
    jobfacts._set_timeout(j, "job", 90.0, 11.0, "n", 0, "locals:_setup_torch_process_group")
    jobfacts.observed_kill(j, 80.0, 12.0)
    assert (j.timeout_note.seconds, j.timeout_note.source) == \
        (90.0, "locals:_setup_torch_process_group")
