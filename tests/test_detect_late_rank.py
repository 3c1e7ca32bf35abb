"""A late rank found by what its peers do, and a hang with no culprit rank.

Rounds of reports as the agent sends them (tests/test_waits.Feed: one agent,
1 s rounds, ``still_seconds`` per rank), through the real daemon: its
learner, its detectors, its diagnosis.
"""

from __future__ import annotations

import pytest

from ncclwatch.model import CollectiveOp, RankState, StallKind
from tests.factories import report, sample
from tests.test_waits import JOB, WORLD, Feed

S, Op = RankState, CollectiveOp


def _round(f: Feed, spec, cpu: dict[int, float] | None = None) -> None:
    """spec: [(rank, state, op, state_seconds, still_seconds)]; ``cpu``: share of a core."""
    f.seq += 1
    samples = []
    for r, state, op, secs, still in spec:
        s = sample(JOB, r, WORLD, state, op, seconds=secs, stack=f"s{r}{state.value}{op.value}")
        s.stack_age_seconds = 0.5
        s.still_seconds = still
        s.process.cpu_utilization = (cpu or {}).get(r, 0.0)
        samples.append(s)
    f.d.ingest(report(samples, seq=f.seq), now=f.t)
    f.d.tick(now=f.t)
    f.t += 1.0


def _steps(f: Feed, seconds: int) -> None:
    """A few seconds of steps: every rank progresses each round, its last stack
    (taken before the progress) an all_reduce it has since left."""
    for _ in range(seconds):
        f.round([(r, S.COLLECTIVE, Op.ALL_REDUCE, 0.2, 0.0) for r in range(WORLD)],
                stack_age=5.0)


def _findings(f: Feed):
    return [inc.finding for (j, _k), inc in f.d.incidents.active.items() if j == JOB]


def _late(f: Feed, state: RankState, busy: bool, limit: int = 40) -> int | None:
    """Ranks 0, 1 sit still in all_reduce; rank 2 is in ``state``, busy or not."""
    for k in range(1, limit):
        _round(f, [(0, S.COLLECTIVE, Op.ALL_REDUCE, k, k), (1, S.COLLECTIVE, Op.ALL_REDUCE, k, k),
                   (2, state, Op.NONE, k, 0.0 if busy else k)], cpu={2: 1.0 if busy else 0.0})
        if _findings(f):
            return k
    return None


@pytest.mark.parametrize("state, busy, doing", [
    (S.COMPUTE, True, "CPU busy (100% of a core), making progress"),
    (S.IDLE, False, "no CPU (asleep or blocked in a call), no progress"),
    (S.DATALOADER, True, "CPU busy"),
])
def test_a_late_rank_is_named_at_the_learned_threshold_after_a_few_steps(
        state, busy, doing) -> None:
    f = Feed()
    _steps(f, 8)  # a few steps, far short of the old 20 s warm-up
    k = _late(f, state, busy)
    assert k is not None and k <= 8, k
    (fd,) = _findings(f)
    assert fd.kind is StallKind.COLLECTIVE_HANG and [c.rank for c in fd.culprits] == [2]
    assert fd.threshold_basis == "learned" and fd.threshold_seconds <= 8
    assert "never joined" in fd.summary and f"rank 2: {doing}" in fd.summary
    assert "(learned)" in fd.summary


def test_before_the_first_step_the_ceiling_holds_and_the_finding_says_so() -> None:
    f = Feed()
    k = _late(f, S.IDLE, False)
    assert k is not None and k >= 30, k
    (fd,) = _findings(f)
    assert fd.threshold_basis == "ceiling" and fd.threshold_seconds == 30.0
    assert "before the job's first step: the fixed 30s ceiling" in fd.summary


def test_a_recurring_rank0_evaluation_stays_silent() -> None:
    """Rank 0 evaluates 20 s every few steps while the others wait in a barrier:
    the first one under the ceiling (a barrier never seen), later ones learned."""
    f = Feed()
    for _ in range(3):
        _steps(f, 8)
        for k in range(1, 21):
            _round(f, [(0, S.COMPUTE, Op.NONE, k, 0.0), (1, S.COLLECTIVE, Op.BARRIER, k, k),
                       (2, S.COLLECTIVE, Op.BARRIER, k, k)], cpu={0: 1.0})
            assert not _findings(f), k
    job = f.d.table.jobs[JOB]
    assert job.waits.basis(Op.BARRIER, f.d.detect_cfg.waits, f.t) == "learned"


def test_every_rank_stuck_in_one_collective_is_a_hang_with_no_culprit() -> None:
    f = Feed()
    _steps(f, 25)  # each rank warm (stillness.WARMUP): judged by its own normal
    k = None
    for k in range(1, 40):
        _round(f, [(r, S.COLLECTIVE, Op.ALL_REDUCE, k, k) for r in range(WORLD)])
        if _findings(f):
            break
    (fd,) = _findings(f)
    assert k <= 8, k
    assert fd.kind is StallKind.COLLECTIVE_HANG and fd.culprits == ()
    assert fd.waiting == (0, 1, 2)
    assert "every rank waits in all_reduce" in fd.summary
    assert "no culprit rank (a peer outside the job, the network, or a device)" in fd.summary
    inc = f.d.incidents.active[(JOB, StallKind.COLLECTIVE_HANG)]
    assert inc.diagnosis.root_cause.id == "all_ranks_in_collective"


def test_every_rank_briefly_in_one_barrier_is_normal() -> None:
    f = Feed()
    for _ in range(4):
        _steps(f, 8)
        for k in range(1, 4):  # a short barrier each "epoch", every rank in it
            _round(f, [(r, S.COLLECTIVE, Op.BARRIER, k, k) for r in range(WORLD)])
    assert not _findings(f)


def test_gpu_shaped_long_steps_with_every_rank_still_stay_silent() -> None:
    """Every rank still through each 8 s step (spinning in a device sync): the
    step's own length, learned, is no hang, whoever is where."""
    f = Feed()
    _steps(f, 8)
    for _ in range(8):
        for k in range(1, 9):
            _round(f, [(r, S.COLLECTIVE, Op.ALL_REDUCE, k, k) for r in range(WORLD)])
            assert not _findings(f), k
        _round(f, [(r, S.COMPUTE, Op.NONE, 0.2, 0.0) for r in range(WORLD)])
