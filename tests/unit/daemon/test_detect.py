"""Verdicts of the daemon over built reports: a table of scenarios."""

from __future__ import annotations

import pytest

from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.model import CollectiveOp, RankState, StallKind
from tests.harness.reports import BARRIER, checkpoint_job, report, sample, stack_pb

S, Op = RankState, CollectiveOp


def _daemon(**kw) -> Daemon:
    return Daemon(DaemonConfig(**kw))


def _stalls(d: Daemon, job: str = "job-1") -> dict[StallKind, list[int]]:
    return {k: [c.rank for c in inc.finding.culprits]
            for (j, k), inc in d.incidents.active.items() if j == job}


def _job(samples_spec, job="job-1", world=4, seq=1):
    return report([sample(job, r, world, st, op, seconds=secs)
                   for r, st, op, secs in samples_spec], seq=seq)


CASES = [
    # (name, [(rank, state, op, seconds in state)], expected {kind: culprits})
    ("rank 0 saving, others in barrier", [
        (0, S.SAVING, Op.NONE, 30), (1, S.COLLECTIVE, Op.BARRIER, 30),
        (2, S.COLLECTIVE, Op.BARRIER, 30), (3, S.COLLECTIVE, Op.BARRIER, 30)],
     {StallKind.CHECKPOINT_GATHER: [0]}),
    ("rank 0 gathering (no collective), others in the gather's all_gather", [
        (0, S.GATHERING_STATE_DICT, Op.NONE, 30), (1, S.GATHERING_STATE_DICT, Op.ALL_GATHER, 30),
        (2, S.GATHERING_STATE_DICT, Op.ALL_GATHER, 30), (3, S.GATHERING_STATE_DICT, Op.WAIT, 30)],
     {StallKind.CHECKPOINT_GATHER: [0]}),
    ("all ranks gathering inside all_gather: nobody is the culprit", [
        (r, S.GATHERING_STATE_DICT, Op.ALL_GATHER, 30) for r in range(4)], {}),
    ("rank 0 loading, others in broadcast", [
        (0, S.LOADING, Op.NONE, 30), (1, S.COLLECTIVE, Op.BROADCAST, 30),
        (2, S.COLLECTIVE, Op.BROADCAST, 30), (3, S.COLLECTIVE, Op.BROADCAST, 30)],
     {StallKind.CHECKPOINT_RESTORE: [0]}),
    ("fast save: others in barrier under the threshold", [
        (0, S.SAVING, Op.NONE, 2), (1, S.COLLECTIVE, Op.BARRIER, 2),
        (2, S.COLLECTIVE, Op.BARRIER, 2), (3, S.COLLECTIVE, Op.BARRIER, 2)], {}),
    ("healthy training", [(r, S.COMPUTE, Op.NONE, 100) for r in range(4)], {}),
    ("saving while nobody waits", [
        (0, S.SAVING, Op.NONE, 100), (1, S.COMPUTE, Op.NONE, 100),
        (2, S.COMPUTE, Op.NONE, 100), (3, S.COMPUTE, Op.NONE, 100)], {}),
    ("two ranks save, two wait", [
        (0, S.SAVING, Op.NONE, 30), (1, S.SAVING, Op.NONE, 30),
        (2, S.COLLECTIVE, Op.BARRIER, 30), (3, S.COLLECTIVE, Op.BARRIER, 30)],
     {StallKind.CHECKPOINT_GATHER: [0, 1]}),
]


