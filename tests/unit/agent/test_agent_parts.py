"""Agent parts against real processes: discovery, /proc samples, py-spy."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from ncclwatch.agent.discover import Discovery
from ncclwatch.agent.gpu import NvmlGpuReader, RecordedGpuReader
from ncclwatch.agent.policy import StackPolicy
from ncclwatch.agent.pyspy import PySpy, PySpyError, dump_argv, find_pyspy
from ncclwatch.agent.report import sample_pb
from ncclwatch.agent.sample import ProcessSampler
from ncclwatch.agent.tracker import RankTracker
from ncclwatch.agent.uplink import Uplink
from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.signatures import Classification
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.paths import DATA


RANK_ENV = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.9.9.9",
            "MASTER_PORT": "29555", "NCCL_DEBUG": "WARN", "HF_TOKEN": "hf_" + "x" * 30}

CHILD = """
import os, sys, time
import torch.distributed  # a rank is a Python process that loaded torch
if os.fork() == 0:   # a DataLoader-like fork: same environment
    time.sleep(60); os._exit(0)
f = open(sys.argv[1], 'wb'); f.write(b'x' * 65536); f.flush()
print('ready', flush=True)
time.sleep(60)
"""


@pytest.fixture
def fake_rank(tmp_path):
    """A real process that declares itself rank 1 of a job, and a forked child."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "ckpt.pt")],
                            env={**os.environ, **RANK_ENV}, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass   # the test killed the group itself, and its orphan was reaped already
    proc.wait()


def test_discovery_finds_the_rank_once_and_keeps_only_allowlisted_env(fake_rank) -> None:
    d = Discovery("nodeA")
    ranks = [r for r in d.scan() if r.identity.job_id == "master:10.9.9.9:29555/2"]
    assert [r.pid for r in ranks] == [fake_rank.pid]  # the fork is not a second rank 1
    r = ranks[0]
    assert (r.identity.rank, r.identity.local_rank, r.identity.world_size) == (1, 1, 2)
    assert r.env["NCCL_DEBUG"] == "WARN"
    assert "HF_TOKEN" not in r.env and "PATH" not in r.env
    # Second scan: cached, same answer.
    assert [x.pid for x in d.scan() if x.identity.job_id == r.identity.job_id] == [fake_rank.pid]


def test_discovery_reads_the_timeout_a_rank_states_on_its_command_line(tmp_path) -> None:
    """`--ddp_timeout 1800` (Hugging Face's) on the rank's command line is its declared
    timeout, marked with its source; ncclwatch's own variable in its environment
    says it first."""
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / f"c{i}.pt"),
                               "--ddp_timeout", "1800"],
                              env={**os.environ, **RANK_ENV, "MASTER_PORT": str(29560 + i),
                                   **extra}, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
             for i, extra in enumerate(({}, {"NCCLWATCH_PG_TIMEOUT_S": "900"}))]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        found = {r.pid: r for r in Discovery("nodeA").scan()}
        plain, stated = (found[p.pid] for p in procs)
        assert (plain.timeout, plain.timeout_source) == (1800.0, "args:--ddp_timeout")
        assert (stated.timeout, stated.timeout_source) == (900.0, "env:NCCLWATCH_PG_TIMEOUT_S")
    finally:
        for p in procs:
            os.killpg(p.pid, 9)
            p.wait()


def test_discovery_forgets_exited_ranks(fake_rank) -> None:
    d = Discovery("nodeA")
    assert any(r.pid == fake_rank.pid for r in d.scan())
    os.killpg(fake_rank.pid, 9)
    fake_rank.wait()
    assert not any(r.pid == fake_rank.pid for r in d.scan())


def test_sampler_reads_a_real_process_and_survives_its_exit(fake_rank, tmp_path) -> None:
    s = ProcessSampler()
    sample = s.sample(fake_rank.pid)
    assert sample is not None and sample.rss_bytes > 0 and sample.io_write_bytes >= 65536
    assert [(f.path, f.size_bytes) for f in sample.files_writing] == [
        (str(tmp_path / "ckpt.pt"), 65536)]
    os.killpg(fake_rank.pid, 9)
    fake_rank.wait()
    assert s.sample(fake_rank.pid) is None
    assert s.sample(2**22 + 12345) is None  # never existed


def test_pyspy_dumps_a_real_process_nonblocking(fake_rank) -> None:
    binary = find_pyspy()
    assert binary, "py-spy missing from the venv: run `make test`"
    argv = dump_argv(binary, 42)
    assert "--nonblocking" in argv and "--native" not in argv
    spy = PySpy(binary)
    threads = asyncio.run(spy.dump(fake_rank.pid))
    assert any(t.os_thread_id == fake_rank.pid for t in threads)
    assert spy.runs_total == 1 and spy.failures_total == 0


