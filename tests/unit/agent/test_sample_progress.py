"""Progress, not CPU: the agent's signal that holds when waiting ranks spin.

A real process whose main thread blocks while another thread burns most of
a core must read as still (no progress) and not quiet; one that does work
must not. Then the tracker and the policy over such readings.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from ncclwatch.agent.discover import RankProcess
from ncclwatch.agent.policy import StackPolicy
from ncclwatch.agent.sample import ProcessSample, ProcessSampler
from ncclwatch.agent.tracker import RankTracker
from ncclwatch.jobid import RankIdentity
from ncclwatch.model import QUIET_CPU, CollectiveOp, RankState
from ncclwatch.signatures import Classification

SPINNER = """
import hashlib, sys, threading, time
buf = bytes(65536)
def burn():   # 60% of a core, GIL released, sleeping in between (its own switches)
    while True:
        end = time.monotonic() + 0.006
        while time.monotonic() < end:
            hashlib.sha256(buf).digest()
        time.sleep(0.004)
threading.Thread(target=burn, daemon=True).start()
print('ready', flush=True)
if sys.argv[1] == 'wait':
    threading.Event().wait()          # the main thread blocks, like a rank in a barrier
else:
    while True:                       # the main thread works: small writes, short sleeps
        sys.stderr.write('.'); sys.stderr.flush(); time.sleep(0.01)
"""


def _track(mode: str, rounds: int = 4) -> RankTracker:
    p = subprocess.Popen([sys.executable, "-c", SPINNER, mode], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        sampler = ProcessSampler()
        t = RankTracker(RankProcess(p.pid, 0.0, RankIdentity("j", "t", 0, 0, 2), {}), 0.0)
        for _ in range(rounds):
            s = sampler.sample(p.pid)
            assert s is not None
            t.observe_process(s, time.monotonic())
            time.sleep(1.0)
        return t
    finally:
        p.kill()
        p.wait()


def test_a_spinning_waiter_is_still_but_not_quiet() -> None:
    t = _track("wait")
    # burns CPU (its thread's share: 0.13 once with the matrix and two workers
    # beside it): the old, CPU-based signal is blind to the wait
    assert t.cpu_util > QUIET_CPU, t.cpu_util
    assert not t.quiet
    assert t.still, "no progress events expected from a blocked main thread"


def test_a_working_rank_is_neither() -> None:
    t = _track("work")
    assert not t.still and not t.quiet


def _tracker(events: int = 0) -> RankTracker:
    t = RankTracker(RankProcess(1, 0.0, RankIdentity("j", "t", 0, 0, 2), {}), 0.0)
    t.observe_process(_ps(0.0, events), 0.0)
    return t


def _ps(cpu: float, events: int, files=()) -> ProcessSample:
    return ProcessSample(1, cpu, 1, 0, 0, 1, files, progress_events=events)


AR = Classification(RankState.COLLECTIVE, CollectiveOp.ALL_REDUCE)


def test_a_new_wait_at_the_same_stack_gets_a_new_start() -> None:
    """Busy the whole time (CPU never quiet); progress tells the waits apart."""
    t = _tracker()
    t.observe_stack(Classification(RankState.COMPUTE), "c", 0.5)
    t.observe_process(_ps(0.9, 500), 1.0)
    t.observe_stack(AR, "ar", 1.1)
    assert t.state_since == 0.5
    t.observe_process(_ps(1.8, 1000), 2.0)          # progressed: stepped on
    t.observe_process(_ps(2.7, 1000), 3.0)          # then sat still from 2.0
    assert t.still and not t.quiet
    t.observe_stack(AR, "ar", 3.1)                 # the same line again: a new wait
    # ... that began in [1.0, 2.0] (it progressed in that interval, maybe only at
    # its start): the earliest, 1.0, even before the dump at 1.1 (which showed
    # all_reduce too, perhaps already the new one).
    assert t.still_from == 1.0 and t.state_since == 1.0
    t.observe_process(_ps(3.6, 1000), 4.0)
    t.observe_stack(AR, "ar", 4.1)                 # no progress since: the same wait
    assert t.state_since == 1.0 and t.repeats == 2


def test_policy_looks_again_when_progress_stops_and_not_while_it_goes_on() -> None:
    p = StackPolicy(suspect_interval=2, slow_interval=20)
    t = _tracker()
    t.observe_stack(AR, "ar", 0.0)
    for i in range(1, 6):                          # steps on: the all_reduce was passing
        t.observe_process(_ps(i * 0.9, i * 500), float(i))
    assert p.suspect_wait(t, 5.0) is None and p.due([t], 5.0) == []
    t.observe_process(_ps(5.9, 2500), 6.0)         # stops: still flips
    assert t.still and p.suspect_wait(t, 6.0) == 2.0 and p.due([t], 6.0) == [t]
    t.observe_stack(AR, "ar", 6.0)
    # Still and unchanged: looked at again, less and less often, down to the slow round.
    waits = []
    for now in range(7, 120):
        t.observe_process(_ps(now * 0.9, 2500), float(now))
        if p.due([t], float(now)):
            waits.append(now - t.stack_at)
            t.observe_stack(AR, "ar", float(now))
    assert waits[:2] == [2.0, 2.0] and max(waits) == 20.0
    assert waits == sorted(waits)


def test_policy_looks_at_a_rank_that_opens_a_file_for_writing() -> None:
    from ncclwatch.agent.sample import OpenFile
    p = StackPolicy(suspect_interval=2, slow_interval=20)
    t = _tracker()
    t.observe_stack(Classification(RankState.COMPUTE), "c", 0.0)
    t.observe_process(_ps(0.9, 500), 1.0)
    t.observe_process(_ps(1.8, 900, (OpenFile("/ckpt/step200.pt", 4096),)), 2.0)
    assert p.due([t], 2.5) == [t]
    t.observe_stack(Classification(RankState.SAVING), "s", 2.5)
    t.observe_process(_ps(2.7, 1400, (OpenFile("/ckpt/step200.pt", 8192),)), 3.0)
    assert p.suspect_wait(t, 3.0) == 2.0        # checkpoint work: looked at again


@pytest.mark.parametrize("field", ["read_count", "write_count"])
def test_progress_counts_syscalls(field, tmp_path) -> None:
    """progress_events moves with the rank's own read/write calls."""
    import os
    sampler = ProcessSampler()
    before = sampler.sample(os.getpid()).progress_events
    path = tmp_path / "f"
    with open(path, "wb", buffering=0) as f:
        for _ in range(50):
            f.write(b"x")
    with open(path, "rb", buffering=0) as f:
        while f.read(1):
            pass
    assert sampler.sample(os.getpid()).progress_events - before >= 100


def test_waiting_tensor_by_tensor_in_a_gather_keeps_its_start() -> None:
    """Inside a full state-dict gather a rank waits for each tensor in turn and
    progresses between them: one checkpoint stall, not many short waits."""
    g = Classification(RankState.GATHERING_STATE_DICT, CollectiveOp.ALL_GATHER)
    t = _tracker()
    t.observe_stack(Classification(RankState.COMPUTE), "c", 0.5)
    t.observe_stack(g, "g", 1.0)
    events = 0
    for now in range(2, 12):
        events += 300                                # a tensor arrives every second
        t.observe_process(_ps(now * 0.5, events), float(now))
        if now % 3 == 0:
            t.observe_stack(g, "g", now + 0.1)
    assert t.state_since == 0.5