CASES += [
    ("one rank in a long compute loop: collective_hang", [
        (0, S.COLLECTIVE, Op.ALL_REDUCE, 40), (1, S.COLLECTIVE, Op.ALL_REDUCE, 40),
        (2, S.COMPUTE, Op.NONE, 40), (3, S.COLLECTIVE, Op.ALL_REDUCE, 40)],
     {StallKind.COLLECTIVE_HANG: [2]}),
    ("short wait at start-up is no hang", [
        (0, S.COLLECTIVE, Op.ALL_REDUCE, 10), (1, S.COMPUTE, Op.NONE, 10),
        (2, S.COLLECTIVE, Op.ALL_REDUCE, 10), (3, S.COLLECTIVE, Op.ALL_REDUCE, 10)], {}),
    ("ranks in different collectives: desync, minority named", [
        (0, S.COLLECTIVE, Op.BARRIER, 40), (1, S.COLLECTIVE, Op.ALL_REDUCE, 40),
        (2, S.COLLECTIVE, Op.ALL_REDUCE, 40), (3, S.COLLECTIVE, Op.ALL_REDUCE, 40)],
     {StallKind.DESYNC: [0]}),
    ("a rank never reported while others wait: rank_lost, no culprit", [
        (0, S.COLLECTIVE, Op.BARRIER, 40), (1, S.COLLECTIVE, Op.BARRIER, 40),
        (2, S.COLLECTIVE, Op.BARRIER, 40)], {StallKind.RANK_LOST: []}),
    ("save with a rank elsewhere too: the checkpoint explains, no hang guessed", [
        (0, S.SAVING, Op.NONE, 40), (1, S.COLLECTIVE, Op.BARRIER, 40),
        (2, S.COLLECTIVE, Op.BARRIER, 40), (3, S.COLLECTIVE, Op.BARRIER, 40)],
     {StallKind.CHECKPOINT_GATHER: [0]}),
]


@pytest.mark.parametrize("name,spec,expected", CASES, ids=[c[0] for c in CASES])
def test_verdicts(name, spec, expected) -> None:
    d = _daemon(staleness=10)
    d.ingest(_job(spec), now=1000.0)
    d.tick(now=1000.0)
    # A rank missing from the job is judged only after a staleness period
    # (the daemon may have just restarted); complete jobs are judged at once.
    complete = len({r for r, *_ in spec}) == 4
    assert _stalls(d) == (expected if complete else {})
    if complete:
        return
    d.ingest(_job(spec, seq=2), now=1010.0)
    d.tick(now=1010.0)
    assert _stalls(d) == expected


def test_budget_counts_down_and_uses_the_job_timeout() -> None:
    d = _daemon(watchdog_timeout=600)
    d.ingest(checkpoint_job(wait_for=10, timeout=90), now=1000.0)
    d.tick(now=1000.0)
    b0 = d.budgets["job-1"]
    assert (b0.timeout, b0.source) == (90, "job")
    assert b0.remaining == pytest.approx(80, abs=0.01)
    # 15 s later the agent reports the same states, 15 s older.
    d.ingest(checkpoint_job(wait_for=25, save_for=35, timeout=90, seq=2), now=1015.0)
    d.tick(now=1015.0)
    assert d.budgets["job-1"].remaining == pytest.approx(65, abs=0.01)
    inc = d.incidents.active[("job-1", StallKind.CHECKPOINT_GATHER)]
    assert inc.min_remaining == pytest.approx(65, abs=0.01)
    assert inc.budget_at_detection.remaining == pytest.approx(80, abs=0.01)


def test_config_timeout_by_job_glob_and_default() -> None:
    d = _daemon(watchdog_timeout=600, job_timeouts={"job-*": 120})
    d.ingest(checkpoint_job(job="job-7"), now=10.0)
    d.ingest(checkpoint_job(job="other", agent="agent-b", node="node-b"), now=10.0)
    d.tick(now=10.0)
    assert (d.budgets["job-7"].timeout, d.budgets["job-7"].source) == (120, "config")
    assert (d.budgets["other"].timeout, d.budgets["other"].source) == (600, "default")


