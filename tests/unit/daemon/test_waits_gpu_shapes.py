"""GPU-shaped healthy jobs are no hang (issue 26), and the real stalls are still found.

GPU ranks sit still through every step: the main thread spins in a
synchronize, with no read/write calls and no voluntary switches, for 1-30 s
or more. The daemon is fed round by round (1 s rounds) with the readings such
a job gives (``still_seconds`` per rank, stacks reading compute, as NCCL's
waits read) and must stay silent while the job steps; the same job with a
rank that stops joining must still be called a hang.
"""

from __future__ import annotations

from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.model import CollectiveOp, RankState, StallKind
from tests.harness.reports import report, sample

S, Op = RankState, CollectiveOp
JOB, WORLD = "gpu-job", 3
SPIN, LOG, DATA = "spin-stack", "log-stack", "dataloader-stack"


class Feed:
    """Rounds from one agent at 1 s: per rank (state, stack, still_seconds)."""

    def __init__(self) -> None:
        self.d = Daemon(DaemonConfig())
        self.seq, self.t = 0, 1000.0
        self.alarms: list[tuple[float, StallKind, tuple[int, ...]]] = []

    def round(self, spec: dict[int, tuple[S, str, float]]) -> None:
        self.seq += 1
        samples = []
        for r, (state, stack, still) in spec.items():
            s = sample(JOB, r, WORLD, state, seconds=60.0, stack=stack)
            s.stack_age_seconds = 0.5
            s.still_seconds = still
            s.process.cpu_utilization = 1.0  # spinning, at work or not
            samples.append(s)
        self.d.ingest(report(samples, seq=self.seq), now=self.t)
        self.d.tick(now=self.t)
        for (job, kind), inc in self.d.incidents.active.items():
            if job == JOB:
                self.alarms.append((self.t, kind, tuple(c.rank for c in inc.finding.culprits)))
        self.t += 1.0


def _steps(f: Feed, step: int, n: int, rank0: tuple[S, str] | None = None) -> None:
    """``n`` steps of ``step`` s: every rank still for the step, then a round of
    progress (the next batch); with ``rank0``, rank 0 at work every round
    (logging, a metrics file) at that state and stack."""
    for _ in range(n):
        for k in range(step):
            still = float(k)  # 0 in the step's first round: the batch's reads
            spec = {r: (S.COMPUTE, SPIN, still) for r in range(WORLD)}
            if rank0 is not None:
                spec[0] = (*rank0, 0.0)
            f.round(spec)


def test_every_rank_equally_still_is_a_long_step_not_a_hang() -> None:
    for step in (8, 30, 45):
        f = Feed()
        _steps(f, step, 6)
        assert f.alarms == [], (step, f.alarms[:3])


def test_rank0_at_work_in_the_step_the_others_spin_through_is_no_hang() -> None:
    # Rank 0 logs and writes a metrics file (progress every round) on the same
    # frames the others spin on: 40 s steps, past the 30 s hang ceiling.
    f = Feed()
    _steps(f, 40, 4, rank0=(S.COMPUTE, SPIN))
    assert f.alarms == [], f.alarms[:3]


def test_rank0_at_work_elsewhere_while_the_others_sit_a_normal_step_is_no_hang() -> None:
    # Rank 0's last stack is its logging (another frame); the others' steps of
    # 28-40 s are their normal: once they have shown it, a 40 s step is none.
    f = Feed()
    _steps(f, 28, 3, rank0=(S.COMPUTE, SPIN))
    _steps(f, 40, 4, rank0=(S.COMPUTE, LOG))
    assert f.alarms == [], f.alarms[:3]


def test_a_rank_that_stops_joining_is_still_found_past_the_normal() -> None:
    # 8 s steps, then rank 1 reads a slow data pipeline (progress, another
    # frame) while ranks 0 and 2 wait for it, still: past their normal (2 x 8 s
    # + 2 s) and the ceiling (30 s), a provisional collective_hang naming rank 1.
    # (Once they have stepped: 10 rounds of progress, over 20 s at least.)
    f = Feed()
    _steps(f, 8, 10)
    start = f.t
    for k in range(60):
        f.round({0: (S.COMPUTE, SPIN, float(k + 1)), 1: (S.DATALOADER, DATA, 0.0),
                 2: (S.COMPUTE, SPIN, float(k + 1))})
        if f.alarms:
            break
    assert f.alarms, "the hang was never found"
    at, kind, culprits = f.alarms[0]
    assert kind is StallKind.COLLECTIVE_HANG and culprits == (1,)
    assert 29.0 <= at - start <= 33.0, at - start
    # Long normal steps (30 s) push the shape's bar to 2 x 30 + 2 s, no further.
    g = Feed()
    _steps(g, 30, 10)
    start = g.t
    for k in range(90):
        g.round({0: (S.COMPUTE, SPIN, float(k + 1)), 1: (S.DATALOADER, DATA, 0.0),
                 2: (S.COMPUTE, SPIN, float(k + 1))})
        if g.alarms:
            break
    assert g.alarms and g.alarms[0][2] == (1,)
    assert 60.0 <= g.alarms[0][0] - start <= 64.0, g.alarms[0][0] - start


