"""The adaptive hang threshold: the learner alone, then the daemon over built reports.

The reports carry the agent's ``still_seconds`` (how long a rank made no
progress) as a fast-stepping or a slow-waiting job produces them, round by
round, so the learner sees what it would see live.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ncclwatch.daemon.waits import WaitLearner, WaitPolicy
from ncclwatch.model import CollectiveOp, RankState, StallKind
from tests.harness.reports import FEED_JOB as JOB, FEED_WORLD as WORLD, Feed, report, sample

S, Op = RankState, CollectiveOp
POLICY = WaitPolicy(floor=6.0, ceiling=30.0, factor=2.0, slack=2.0, min_evidence=20, warmup=10.0,
                    min_op_evidence=2)


# -- the learner ----------------------------------------------------------------------


def _step(w: WaitLearner, t0: float, n: int, dt: float = 0.5, *ops: CollectiveOp) -> float:
    """n rounds in which ranks made progress (last seen in ``ops``)."""
    t = t0
    for _ in range(n):
        w.stepped(t)
        for op in ops:
            w.progressed(op, t)
        t += dt
    return t


def test_no_evidence_keeps_the_ceiling() -> None:
    w = WaitLearner()
    assert w.threshold(Op.ALL_REDUCE, POLICY, 0.0) == 30.0
    # Ranks made progress, but none was ever seen in a barrier: a first long
    # wait there (an evaluation, start-up) keeps the ceiling.
    t = _step(w, 0.0, 100, 0.5, Op.ALL_REDUCE)
    assert w.threshold(Op.BARRIER, POLICY, t) == 30.0
    # An op seen to end often, but the job has not stepped long enough:
    # start-up. Judged at fixed times around step_warmup (5 s after the first
    # progress), never at a float sum that may land on either side of it.
    w = WaitLearner()
    _step(w, 0.0, 80, 0.05, Op.ALL_REDUCE)          # 80 rounds over 3.95 s
    assert w.steps() == 80 >= POLICY.min_steps
    assert w.threshold(Op.ALL_REDUCE, POLICY, 4.0) == 30.0
    assert w.basis(Op.ALL_REDUCE, POLICY, 4.0) == "ceiling"
    assert w.threshold(Op.ALL_REDUCE, POLICY, POLICY.step_warmup - 1e-6) == 30.0
    # From step_warmup on, the same evidence is a stepping job's.
    assert w.threshold(Op.ALL_REDUCE, POLICY, POLICY.step_warmup) == POLICY.floor
    assert w.basis(Op.ALL_REDUCE, POLICY, POLICY.step_warmup) == "learned"
    # Fewer than min_steps step collectives seen: not stepping, however long.
    w = WaitLearner()
    _step(w, 0.0, POLICY.min_steps - 1, 1.0, Op.ALL_REDUCE)
    assert w.threshold(Op.ALL_REDUCE, POLICY, 15.0) == 30.0


def test_the_fallback_counts_only_where_the_judged_ranks_progressed() -> None:
    """No step collective ever caught (steps too fast to sample): rounds of
    progress over the warm-up make the job stepping only if the ranks judged
    made progress themselves; a busy late rank's rounds alone do not."""
    w = WaitLearner()
    _step(w, 0.0, 40, 1.0)                            # 40 rounds over 39 s, no op seen
    assert w.steps() == 0
    assert w.stepping(POLICY, 40.0)                   # views: any rank's rounds
    assert w.stepping(POLICY, 40.0, lambda: True)
    assert not w.stepping(POLICY, 40.0, lambda: False)
    assert w.threshold(Op.ALL_REDUCE, POLICY, 40.0, lambda: False) == 30.0
    assert w.basis(Op.ALL_REDUCE, POLICY, 40.0, lambda: False) == "ceiling"
    assert w.threshold(Op.ALL_REDUCE, POLICY, 40.0, lambda: True) == POLICY.floor
    # Steps seen to end decide alone: the waiters are not asked.
    w = WaitLearner()
    _step(w, 0.0, 10, 1.0, Op.ALL_REDUCE)

    def never() -> bool:
        raise AssertionError("asked")
    assert w.stepping(POLICY, 10.0, never)


def test_fast_steps_bring_the_threshold_to_the_floor_after_warmup() -> None:
    w = WaitLearner()
    t = _step(w, 100.0, 30, 0.3)                     # 30 rounds in 9 s, op never seen
    w.progressed(Op.ALL_REDUCE, t)
    w.progressed(Op.ALL_REDUCE, t)
    assert w.threshold(Op.ALL_REDUCE, POLICY, 108.9) == 30.0  # < warmup
    assert w.threshold(Op.ALL_REDUCE, POLICY, 110.0) == 6.0
    assert w.threshold(Op.BARRIER, POLICY, 110.0) == 30.0    # other ops learned nothing