def test_stall_ends_when_the_save_ends() -> None:
    d = _daemon()
    d.ingest(checkpoint_job(), now=100.0)
    d.tick(now=100.0)
    assert _stalls(d) == {StallKind.CHECKPOINT_GATHER: [0]}
    d.ingest(_job([(r, S.COMPUTE, Op.NONE, 0.5) for r in range(4)], seq=2), now=102.0)
    d.tick(now=102.0)
    assert _stalls(d) == {}
    assert [i.kind for i in d.incidents.ended] == [StallKind.CHECKPOINT_GATHER]


def test_stale_agent_gives_no_verdict() -> None:
    """Never name a culprit from data the daemon can no longer trust."""
    d = _daemon(staleness=10)
    d.ingest(checkpoint_job(), now=100.0)
    d.tick(now=100.0)
    assert _stalls(d)
    d.tick(now=130.0)  # the agent went silent 30 s ago
    assert _stalls(d) == {}


def test_ranks_split_over_two_agents_give_the_same_verdict() -> None:
    d = _daemon()
    full = checkpoint_job().report
    a = report(list(full.samples[:2]), node="node-a", agent="agent-a", stacks=list(full.stacks))
    b = report(list(full.samples[2:]), node="node-b", agent="agent-b", stacks=list(full.stacks))
    d.ingest(a, now=50.0)
    d.ingest(b, now=50.0)
    d.tick(now=50.0)
    assert _stalls(d) == {StallKind.CHECKPOINT_GATHER: [0]}
    assert d.table.jobs["job-1"].nodes == {"node-a", "node-b"}


def test_missing_rank_in_a_full_round_is_gone_and_lost() -> None:
    d = _daemon()
    d.ingest(checkpoint_job(wait_for=40), now=10.0)
    d.ingest(report(list(checkpoint_job(wait_for=41).report.samples[1:]), seq=2), now=11.0)
    rec = d.table.jobs["job-1"].ranks[0]
    assert rec.gone_at == 11.0 and rec.state is S.UNKNOWN
    d.tick(now=11.0)
    # The saver vanished: the others' wait is rank_lost, with rank 0 unknown, not a culprit.
    assert _stalls(d) == {StallKind.RANK_LOST: []}
    inc = d.incidents.active[("job-1", StallKind.RANK_LOST)]
    assert inc.finding.unknown == (0,)


def test_unknown_stack_is_requested_back() -> None:
    d = _daemon()
    req = report([sample("j", 0, 1, S.COLLECTIVE, Op.BARRIER, stack="feedfacecafebeef")])
    assert list(d.ingest(req, now=1.0).missing_stack_ids) == ["feedfacecafebeef"]
    req2 = report([sample("j", 0, 1, S.COLLECTIVE, Op.BARRIER, stack=stack_pb(BARRIER).id)],
                  stacks=[stack_pb(BARRIER)], seq=2)
    assert list(d.ingest(req2, now=2.0).missing_stack_ids) == []


def test_resent_report_is_not_applied_twice() -> None:
    d = _daemon()
    d.ingest(checkpoint_job(seq=3, wait_for=20), now=10.0)
    resp = d.ingest(checkpoint_job(seq=3, wait_for=1), now=11.0)
    assert resp.ack_seq == 3 and d.table.duplicates_total == 1
    assert d.table.jobs["job-1"].ranks[1].since == 10.0 - 20


def test_seq_gaps_are_counted() -> None:
    d = _daemon()
    d.ingest(checkpoint_job(seq=1), now=1.0)
    d.ingest(checkpoint_job(seq=5), now=2.0)
    assert d.table.agents["agent-a"].gaps_total == 3


