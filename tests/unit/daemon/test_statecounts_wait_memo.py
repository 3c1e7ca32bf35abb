"""A stall's walks over its waiting ranks are kept from tick to tick while no
waiting rank's record changed (statecounts.wait_stamp), and made anew when one
did: the waiters' list (detect.fresh_waiting) and the budget's earliest wait
(budget.budget). Each kept answer is held to the walk it replaces.

A 4-rank job from two agents: rank 0 saves (its record changes every round,
as a culprit's does), ranks 1-3 wait in barrier and send briefs.
"""

from __future__ import annotations

from ncclwatch.daemon.budget import budget
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.detect import fresh_waiting
from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.reports import sample

S, Op = RankState, CollectiveOp
JOB, WORLD = "job-m", 4
AGENTS = {"agent-a": ("node-a", (0, 1)), "agent-b": ("node-b", (2, 3))}


class Feed:
    def __init__(self) -> None:
        self.d = Daemon(DaemonConfig(stall_threshold=1.0))
        self.t = 1000.0
        self.seq = dict.fromkeys(AGENTS, 0)

    def send(self, agent: str, *, samples=(), briefs=None, full: bool = False,
             clock: float | None = None) -> None:
        self.seq[agent] += 1
        seq = self.seq[agent]
        rep = pb.NodeReport(node=AGENTS[agent][0], agent_id=agent, seq=seq,
                            agent_monotonic_seconds=100.0 + seq if clock is None else clock,
                            interval_seconds=1.0, full_round=full, samples=list(samples),
                            slots_reset=seq == 1)
        if briefs:
            rep.briefs.CopyFrom(pb.RankBriefs(
                slot=[r + 1 for r, _ in briefs], still_seconds=[s for _, s in briefs],
                cpu_utilization=[0.0] * len(briefs), cpu_seconds=[1.0] * len(briefs)))
        self.d.ingest(pb.ReportRequest(protocol_version=2, report=rep), now=self.t)

    def full(self, agent: str, ranks, state: RankState, op: CollectiveOp = Op.NONE, *,
             seconds: float = 5.0, still: float = 0.0, clock: float | None = None) -> None:
        out = []
        for r in ranks:
            s = sample(JOB, r, WORLD, state, op, seconds=seconds, stack=f"s-{state.value}")
            s.slot, s.stack_age_seconds, s.still_seconds = r + 1, 0.2, still
            out.append(s)
        self.send(agent, samples=out, clock=clock)

    @property
    def job(self):
        return self.d.table.jobs[JOB]


def stalled() -> Feed:
    f = Feed()
    f.full("agent-a", (0,), S.SAVING)
    f.full("agent-a", (1,), S.COLLECTIVE, Op.BARRIER, still=4.0)
    f.full("agent-b", (2, 3), S.COLLECTIVE, Op.BARRIER, still=4.0)
    f.t += 1.0
    f.d.tick(now=f.t)
    return f


def walked(f: Feed, now: float):
    """The walks the kept answers replace, as they were written."""
    job, agents = f.job, f.d.table.fresh_agents(now)
    waiting = {rec.rank for r in job.waiting
               if (rec := job.ranks[r]).gone_at is None and rec.agent_id in agents}
    live = [rec for r in job.waiting if (rec := job.ranks[r]).gone_at is None]
    first = min(rec.since for rec in live)
    worst = next(rec.rank for rec in live if now - rec.since == now - first)
    return waiting, (worst, now - first)