def _native_asks(f: Feed) -> int:
    agent = f.d.table.agents["agent-a"]
    return sum(1 for c in agent.commands if c.HasField("dump_stacks") and c.dump_stacks.native)


def test_the_daemon_lets_agents_pause_only_beside_checkpoint_work() -> None:
    # Long still steps, rank 0 logging: never an ask to pause anyone.
    f = Feed()
    asks = []
    for _ in range(3):
        for k in range(30):
            f.round({0: (S.COMPUTE, LOG, 0.0), 1: (S.COMPUTE, SPIN, float(k)),
                     2: (S.COMPUTE, SPIN, float(k))})
            asks.append(_native_asks(f))  # commands leave with each report's answer
    assert sum(asks) == 0
    # Rank 0 saves while the others sit still: the shape of a stall. Asked once
    # they have sat still for half the stall threshold, then every 2 s at most.
    asks = []
    for k in range(10):
        f.round({0: (S.SAVING, "save-stack", 0.0), 1: (S.COMPUTE, SPIN, float(k)),
                 2: (S.COMPUTE, SPIN, float(k))})
        asks.append(_native_asks(f))
    assert asks == [0, 0, 0, 1, 0, 1, 0, 1, 0, 1], asks


def test_ranks_fed_through_shared_memory_are_still_for_ever_and_no_hang() -> None:
    """Batches from shared memory or an mmap: after its start-up a rank makes
    no read/write call, so it sits still through every step, for the life of
    the job; rank 0 logs (at work, its last stack elsewhere). Its stillness
    says nothing: no hang, however long (CI's gpu-shaped-healthy-8s-mmap row
    was called a collective_hang naming rank 0 at 54 s)."""
    f = Feed()
    for _ in range(6):  # start-up: imports, rendezvous (progress every round)
        f.round({r: (S.COMPUTE, SPIN, 0.0) for r in range(WORLD)})
    for k in range(600):
        f.round({0: (S.COMPUTE, LOG if k % 7 else SPIN, 0.0),
                 1: (S.COMPUTE, SPIN, float(k + 1)), 2: (S.COMPUTE, SPIN, float(k + 1))})
    assert f.alarms == [], f.alarms[:3]


def test_a_rank_seen_stepping_only_briefly_is_not_yet_evidence() -> None:
    # 9 rounds of progress over 8 s, then still 60 s beside a rank at work: not
    # enough history to call the stillness a wait. One more round over 20 s is.
    f = Feed()
    for _ in range(9):
        f.round({r: (S.COMPUTE, SPIN, 0.0) for r in range(WORLD)})
    for k in range(60):
        f.round({0: (S.COMPUTE, SPIN, float(k + 1)), 1: (S.DATALOADER, DATA, 0.0),
                 2: (S.COMPUTE, SPIN, float(k + 1))})
    assert f.alarms == [], f.alarms[:3]
    # The 10th, 69 s after the first; the 60 s still period it ends is normal
    # now, so the shape counts past 2 x 61 + 2 s.
    f.round({r: (S.COMPUTE, SPIN, 0.0) for r in range(WORLD)})
    for k in range(140):
        f.round({0: (S.COMPUTE, SPIN, float(k + 1)), 1: (S.DATALOADER, DATA, 0.0),
                 2: (S.COMPUTE, SPIN, float(k + 1))})
    assert f.alarms and f.alarms[0][1:] == (StallKind.COLLECTIVE_HANG, (1,)), f.alarms[:3]


def test_every_rank_still_asks_for_native_stacks_only_past_their_normal() -> None:
    """shape.halted: ranks that stepped fast (no still period of their own)
    and then all sit still are asked for native stacks at half the stall
    threshold; ranks all still through every healthy 30 s step, with nobody
    logging, never are (each still period is within their normal)."""
    f = Feed()
    for _ in range(30):  # fast steps: progress every round
        f.round({r: (S.COMPUTE, SPIN, 0.0) for r in range(WORLD)})
    asks = []
    for k in range(6):
        f.round({r: (S.COMPUTE, SPIN, float(k + 1)) for r in range(WORLD)})
        asks.append(_native_asks(f))
    assert sum(asks) >= 1 and asks.index(1) <= 3, asks
    g = Feed()
    for _ in range(12):  # 30 s steps, every rank still through each (no logger)
        for k in range(30):
            g.round({r: (S.COMPUTE, SPIN, float(k)) for r in range(WORLD)})
    quiet = []
    for _ in range(3):
        for k in range(30):
            g.round({r: (S.COMPUTE, SPIN, float(k)) for r in range(WORLD)})
            quiet.append(_native_asks(g))
    assert sum(quiet) == 0, quiet
    assert g.alarms == []