def test_suspicious_job_gets_a_stack_request() -> None:
    """A rank waiting past half the stall threshold: fresh stacks of every rank.
    A brief wait (healthy training lives in collectives) is not worth a round."""
    d = _daemon(stall_threshold=5)
    d.ingest(_job([(0, S.COMPUTE, Op.NONE, 1), (1, S.COLLECTIVE, Op.BARRIER, 1),
                   (2, S.COMPUTE, Op.NONE, 1), (3, S.COMPUTE, Op.NONE, 1)]), now=1.0)
    d.tick(now=1.0)
    resp = d.ingest(_job([(0, S.COMPUTE, Op.NONE, 2), (1, S.COLLECTIVE, Op.BARRIER, 2),
                          (2, S.COMPUTE, Op.NONE, 2), (3, S.COMPUTE, Op.NONE, 2)], seq=2),
                    now=2.0)
    assert list(resp.commands) == []            # waited 2 s: no round of dumps
    d.tick(now=2.0)
    resp = d.ingest(_job([(0, S.COMPUTE, Op.NONE, 3), (1, S.COLLECTIVE, Op.BARRIER, 3),
                          (2, S.COMPUTE, Op.NONE, 3), (3, S.COMPUTE, Op.NONE, 3)], seq=3),
                    now=3.0)
    d.tick(now=3.0)
    resp = d.ingest(_job([(0, S.COMPUTE, Op.NONE, 4), (1, S.COLLECTIVE, Op.BARRIER, 4),
                          (2, S.COMPUTE, Op.NONE, 4), (3, S.COMPUTE, Op.NONE, 4)], seq=4),
                    now=4.0)
    assert [c.dump_stacks.job_id for c in resp.commands] == ["job-1"]


def test_a_still_period_within_the_ranks_normal_asks_for_no_stacks() -> None:
    """GPU-shaped ranks sit still through every step, their stacks from before
    it (the agent looks past the rank's normal: policy.within_normal). The
    daemon asks for fresh stacks of a still rank with an old stack only
    past half the stall threshold *and* past the longest still period the
    rank ended normally, once it stepped (stillness.py, as the agent's looks);
    before that, at half the threshold."""
    d = _daemon(stall_threshold=5)
    now, seq = 0.0, 0

    def rnd(still: float) -> list:
        nonlocal now, seq
        now += 1.0
        seq += 1
        samples = [sample("job-1", r, 2, S.COMPUTE, seconds=now) for r in range(2)]
        for s in samples:
            s.still_seconds = still
            s.stack_age_seconds = still + 0.5  # taken before the still period
        resp = d.ingest(report(samples, seq=seq), now=now)
        d.tick(now=now)
        return [c for c in resp.commands if c.HasField("dump_stacks")
                and not c.dump_stacks.native]

    asked_first = [i for i in range(1, 9) if rnd(float(i))]
    assert asked_first and asked_first[0] <= 4  # no normal yet: half the threshold
    rnd(0.0)  # the step ended: an 8 s still period was normal...
    for _ in range(9):  # ...but the rank has not stepped yet (stillness.py):
        asked = [i for i in range(1, 9) if rnd(float(i))]  # start-up is no normal
        assert asked and asked[0] <= 4, asked
        rnd(0.0)
    # 10 rounds of progress over 80 s: it stepped, and 8 s still is its normal.
    for _ in range(5):  # steps of 8 s: still 1..8 s, then the next batch
        asked = [i for i in range(1, 9) if rnd(float(i))]
        assert asked == [], f"asked for stacks at {asked} s of a normal 8 s still period"
        rnd(0.0)
    asked = [i for i in range(1, 16) if rnd(float(i))]  # the step does not end
    assert asked and 9 <= asked[0] <= 10, asked


def test_after_a_restart_no_verdict_from_a_partial_picture() -> None:
    """A fresh daemon hears node-a (4 ranks waiting for 40 s) before node-b.

    It must not call the missing half lost, nor the waiters hung; once node-b
    reports (its rank 4 saving), the stall is named at once, with the full
    40 s already waited (durations come from the agents' clocks).
    """
    d = _daemon(staleness=10)
    full = checkpoint_job(world=8, wait_for=40, save_for=40).report
    by_rank = {s.identity.rank: s for s in full.samples}
    a = report([by_rank[r] for r in (1, 2, 3, 5)], node="node-a", agent="a",
               stacks=list(full.stacks))
    b = report([by_rank[r] for r in (0, 4, 6, 7)], node="node-b", agent="b",
               stacks=list(full.stacks))
    d.ingest(a, now=1000.0)
    d.tick(now=1000.0)
    d.ingest(a.__class__.FromString(a.SerializeToString()), now=1001.0)
    assert _stalls(d) == {}
    d.ingest(b, now=1001.5)
    d.tick(now=1001.5)
    assert _stalls(d) == {StallKind.CHECKPOINT_GATHER: [0]}
    inc = d.incidents.active[("job-1", StallKind.CHECKPOINT_GATHER)]
    assert inc.budget.remaining <= d.config.watchdog_timeout - 39