def test_long_normal_waits_raise_the_threshold_of_their_op_only() -> None:
    w = WaitLearner()
    _step(w, 0.0, 40, 1.0, Op.ALL_REDUCE, Op.BARRIER)
    w.ended(Op.BARRIER, 5.0, 40.0)
    assert w.threshold(Op.BARRIER, POLICY, 41.0) == 12.0   # 2 x 5 + 2
    w.ended(Op.BARRIER, 21.0, 60.0)
    assert w.threshold(Op.BARRIER, POLICY, 61.0) == 30.0   # 2 x 21 + 2, capped
    assert w.threshold(Op.ALL_REDUCE, POLICY, 61.0) == 6.0
    assert w.current({Op.BARRIER, Op.ALL_REDUCE}, POLICY, 61.0) == 6.0
    view = w.view(POLICY, 61.0)
    assert view["barrier"]["longest_wait_seconds"] == 21.0 and view["barrier"]["learned"]


@settings(max_examples=200, deadline=None)
@given(waits=st.lists(st.floats(0, 1e4, allow_nan=False), max_size=80),
       progress=st.integers(0, 60), floor=st.floats(0.5, 20), span=st.floats(0, 40),
       later=st.floats(0, 1e4, allow_nan=False))
def test_threshold_stays_within_floor_and_ceiling(waits, progress, floor, span, later) -> None:
    policy = WaitPolicy(floor=floor, ceiling=floor + span)
    w = WaitLearner()
    _step(w, 0.0, progress, 1.0, Op.ALL_REDUCE)
    for x in waits:
        w.ended(Op.ALL_REDUCE, x, float(progress))
    now = float(progress) + later
    t = w.threshold(Op.ALL_REDUCE, policy, now)
    assert policy.floor <= t <= policy.ceiling
    if not w.warmed(Op.ALL_REDUCE, policy, now):
        assert t == policy.ceiling
    # Well outside every normal wait kept: a wait it calls a hang is longer than
    # any of them (unless capped at the ceiling).
    elif t < policy.ceiling:
        assert all(t > x for x in list(waits)[-64:])


@settings(max_examples=100, deadline=None)
@given(a=st.lists(st.floats(0, 100), min_size=1, max_size=30),
       extra=st.floats(0, 100))
def test_a_longer_normal_wait_never_lowers_the_threshold(a, extra) -> None:
    def learned(waits):
        w = WaitLearner()
        _step(w, 0.0, 30, 1.0, Op.BARRIER)
        for x in waits:
            w.ended(Op.BARRIER, x, 30.0)
        return w.threshold(Op.BARRIER, POLICY, 40.0)
    assert learned([*a, max(a) + extra]) >= learned(a)


# -- the daemon, fed rounds of reports (reports.Feed) -----------------------------------


def _train(f: Feed, seconds: int) -> None:
    """Fast steps: every rank progresses every round; its last stack (5 s old) an
    all_reduce it has since left."""
    for _ in range(seconds):
        f.round([(r, S.COLLECTIVE, Op.ALL_REDUCE, 0.2, 0.0) for r in range(WORLD)],
                stack_age=5.0)


def _hang_round(f: Feed, k: int, culprit_state=S.IDLE) -> None:
    """k s into a hang: ranks 0, 1 sit still in all_reduce; rank 2 is elsewhere."""
    f.round([(0, S.COLLECTIVE, Op.ALL_REDUCE, k, k), (1, S.COLLECTIVE, Op.ALL_REDUCE, k, k),
             (2, culprit_state, Op.NONE, k, k)])


def test_a_hang_in_a_fast_stepping_job_is_flagged_at_the_learned_threshold() -> None:
    f = Feed()
    _train(f, 20)
    job = f.d.table.jobs[JOB]
    assert f.d.hang_threshold_of(job, f.t) == 5.0
    flagged = None
    for k in range(1, 31):
        _hang_round(f, k)
        if f.stalls():
            flagged = k
            break
    assert flagged is not None and flagged <= 8, flagged
    assert f.stalls() == {StallKind.COLLECTIVE_HANG: [2]}


def test_without_learning_the_same_hang_waits_for_the_ceiling() -> None:
    f = Feed()
    ks = []
    for k in range(1, 35):
        _hang_round(f, k)
        if f.stalls():
            ks.append(k)
    assert ks and ks[0] >= 30