def test_nothing_changed_among_the_waiters_reuses_their_walks() -> None:
    f = stalled()
    job, table = f.job, f.d.table
    before = fresh_waiting(job, table, f.t)
    kept_budget = job.budget_memo
    assert {rec.rank for rec in before} == {1, 2, 3}
    # A round: the culprit's record changes, the waiters send briefs (still on).
    f.t += 1.0
    f.full("agent-a", (0,), S.SAVING, seconds=6.0)
    f.send("agent-a", briefs=[(1, 5.0)])
    f.send("agent-b", briefs=[(2, 5.0), (3, 5.0)])
    f.d.tick(now=f.t)
    after = fresh_waiting(job, table, f.t)
    assert after is before                      # the walk was not made again
    assert job.budget_memo is kept_budget
    ranks, (worst, longest) = walked(f, f.t)
    assert {rec.rank for rec in after} == ranks
    b = f.d.budgets[JOB]
    assert (b.blocked_rank, b.blocked_seconds) == (worst, longest)
    # Time passing: the budget counts down from the kept walk.
    later = f.t + 7.5
    b2 = budget(job, table, later, f.d.budget_cfg)
    assert job.budget_memo is kept_budget
    assert (b2.blocked_rank, b2.blocked_seconds) == walked(f, later)[1]
    assert b2.blocked_seconds == b.blocked_seconds + 7.5
    assert b2.remaining == b.remaining - 7.5
    assert f.d.incidents.for_job(JOB)


def test_a_rank_leaving_the_wait_makes_the_walks_anew() -> None:
    f = stalled()
    job, table = f.job, f.d.table
    before = fresh_waiting(job, table, f.t)
    f.t += 1.0
    f.full("agent-b", (3,), S.COMPUTE)           # rank 3 left the barrier
    f.d.tick(now=f.t)
    after = fresh_waiting(job, table, f.t)
    assert after is not before
    assert {rec.rank for rec in after} == walked(f, f.t)[0] == {1, 2}


def test_a_new_waiting_rank_makes_the_walks_anew() -> None:
    f = Feed()
    f.full("agent-a", (0,), S.SAVING)
    f.full("agent-a", (1,), S.COLLECTIVE, Op.BARRIER, still=4.0)
    f.full("agent-b", (2,), S.COLLECTIVE, Op.BARRIER, still=4.0)
    f.full("agent-b", (3,), S.COMPUTE)
    f.t += 1.0
    f.d.tick(now=f.t)
    job, table = f.job, f.d.table
    before, kept_budget = fresh_waiting(job, table, f.t), job.budget_memo
    f.t += 1.0
    # Rank 3 joins the wait, having waited longer than the others.
    f.full("agent-b", (3,), S.COLLECTIVE, Op.BARRIER, seconds=30.0, still=4.0)
    f.d.tick(now=f.t)
    assert fresh_waiting(job, table, f.t) is not before
    assert job.budget_memo is not kept_budget
    ranks, (worst, longest) = walked(f, f.t)
    assert ranks == {1, 2, 3}
    b = f.d.budgets[JOB]
    assert (b.blocked_rank, b.blocked_seconds) == (worst, longest)
    assert worst == 3


def test_an_agent_clock_redating_its_ranks_makes_the_budget_anew() -> None:
    f = stalled()
    job = f.job
    kept_budget = job.budget_memo
    f.t += 1.0
    # agent-b's clock offset comes out 3 s smaller: its waits began earlier.
    f.send("agent-b", briefs=[(2, 5.0), (3, 5.0)], clock=100.0 + f.seq["agent-b"] + 1 + 3.0)
    f.d.tick(now=f.t)
    assert f.d.table.reanchored_total
    assert job.budget_memo is not kept_budget
    b = f.d.budgets[JOB]
    assert (b.blocked_rank, b.blocked_seconds) == walked(f, f.t)[1]


def test_a_full_sample_repeating_a_waiter_keeps_the_walks() -> None:
    """An agent's periodic snapshot sends its waiters in full, the same wait:
    nothing the walks read changed, so they are kept."""
    f = stalled()
    job, table = f.job, f.d.table
    before, kept_budget = fresh_waiting(job, table, f.t), job.budget_memo
    since = {r: job.ranks[r].since for r in (2, 3)}
    f.t += 1.0
    f.full("agent-b", (2, 3), S.COLLECTIVE, Op.BARRIER, seconds=6.0, still=5.0)
    assert {r: job.ranks[r].since for r in (2, 3)} == since
    f.d.tick(now=f.t)
    assert fresh_waiting(job, table, f.t) is before
    assert job.budget_memo is kept_budget
    b = f.d.budgets[JOB]
    assert (b.blocked_rank, b.blocked_seconds) == walked(f, f.t)[1]
