"""A healthy job is never paused (issue 26): the agent's native dumps, which stop
the rank, only where the rank's own history or the job's shape says its
stillness is abnormal, and within a pause budget per rank per hour.

The ranks here are the tracker fed round by round (1 s rounds) with the
readings GPU-shaped ranks give: a step's still period (the main thread spins
in a synchronize: no read/write calls, no voluntary switches) and, per step,
a burst of reads (a batch arriving) or nothing at all (batches through shared
memory)."""

from __future__ import annotations

import asyncio
import logging
import random
import time

import pytest

from ncclwatch.agent.agent import Agent, AgentConfig
from ncclwatch.agent.discover import RankIdentity, RankProcess
from ncclwatch.agent.gpu import EMPTY, NvmlGpuReader
from ncclwatch.agent.pausing import BUDGET_WINDOW, PauseBudget, PausePolicy
from ncclwatch.stillness import StillRule
from ncclwatch.agent.policy import StackPolicy
from tests.harness.trackers import POLICY, Rank, rank_tracker


@pytest.mark.parametrize("step", [1, 2, 8, 15, 30])
@pytest.mark.parametrize("reads", [20, 3])
def test_a_healthy_gpu_shaped_rank_is_never_paused(step: int, reads: int) -> None:
    r = Rank()
    for _ in range(max(20, 600 // step)):
        r.step(step, reads)
    assert r.due_at == [], f"paused a healthy rank with {step}s steps at {r.due_at}"
    # The old rule (any rank still 3 s) would have paused it every step.
    assert step < 4 or r.t.history.longest >= 3.0


def test_uneven_steps_within_three_times_the_longest_are_normal() -> None:
    r = Rank()
    for i in range(60):
        r.step(8 if i % 3 else 14)  # a slower step every third one (eval, logging)
    assert r.due_at == []


def _chopped_job(seed: int, policy: StackPolicy, step: int = 30, eval_every: int = 4,
                 eval_seconds: int = 15, steps: int = 12) -> list[float]:
    """A healthy rank whose still periods are cut short at random: 0-3 bursts of
    progress mid-step (a helper thread's writes, GIL switches, a logger at the
    edge of the still rate), and every ``eval_every`` steps a longer wait while
    a peer evaluates. The native dumps it was due."""
    rng = random.Random(seed)
    r = Rank(policy)
    for i in range(steps):
        length = step + (eval_seconds if i and i % eval_every == 0 else 0)
        cuts = set(rng.sample(range(1, length), k=rng.randint(0, 3)))
        r._round(20)  # the batch
        for s in range(1, length):
            r._round(3 if s in cuts else 0)
    return r.due_at


@pytest.mark.parametrize("step,eval_seconds", [(30, 15), (15, 8), (8, 4)])
def test_still_periods_cut_short_and_a_peers_evaluation_are_never_paused(
        step: int, eval_seconds: int) -> None:
    """The longest still period seen early can be a third of a step, and a
    peer's evaluation makes a wait half as long again: neither is abnormal."""
    steps = max(12, 420 // step)
    paused = {seed: due for seed in range(60)
              if (due := _chopped_job(seed, POLICY, step, 4, eval_seconds, steps))}
    assert paused == {}, f"paused a healthy {step}s-step rank: {paused}"


def test_the_old_rule_paused_those_jobs() -> None:
    """The test above can fail: at 2x with no span (the rule before), some of
    the same jobs were paused (the 30 s-step benchmark shape was)."""
    old = StackPolicy(pause=PausePolicy(rule=StillRule(factor=2.0), warm_span=0.0))
    assert any(_chopped_job(seed, old) for seed in range(60))


def test_a_history_is_judged_only_once_it_spans_three_thresholds() -> None:
    r = Rank()
    for _ in range(20):
        r.step(2)  # 40 s of 2 s steps: warm by rounds and seconds
    r.step(6)      # one longer still period (under 3 x 2 s + 2 s)...
    r.step(1)      # ...that ended: the threshold becomes 3 x ~6 s + 2 s
    unspanned = PausePolicy(warm_span=0.0).threshold(r.t.history, r.now, POLICY.native_after)
    assert unspanned is not None and 19.0 <= unspanned <= 23.0, unspanned
    # 47 s watched, under 3 x ~20 s: too early to call 20 s of stillness abnormal.
    assert POLICY.pause.threshold(r.t.history, r.now, POLICY.native_after) is None
    r.still(90)
    assert len(r.due_at) == 1
    assert r.due_at[0] - r.t.history.first_at >= 3 * unspanned, (r.t.history.first_at, r.due_at)


def test_a_rank_batched_through_shared_memory_is_never_paused_on_its_own() -> None:
    # No syscall at all: it sits "still" for ever, and has no normal to be past.
    r = Rank()
    r.still(900)
    assert r.due_at == [] and r.t.still_seconds(r.now) > 800


def test_rank0_logging_alone_is_never_paused() -> None:
    r = Rank()
    for _ in range(300):
        r.step(1, reads=5)  # progress every round: never still
    assert r.due_at == []


def test_stillness_past_the_ranks_own_normal_is_paused_once() -> None:
    r = Rank()
    for _ in range(20):
        r.step(8)
    limit = POLICY.pause.threshold(r.t.history, r.now, POLICY.native_after)
    assert limit is not None and 25.0 <= limit <= 30.0, limit  # 3 x ~8-9 s + 2 s
    r.still(60)  # the last step's still period goes on
    assert len(r.due_at) == 1, r.due_at
    assert limit <= r.due_at[0] - r.t.still_since <= limit + 1.0
    # A job that stepped fast (1 s: never still) has no normal still period:
    # tests/unit/test_stillness.py (paused only once the daemon asks).


@pytest.mark.parametrize("blocked, pauses", [
    ("clock_nanosleep/hrtimer_nanosleep", 0),   # time.sleep: an evaluation, a retry loop
    ("nanosleep/hrtimer_nanosleep", 0),
    ("futex/futex_wait_queue", 1),              # a C++ wait (work.wait()): unwind it
    ("running", 1),                             # a spin: a device sync
    ("", 1),                                    # not read (no ptrace access): as before
])
def test_a_rank_asleep_on_a_timer_is_never_paused(blocked: str, pauses: int) -> None:
    """Still past its normal with its thread in nanosleep (read from /proc, no
    pause): asleep by its own choice, waiting on no peer; a native stack would
    add nothing, so none is taken (the healthy rank-0 evaluation that sleeps)."""
    r = Rank()
    for _ in range(20):
        r.step(8)
    r.blocked = blocked
    r.still(60)
    assert len(r.due_at) == pauses, (blocked, r.due_at)


def test_the_ceiling_caps_a_long_normal() -> None:
    r = Rank(StackPolicy(pause=PausePolicy(ceiling=40.0)))
    for _ in range(14):
        r.step(30)
    r.still(80)
    assert len(r.due_at) == 1 and 40.0 <= r.due_at[0] - r.t.still_since <= 41.0, r.due_at


def test_the_daemon_asks_when_the_jobs_shape_says_a_stall_is_under_way() -> None:
    # No history at all (the job just started its first step), a peer in
    # checkpoint work: the daemon's ask makes the stillness abnormal.
    r = Rank()
    r.step(1)
    r.still(2)
    assert r.due_at == []
    r.t.native_asked = r.now
    r.still(3)
    assert len(r.due_at) == 1
    # An ask from an earlier still period does not carry over.
    r.step(1)
    r.still(10)
    assert len(r.due_at) == 1


def test_native_dumps_turned_off() -> None:
    for policy in (StackPolicy(native_after=0), StackPolicy(pause=PausePolicy(budget=0))):
        r = Rank(policy)
        r.step(1)
        r.t.native_asked = r.now
        r.still(20)
        assert r.due_at == []


def test_the_budget_counts_an_hour_of_pauses() -> None:
    p, b = PausePolicy(budget=2.0), PauseBudget()
    b.add(0.0, 0.9)
    b.add(10.0, 0.9)
    assert not b.spent(p, 20.0)
    b.add(30.0, 0.5)
    assert b.spent(p, 40.0) and b.used(40.0) == pytest.approx(2.3)
    assert not b.spent(p, BUDGET_WINDOW + 15.0)  # the first two left the window


def test_the_log_says_why_a_rank_is_paused() -> None:
    r = Rank()
    for _ in range(30):
        r.step(8)
    r.still(60)
    (at,) = r.due_at
    why = POLICY.why(r.t, at)
    assert why.startswith(f"still {at - r.t.still_since:.1f}s, past its normal (threshold ")
    assert f"longest normal still period {r.t.history.longest:.1f}s" in why
    asked = Rank()
    asked.step(1)
    asked.still(4)
    asked.t.native_asked = asked.now
    why = POLICY.why(asked.t, asked.now)
    assert why.startswith("still 5.0s while the daemon sees a stall's shape; its Python "
                          "stack (compute, read "), why
    assert why.endswith("ago) shows no wait"), why
    # the shape in the daemon's words, escaped as anything a log line carries
    asked.t.asked(True, asked.now, "every rank still\x1b[2J")
    why = POLICY.why(asked.t, asked.now)
    assert why.startswith("still 5.0s while the daemon sees a stall's shape (every rank "
                          "still\\x1b[2J); its Python stack"), why


def test_a_rank_that_moved_on_since_its_sample_is_not_paused() -> None:
    """The daemon asked during a peer's long evaluation; a pause is decided on the
    round's sample, and the evaluation ended before the pause would begin: the
    rank's progress read again just before it says so (a healthy job's ranks
    were paused as they ran their next step, CI)."""
    r = Rank()
    r.step(1)
    r.still(4)
    r.t.native_asked = r.now
    r.still(1)
    assert len(r.due_at) == 1    # due by the round's sample
    sampled = r.now - 1.0        # when that round read the rank
    assert not r.t.moved_since_sample(r.events, sampled + 0.5)      # still now
    assert not r.t.moved_since_sample(r.events + 1, sampled + 0.5)  # a still rank's trickle (< 2 a second)
    assert r.t.moved_since_sample(r.events + 40, sampled + 0.5)     # its next step's calls
    assert not r.t.moved_since_sample(None, sampled + 0.5)          # unreadable: the sample


def test_a_spent_budget_refuses_says_so_once_and_is_counted(caplog) -> None:
    """The agent's own bookkeeping: refused dumps, ranks spent, the health fields."""
    agent = Agent(AgentConfig(collector="127.0.0.1:1", node="n",
                              policy=StackPolicy(pause=PausePolicy(budget=1.0))),
                  gpu=NvmlGpuReader())
    a, b = rank_tracker(1), rank_tracker(2)
    agent.trackers = {1: a, 2: b}
    a.budget.add(100.0, 1.2)
    for t in (a, b):
        t.still_since = 95.0
    with caplog.at_level(logging.WARNING, logger="ncclwatch.agent.agent"):
        assert agent._budget_spent(a, 101.0) and not agent._budget_spent(b, 101.0)
        a.still_since = 102.0
        assert agent._budget_spent(a, 103.0)
    said = [r for r in caplog.records if "pause budget" in r.getMessage()]
    assert len(said) == 1 and "--pause-budget 1.0" in said[0].getMessage()
    assert a.native_for == 102.0  # not asked again in this still period
    assert agent.native_refused_total == 2
    assert agent._ranks_budget_spent(103.0) == 1
    # The hour frees it: not spent, and it would be said again next time.
    assert agent._ranks_budget_spent(100.0 + BUDGET_WINDOW) == 0 and not a.budget.spent_said
    h = agent._build(EMPTY).health
    assert h.pause_budget_seconds_per_hour == 1.0 and h.native_dumps_refused_total == 2


def test_the_pause_settings_come_from_flag_env_and_toml(tmp_path) -> None:
    import argparse

    from ncclwatch.cli import AGENT_OPTIONS, _agent_config
    from ncclwatch.config import add_options, resolve

    parser = argparse.ArgumentParser()
    add_options(parser, AGENT_OPTIONS)
    file = {"pause_budget": 4.0, "native_stack_ceiling": 90}
    cfg = resolve(AGENT_OPTIONS, parser.parse_args([]), file, env={})
    policy = _agent_config(cfg).policy
    assert (policy.pause.budget, policy.pause.ceiling) == (4.0, 90.0)
    cfg = resolve(AGENT_OPTIONS, parser.parse_args(["--pause-budget", "0"]), file,
                  env={"NCCLWATCH_PAUSE_BUDGET": "7"})
    assert _agent_config(cfg).policy.pause.budget == 0.0
    cfg = resolve(AGENT_OPTIONS, parser.parse_args([]), {}, env={"NCCLWATCH_PAUSE_BUDGET": "7"})
    assert _agent_config(cfg).policy.pause.budget == 7.0
    with pytest.raises(Exception, match="pause_budget"):
        resolve(AGENT_OPTIONS, parser.parse_args([]), {"pause_budget": -1}, env={})


GPU_SHAPED_RANK = r"""
import os, sys, threading, time
rank, step = int(os.environ["RANK"]), float(sys.argv[1])
def metrics():  # rank 0 alone writes a metrics file twice a second
    while True:
        with open(sys.argv[2], "w") as f:
            f.write(f"t={time.time()}\n")
        time.sleep(0.5)
if rank == 0:
    threading.Thread(target=metrics, daemon=True).start()
print("up", flush=True)
while True:
    with open("/proc/self/stat", "rb") as f:  # the batch: 20 reads of 4 KiB
        for _ in range(20):
            f.seek(0)
            f.read(4096)
    if rank == 0:
        print("step", flush=True)
    end = time.monotonic() + step  # "the device works": a spin, no syscall
    while time.monotonic() < end:
        pass
"""


#: The job test_a_real_gpu_shaped_job_is_never_paused's ranks make (MASTER_* below).
JOB_ID = "master:10.7.7.8:29778/2"


def test_a_real_gpu_shaped_job_is_never_paused(tmp_path) -> None:
    """Real processes shaped like GPU ranks (a spinning main thread, no syscall
    for a 5 s step, a batch of reads per step, rank 0 writing a metrics file),
    a real agent with a py-spy shim that logs each command line, a real
    daemon: no ``--native`` in 30 s, no stall. The old rule (still 3 s: a
    native dump) would have paused each rank at every step."""
    import os
    import subprocess
    import sys

    from ncclwatch.agent.pyspy import PySpy, find_pyspy
    from ncclwatch.daemon.core import Daemon, DaemonConfig
    from ncclwatch.daemon.server import DaemonServer

    real = find_pyspy()
    assert real, "py-spy missing from the venv"
    calls, shim = tmp_path / "argv.log", tmp_path / "py-spy"
    shim.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\nexec {real} \"$@\"\n")
    shim.chmod(0o755)
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "10.7.7.8", "MASTER_PORT": "29778"}
    procs = [subprocess.Popen([sys.executable, "-c", "import torch.distributed\n"
                               + GPU_SHAPED_RANK, "5", str(tmp_path / "metrics.txt")],
                              env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, text=True,
                              start_new_session=True) for r in range(2)]
    pids = {p.pid for p in procs}
    still_max: list[float] = []

    async def go():
        daemon = Daemon(DaemonConfig(grpc="127.0.0.1:0", http="127.0.0.1:0"))
        server = DaemonServer(daemon)
        await server.start()
        agent = Agent(AgentConfig(collector=f"127.0.0.1:{server.grpc_port}", interval=1.0,
                                  node="gpu-shaped"),
                      gpu=NvmlGpuReader(), pyspy=PySpy(binary=str(shim)))
        task = asyncio.create_task(agent.run())
        try:
            for _ in range(30):
                await asyncio.sleep(1.0)
                now = time.monotonic()
                still_max.append(max((t.still_seconds(now) for pid, t in agent.trackers.items()
                                      if pid in pids), default=0.0))
        finally:
            agent.stop()
            await task
            await server.stop(grace=0.1)
        return agent, daemon

    try:
        for p in procs:
            assert p.stdout.readline().strip() == "up"
        agent, daemon = asyncio.run(go())
    finally:
        for p in procs:
            p.kill()
            p.wait()
    # This job's ranks only: another job on the machine (make test runs the scenario
    # matrix beside the unit tests) is watched by this agent too, and may stall.
    argv = calls.read_text().splitlines() if calls.exists() else []
    ours = [a for a in argv if a.split()[-1] in {str(p) for p in pids}]
    assert ours and not [a for a in ours if "--native" in a], argv
    assert max(still_max) >= 3.5, still_max  # still past the old 3 s rule, and yet unpaused
    assert not [key for key in daemon.incidents.active if key[0] == JOB_ID], \
        list(daemon.incidents.active)


def test_the_daemons_native_ask_marks_the_jobs_ranks_and_forces_no_dumps() -> None:
    from ncclwatch.v1 import collector_pb2 as pb

    agent = Agent(AgentConfig(collector="127.0.0.1:1", node="n"), gpu=NvmlGpuReader())
    mine, other = rank_tracker(1), rank_tracker(2)
    other.proc = RankProcess(pid=2, create_time=0.0, identity=RankIdentity(
        job_id="other", rank=0, local_rank=0, world_size=2, job_source="test",
        rank_source="env:RANK"), env={})
    agent.trackers = {1: mine, 2: other}
    agent._on_command(pb.Command(dump_stacks=pb.DumpStacksCommand(job_id="j", native=True)))
    assert mine.native_asked is not None and not mine.forced
    assert other.native_asked is None
    agent._on_command(pb.Command(dump_stacks=pb.DumpStacksCommand(job_id="j")))
    assert mine.forced and not other.forced