def test_an_agent_without_progress_readings_is_judged_at_the_ceiling() -> None:
    f = Feed()
    _train(f, 20)
    f.round([(r, S.COMPUTE, Op.NONE, 0.1, 0.0) for r in range(WORLD)])
    for k in range(1, 35):
        spec = [(0, S.COLLECTIVE, Op.ALL_REDUCE, k), (1, S.COLLECTIVE, Op.ALL_REDUCE, k),
                (2, S.IDLE, Op.NONE, k)]
        f.seq += 1
        samples = [sample(JOB, r, WORLD, st_, op, seconds=s) for r, st_, op, s in spec]
        for s in samples:
            s.stack_age_seconds = 0.5
        f.d.ingest(report(samples, seq=f.seq), now=f.t)
        f.d.tick(now=f.t)
        f.t += 1
        if f.stalls():
            break
    assert k >= 30


def test_long_healthy_waits_in_a_barrier_stay_silent_and_are_learned() -> None:
    """Rank 0 evaluates 20 s every so often; the others wait in a barrier."""
    f = Feed()
    for _ in range(2):
        _train(f, 15)
        for k in range(1, 21):
            f.round([(0, S.COMPUTE, Op.NONE, k, 0.0), (1, S.COLLECTIVE, Op.BARRIER, k, k),
                     (2, S.COLLECTIVE, Op.BARRIER, k, k)])
            assert f.stalls() == {}, k
    job = f.d.table.jobs[JOB]
    assert job.waits.ops[Op.BARRIER].longest >= 20
    assert f.d.detect_cfg.waits.ceiling == 30.0
    assert job.waits.threshold(Op.BARRIER, f.d.detect_cfg.waits, f.t) == 30.0
    assert job.waits.threshold(Op.ALL_REDUCE, f.d.detect_cfg.waits, f.t) == 5.0


def test_progress_in_the_round_a_wait_was_seen_is_no_evidence() -> None:
    """A rank dumped in all_reduce in the round it made progress may have
    stepped *into* the wait: that does not say all_reduce waits are short."""
    f = Feed()
    for _ in range(30):
        f.round([(r, S.COLLECTIVE, Op.ALL_REDUCE, 0.2, 0.0) for r in range(WORLD)],
                stack_age=0.3)
    job = f.d.table.jobs[JOB]
    assert job.waits.ops.get(Op.ALL_REDUCE) is None or job.waits.ops[Op.ALL_REDUCE].evidence == 0
    assert f.d.hang_threshold_of(job, f.t) == 30.0


def test_a_new_wait_at_the_same_line_restarts_the_clock() -> None:
    """The agent re-anchors a wait it saw the rank progress out of (same state,
    later start on its clock): the daemon takes the new start, not jitter."""
    f = Feed()
    f.round([(0, S.COLLECTIVE, Op.ALL_REDUCE, 0.5, 0.0)])
    rec = f.d.table.jobs[JOB].ranks[0]
    first = rec.since
    f.round([(0, S.COLLECTIVE, Op.ALL_REDUCE, 1.3, 0.0)])   # same wait, 0.2 s of jitter
    assert rec.since == first
    f.round([(0, S.COLLECTIVE, Op.ALL_REDUCE, 0.4, 0.0)])   # a new one
    assert rec.since == f.t - 1.0 - 0.4


def test_ranks_that_went_still_since_their_last_stack_get_fresh_stacks() -> None:
    """The daemon's picture of ranks 1-2 is a compute stack from before they
    sat down; they have made no progress for 3 s: ask for the job's stacks,
    once. A stack taken during the stillness settles it."""
    f = Feed()
    f.round([(0, S.SAVING, Op.NONE, 1, 0.0), (1, S.COMPUTE, Op.NONE, 20, 1.0),
             (2, S.COMPUTE, Op.NONE, 20, 1.0)], stack_age=10)
    agent = f.d.table.agents["agent-a"]
    assert not agent.commands
    f.round([(0, S.SAVING, Op.NONE, 2, 0.0), (1, S.COMPUTE, Op.NONE, 21, 3.0),
             (2, S.COMPUTE, Op.NONE, 21, 3.0)], stack_age=11)
    # Rank 0 in checkpoint work beside them: the shape of a stall, so their
    # agents may pause them for native stacks too (issue 26).
    assert [(c.dump_stacks.job_id, c.dump_stacks.native) for c in agent.commands] == [
        (JOB, False), (JOB, True)]
    # Dumped meanwhile (barrier, during the stillness): the verdict follows.
    for k in range(4, 12):
        f.round([(0, S.SAVING, Op.NONE, k, 0.0), (1, S.COLLECTIVE, Op.BARRIER, k, k),
                 (2, S.COLLECTIVE, Op.BARRIER, k, k)], stack_age=0.5)
    assert f.stalls() == {StallKind.CHECKPOINT_GATHER: [0]}
    # Healthy training (progress every round) never asks.
    g = Feed()
    _train(g, 30)
    assert not g.d.table.agents["agent-a"].commands