def test_ranks_that_never_report_become_unknown_after_the_staleness() -> None:
    d = _daemon(staleness=10)
    full = checkpoint_job(world=8, wait_for=40).report
    a = report([s for s in full.samples if s.identity.rank in (1, 2, 3)], stacks=list(full.stacks))
    d.ingest(a, now=1000.0)
    d.tick(now=1000.0)
    assert _stalls(d) == {}
    for i in range(1, 12):
        a.report.seq = i + 1
        d.ingest(a, now=1000.0 + i)
        d.tick(now=1000.0 + i)
    assert StallKind.RANK_LOST in _stalls(d)
    assert d.incidents.active[("job-1", StallKind.RANK_LOST)].finding.unknown == (0, 4, 5, 6, 7)


def test_a_culprit_seen_only_when_the_wait_began_is_not_named() -> None:
    """Rank 0's last stack (torch.save) was taken as the others entered the
    barrier 8 s ago; py-spy has not dumped it since. That is no evidence it
    still saves (a 70 ms save looks like this on an overloaded node)."""
    d = _daemon()
    req = checkpoint_job(save_for=8, wait_for=8)
    req.report.samples[0].stack_age_seconds = 8.0
    d.ingest(req, now=100.0)
    d.tick(now=100.0)
    assert _stalls(d) == {}
    fresh = checkpoint_job(save_for=9, wait_for=9, seq=2)
    fresh.report.samples[0].stack_age_seconds = 0.5  # dumped again: still in torch.save
    d.ingest(fresh, now=101.0)
    d.tick(now=101.0)
    assert _stalls(d) == {StallKind.CHECKPOINT_GATHER: [0]}
    # Once open, an incident does not flap while the next dump is on its way.
    later = checkpoint_job(save_for=12, wait_for=12, seq=3)
    later.report.samples[0].stack_age_seconds = 3.5
    d.ingest(later, now=104.0)
    d.tick(now=104.0)
    assert _stalls(d) == {StallKind.CHECKPOINT_GATHER: [0]}


def test_clock_skew_between_nodes_does_not_change_the_verdict() -> None:
    """Durations come from each agent's own clock (state_seconds) and the
    daemon's receive time: nodes whose wall and monotonic clocks disagree by
    hours give the verdict and budget of nodes in perfect agreement."""
    def run(skew: bool) -> tuple[dict, float]:
        d = _daemon()
        full = checkpoint_job(wait_for=20, save_for=20, timeout=90).report
        a = report(list(full.samples[:2]), node="node-a", agent="a", stacks=list(full.stacks))
        b = report(list(full.samples[2:]), node="node-b", agent="b", stacks=list(full.stacks))
        if skew:
            a.report.agent_wall_seconds, a.report.agent_monotonic_seconds = 2e9, 5.0
            b.report.agent_wall_seconds, b.report.agent_monotonic_seconds = 1e6, 9e6
        d.ingest(a, now=500.0)
        d.ingest(b, now=500.2)
        d.tick(now=500.2)
        inc = d.incidents.active[("job-1", StallKind.CHECKPOINT_GATHER)]
        return _stalls(d), inc.budget.remaining

    assert run(skew=True) == run(skew=False)
    assert run(skew=True)[0] == {StallKind.CHECKPOINT_GATHER: [0]}