def test_pyspy_failures_are_counted_not_raised_into_the_agent(tmp_path) -> None:
    spy = PySpy(find_pyspy())
    with pytest.raises(PySpyError):
        asyncio.run(spy.dump(2**22 + 12345))
    assert spy.failures_total == 1


def test_pyspy_timeout_kills_only_the_dumper(tmp_path) -> None:
    # A stand-in binary that hangs: the runner must give up at its timeout.
    hang = tmp_path / "py-spy"
    hang.write_text("#!/bin/sh\nexec sleep 30\n")
    hang.chmod(0o755)
    spy = PySpy(str(hang), timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(PySpyError, match="timed out"):
        asyncio.run(spy.dump(os.getpid()))
    assert time.monotonic() - t0 < 5
    assert spy.failures_total == 1


def test_tracker_estimates_state_start_from_quiet_cpu() -> None:
    from ncclwatch.agent.discover import RankProcess
    from ncclwatch.agent.sample import ProcessSample
    from ncclwatch.jobid import RankIdentity

    proc = RankProcess(1, 0.0, RankIdentity("j", "t", 0, 0, 2), {})

    def ps(cpu):
        return ProcessSample(1, cpu, 1, 0, 0, 1, ())

    t = RankTracker(proc, now=0.0)
    t.observe_process(ps(0.0), 0.0)
    t.observe_stack(Classification(RankState.COMPUTE), "a", 0.5)
    for now, cpu in ((1.0, 1.0), (2.0, 2.0), (3.0, 2.0), (4.0, 2.0)):  # goes quiet after 2.0
        t.observe_process(ps(cpu), now)
    assert t.quiet and t.quiet_since == 2.0
    t.observe_stack(Classification(RankState.COLLECTIVE, CollectiveOp.BARRIER), "b", 4.5)
    # The earliest start the evidence allows: the quiet spell that shows from 2.0
    # may have set in anywhere in [1.0, 2.0] (an interval busy on average, and a
    # process may burn more than one CPU); not 4.5 (when seen), not 0.5 (last
    # other dump), and not 2.0 (that would let the budget err large).
    assert t.quiet_from == 1.0
    assert t.state_since == 1.0
    s = sample_pb(t, now=10.0, gpu=(), devices={}, with_job=False)
    assert s.state_seconds == pytest.approx(9.0)
    assert s.op == pb.COLLECTIVE_OP_BARRIER


def test_policy_dumps_suspects_often_and_healthy_ranks_rarely() -> None:
    from ncclwatch.agent.discover import RankProcess
    from ncclwatch.jobid import RankIdentity

    def tracker(pid, state, quiet, last):
        t = RankTracker(RankProcess(pid, 0.0, RankIdentity("j", "t", pid, 0, 9), {}), 0.0)
        t.state, t.stack_at, t.quiet_at_last_dump = state, last, quiet
        t.quiet_since = 0.0 if quiet else None
        return t

    p = StackPolicy(suspect_interval=2, slow_interval=20, max_per_round=8)
    busy_recent = tracker(1, RankState.COMPUTE, False, 95.0)
    busy_old = tracker(2, RankState.COMPUTE, False, 70.0)
    waiting = tracker(3, RankState.COLLECTIVE, True, 97.0)
    fresh_wait = tracker(4, RankState.COLLECTIVE, True, 99.5)
    new = RankTracker(RankProcess(5, 0.0, RankIdentity("j", "t", 5, 0, 9), {}), 0.0)
    forced = tracker(6, RankState.COMPUTE, False, 99.9)
    forced.forced = True
    due = p.due([busy_recent, busy_old, waiting, fresh_wait, new, forced], now=100.0)
    assert [t.pid for t in due] == [6, 5, 3, 2]
    assert [t.pid for t in StackPolicy(max_per_round=2).due(
        [busy_old, waiting, new, forced], now=100.0)] == [6, 5]
    # A wait seen twice in a row with different stacks is moving: slow round.
    moving = tracker(7, RankState.COLLECTIVE, False, 97.0)
    moving.prev_state, moving.repeats = RankState.IDLE, 0
    stuck = tracker(8, RankState.COLLECTIVE, False, 97.0)
    stuck.prev_state, stuck.repeats = RankState.COLLECTIVE, 2
    entered = tracker(9, RankState.SAVING, False, 97.0)
    entered.prev_state = RankState.COMPUTE
    assert [t.pid for t in p.due([moving, stuck, entered], now=100.0)] == [8, 9]
    # Over its CPU budget the agent takes only what the daemon asked for (and
    # first looks), one per round: suspects and slow rounds wait.
    assert [t.pid for t in p.due([busy_old, waiting, new, forced], now=100.0,
                                 over_budget=True)] == [6]
    assert [t.pid for t in p.due([busy_old, waiting], now=100.0, over_budget=True)] == []


def test_cpu_meter_measures_cores_over_its_window() -> None:
    from ncclwatch.agent.policy import CpuMeter
    m = CpuMeter(window=10.0)
    assert m.add(0.0, 5.0) == 0.0
    for t in range(1, 21):  # half a core for 20 s
        use = m.add(float(t), 5.0 + 0.5 * t)
    assert use == pytest.approx(0.5)
    for t in range(21, 41):  # then idle: the window forgets the busy part
        use = m.add(float(t), 15.0)
    assert use == pytest.approx(0.0, abs=0.06)


def test_recorded_gpu_readings_reach_the_sample() -> None:
    from ncclwatch.agent.discover import RankProcess
    from ncclwatch.jobid import RankIdentity

    reader = RecordedGpuReader.from_file(DATA / "nvml" / "h100_gather.json")
    first = reader.read()
    pid = first.processes[0].pid
    t = RankTracker(RankProcess(pid, 0.0, RankIdentity("j", "t", 0, 0, 8), {}), 0.0)
    s = sample_pb(t, 1.0, first.by_pid()[pid], {d.index: d for d in first.devices}, False)
    assert s.gpu[0].used_bytes == first.processes[0].used_bytes
    assert s.gpu[0].device_total_bytes == first.devices[0].total_bytes
    later = [reader.read() for _ in range(5)][-1]
    assert later.by_pid()[pid][0].used_bytes > first.by_pid()[pid][0].used_bytes


def test_real_nvml_fails_soft_without_a_gpu() -> None:
    reader = NvmlGpuReader()
    if reader.up:
        pytest.skip("this machine has a GPU and NVML: the soft failure path is not reachable")
    assert reader.reason  # says why, once
    assert reader.read().processes == ()


def test_uplink_queue_drops_the_oldest_and_counts() -> None:
    async def go():
        up = Uplink("127.0.0.1:1", {}, max_queue=3)
        for seq in range(1, 6):
            up.submit(pb.NodeReport(seq=seq))
        assert up.dropped_total == 2 and up.queue_length == 3
        assert [r.seq for r in up._queue] == [3, 4, 5]
    asyncio.run(go())


def test_discovery_drops_a_rank_that_died_unreaped() -> None:
    """A killed rank whose launcher has not reaped it is a zombie: gone, not watched."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from ncclwatch.agent.discover import Discovery

    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29999", "NCCLWATCH_JOB_ID": "zombie-test"}
    child = subprocess.Popen([sys.executable, "-c", "import torch.distributed, time; time.sleep(60)"],
                             env=env)
    try:
        d = Discovery("host")
        deadline = time.time() + 10
        while time.time() < deadline and not [r for r in d.scan() if r.pid == child.pid]:
            time.sleep(0.1)
        assert [r.identity.rank for r in d.scan() if r.pid == child.pid] == [1]
        os.kill(child.pid, signal.SIGKILL)
        time.sleep(0.3)  # not reaped: a zombie now
        with open(f"/proc/{child.pid}/stat") as f:
            assert f.read().split(")")[1].split()[0] == "Z"
        assert not [r for r in d.scan() if r.pid == child.pid]
    finally:
        child.kill()
        child.wait()


def test_discovery_sees_a_rank_caught_before_its_exec() -> None:
    """A launcher's child scanned between fork and exec has no RANK yet."""
    import subprocess
    import sys
    import time

    from ncclwatch.agent.discover import Discovery

    # The child starts without RANK and then execs itself with it, as a
    # launcher's fork-then-exec looks to a scan that lands in between.
    code = ("import os, sys, time; time.sleep(0.8); "
            "os.execve(sys.executable, [sys.executable, '-c', "
            "'import torch.distributed, time; time.sleep(30)'], "
            "{**os.environ, 'RANK': '0', 'WORLD_SIZE': '1', 'NCCLWATCH_JOB_ID': 'exec-test'})")
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        d = Discovery("host")
        d.scan()  # sees the child before exec: not a rank (yet)
        assert not [r for r in d.scan() if r.pid == child.pid]
        deadline = time.time() + 10
        found = []
        while time.time() < deadline and not found:
            found = [r for r in d.scan() if r.pid == child.pid]
            time.sleep(0.2)
        assert [r.identity.job_id for r in found] == ["exec-test"]
    finally:
        child.kill()
        child.wait()


def test_expected_gpus_counts_device_nodes_not_control_files(tmp_path) -> None:
    """NVML down where /dev/nvidiaN exist is a broken node, not a CPU node."""
    from ncclwatch.agent.gpu import expected_gpus
    assert expected_gpus(tmp_path) == 0
    for name in ("nvidia0", "nvidia1", "nvidia7", "nvidiactl", "nvidia-uvm", "nvidia-modeset"):
        (tmp_path / name).touch()
    assert expected_gpus(tmp_path) == 3
    assert expected_gpus(tmp_path / "missing") == 0