def test_the_api_and_metrics_show_the_learned_threshold(monkeypatch) -> None:
    from prometheus_client.core import CollectorRegistry

    from ncclwatch.daemon.api import jobs_view
    from ncclwatch.daemon.export import DaemonCollector

    f = Feed()
    _train(f, 20)
    view = next(j for j in jobs_view(f.d, now=f.t)["jobs"] if j["job"] == JOB)
    ht = view["hang_threshold"]
    assert ht["seconds"] == 5.0 and ht["ceiling_seconds"] == 30.0 and ht["floor_seconds"] == 5.0
    assert ht["by_op"]["all_reduce"]["learned"]
    # Scraped at the feed's clock: a machine booted minutes ago has a monotonic
    # clock below the feed's (the test failed there).
    monkeypatch.setattr("ncclwatch.daemon.export.time.monotonic", lambda: f.t)
    reg = CollectorRegistry()
    reg.register(DaemonCollector(f.d))
    assert reg.get_sample_value("ncclwatch_hang_threshold_seconds", {"job_id": JOB}) == 5.0


def test_a_still_rank_whose_stack_predates_its_stillness_is_not_placed_in_the_op() -> None:
    """Last seen in all_reduce while it stepped on; then it went still, but
    no stack since says where (it may sleep elsewhere): no learned verdict."""
    f = Feed()
    _train(f, 20)
    for k in range(1, 40):  # past the ceiling too: the stale all_reduce is no wait
        f.round([(0, S.COLLECTIVE, Op.ALL_REDUCE, k + 5, k),
                 (1, S.COLLECTIVE, Op.ALL_REDUCE, k + 5, k),
                 (2, S.IDLE, Op.NONE, k, k)], stack_age=k + 1)
        assert f.stalls() == {}, k
    assert f.d.table.jobs[JOB].ranks[0].still_at is None


def test_a_step_collective_never_sighted_takes_the_jobs_still_periods() -> None:
    """Stacks are samples: a fast job's all_reduce may never be caught. Once
    the job steps, a step collective is presumed as short as the job's still
    periods; a sync point (barrier) keeps the ceiling until it is seen."""
    w = WaitLearner()
    t = _step(w, 0.0, 40, 0.5)                       # 20 s of progress, no op sighted
    assert w.threshold(Op.ALL_REDUCE, POLICY, t) == 6.0
    assert w.threshold(Op.WAIT, POLICY, t) == 6.0     # NCCL: CPU side at a device sync
    assert w.threshold(Op.BARRIER, POLICY, t) == 30.0
    w.still_ended(9.0)                               # some rank sat still 9 s once
    assert w.threshold(Op.ALL_REDUCE, POLICY, t) == 20.0
    w.still_ended(20.0)                              # a 20 s evaluation
    assert w.threshold(Op.ALL_REDUCE, POLICY, t) == 30.0
    # Start-up: the same before the job has stepped long enough.
    young = WaitLearner()
    t = _step(young, 0.0, 40, 0.2)                    # 8 s
    assert young.threshold(Op.ALL_REDUCE, POLICY, t) == 30.0


def test_a_busy_late_rank_at_start_up_does_not_make_the_job_stepping() -> None:
    """From the start, ranks 0, 1 sit still in all_reduce while rank 2 reads
    and computes (progress every round, no step collective): its own rounds
    are no steps of the job, and the ceiling holds, said as such."""
    f = Feed()
    k_found = None
    for k in range(1, 40):
        f.round([(0, S.COLLECTIVE, Op.ALL_REDUCE, k, k), (1, S.COLLECTIVE, Op.ALL_REDUCE, k, k),
                 (2, S.COMPUTE, Op.NONE, k, 0.0)])
        if f.stalls():
            k_found = k
            break
    job = f.d.table.jobs[JOB]
    assert job.waits.rounds >= POLICY.min_evidence and job.waits.steps() == 0
    assert k_found is not None and k_found >= 30, k_found
    (inc,) = [i for (j, _k), i in f.d.incidents.active.items() if j == JOB]
    assert inc.finding.threshold_basis == "ceiling"
    assert "before the job's first step" in inc.finding.summary


def test_fast_steps_no_stack_catches_in_a_collective_still_learn() -> None:
    """Steps too fast for any stack to catch a rank in its all_reduce (every
    last stack reads compute): the fallback, the waiters' own rounds of
    progress among them, still makes the job stepping, and a hang is flagged
    well before the ceiling."""
    f = Feed()
    for _ in range(25):
        f.round([(r, S.COMPUTE, Op.NONE, 0.2, 0.0) for r in range(WORLD)], stack_age=5.0)
    job = f.d.table.jobs[JOB]
    assert job.waits.steps() == 0
    for k in range(1, 31):
        _hang_round(f, k)
        if f.stalls():
            break
    assert f.stalls() == {StallKind.COLLECTIVE_HANG: [2]} and k <= 10, k
