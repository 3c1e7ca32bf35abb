"""Each job's counts of its ranks (statecounts.py), kept as reports are applied.

The counts let the tick pass over a quiet job without walking its ranks, so a
wrong count is a missed stall: they are held to a recount of the job after
every kind of change (state, stillness, exit, a full round without a rank,
a resize, the job leaving the table and coming back), and after random
ingest sequences; and a daemon that uses them decides exactly as one that
walks every rank. The waiting views kept across ticks (records.Job.
ranks_version) are held to a walk the same way.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.detect import fresh_waiting
from ncclwatch.daemon.detect.shape import live_ranks
from ncclwatch.daemon.statecounts import StateCounts
from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.reports import sample

S, Op = RankState, CollectiveOp
JOB, WORLD = "job-c", 4
#: Agent -> (node, its ranks); a rank's slot is rank + 1.
AGENTS = {"agent-a": ("node-a", (0, 1)), "agent-b": ("node-b", (2, 3))}


class Driver:
    """One daemon fed protocol-2 reports of a 4-rank job from two agents."""

    def __init__(self, d: Daemon, t: float = 1000.0) -> None:
        self.d, self.t = d, t
        self.seq = dict.fromkeys(AGENTS, 0)

    def send(self, agent: str, *, samples=(), changes=(), briefs=None, exited=(),
             full: bool = False, cpu: float = 0.5) -> None:
        self.seq[agent] += 1
        seq = self.seq[agent]
        rep = pb.NodeReport(node=AGENTS[agent][0], agent_id=agent, seq=seq,
                            agent_monotonic_seconds=100.0 + seq, interval_seconds=1.0,
                            full_round=full, samples=list(samples), changes=list(changes),
                            exited=list(exited), slots_reset=seq == 1)
        if briefs:
            rep.briefs.CopyFrom(pb.RankBriefs(
                slot=[r + 1 for r, _ in briefs], still_seconds=[s for _, s in briefs],
                cpu_utilization=[cpu] * len(briefs), cpu_seconds=[1.0] * len(briefs)))
        self.d.ingest(pb.ReportRequest(protocol_version=2, report=rep), now=self.t)

    def full(self, agent: str, ranks, state: RankState, op: CollectiveOp = Op.NONE, *,
             seconds: float = 1.0, still: float | None = 0.0, full: bool = True,
             world: int = WORLD) -> None:
        out = []
        for r in ranks:
            s = sample(JOB, r, world, state, op, seconds=seconds, stack=f"s-{state.value}")
            s.slot = r + 1
            s.stack_age_seconds = 0.2
            if still is not None:
                s.still_seconds = still
            out.append(s)
        self.send(agent, samples=out, full=full)

    def change(self, agent: str, rank: int, state: RankState, op: CollectiveOp = Op.NONE, *,
               seconds: float = 0.5, still: float = 0.0) -> None:
        self.send(agent, changes=[pb.RankChange(
            slot=rank + 1, state=state.to_proto(), op=op.to_proto(), state_seconds=seconds,
            stack_age_seconds=0.2, stack_id=f"s-{state.value}", still_seconds=still,
            cpu_utilization=0.5, cpu_seconds=1.0)])

    def counts(self) -> StateCounts:
        return self.d.table.counts[JOB]


def recounted(d: Daemon) -> None:
    """Every job's kept counts are those of a walk over its ranks (and its kept
    views, ``views_kept``, as of the latest report)."""
    views_kept(d, max((a.last_recv for a in d.table.agents.values()), default=0.0))
    assert set(d.table.counts) == set(d.table.jobs)
    for job_id, job in d.table.jobs.items():
        kept = d.table.counts[job_id]
        assert kept.job is job
        assert kept.keys.keys() == job.ranks.keys()
        assert kept.snapshot() == StateCounts.recount(job).snapshot()


def views_kept(d: Daemon, now: float) -> None:
    """Every job's kept views (records.Job.ranks_version) are those of a walk:
    the live waiting records and the fresh ones the detectors start from (in
    the waiting set's order), the live records and their agents, and the
    shape detectors' live ranks (None unless all are fresh)."""
    table = d.table
    fresh = table.fresh_agents(now)
    for job in table.jobs.values():
        live = [rec for r in job.waiting if (rec := job.ranks[r]).gone_at is None]
        assert job.live_waiting() == live
        assert fresh_waiting(job, table, now) == [rec for rec in live if rec.agent_id in fresh]
        alive = {r: rec for r, rec in job.ranks.items() if rec.gone_at is None}
        assert job.live_records() == alive
        assert job.live_agents() == {rec.agent_id for rec in alive.values()}
        walked = alive if len(alive) >= max(job.world_size, 2) and all(
            rec.agent_id in fresh for rec in alive.values()) else None
        assert live_ranks(job, table, now) == walked


def started() -> Driver:
    dr = Driver(Daemon(DaemonConfig(stall_threshold=4.0, hang_threshold=20.0, hang_floor=2.0)))
    for agent, (_, ranks) in AGENTS.items():
        dr.full(agent, ranks, S.COMPUTE)
    return dr


def test_ranks_changing_state_move_between_counts() -> None:
    dr = started()
    c = dr.counts()
    assert (c.live, c.by_state[S.COMPUTE], c.waiting, c.still, c.moving) == (4, 4, 0, 0, 4)
    dr.change("agent-a", 1, S.COLLECTIVE, Op.ALL_REDUCE)
    dr.change("agent-b", 2, S.DEVICE_WAIT)
    assert (c.waiting, c.moving, c.by_state[S.COMPUTE], c.by_state[S.DEVICE_WAIT]) == (2, 2, 2, 1)
    dr.change("agent-a", 0, S.SAVING)
    assert (c.checkpoint, c.moving) == (1, 2)   # at work: neither waiting nor still
    assert not c.quiet()
    dr.change("agent-a", 0, S.COMPUTE)
    assert c.checkpoint == 0 and c.quiet()
    recounted(dr.d)


def test_a_rank_sitting_still_and_getting_up_is_counted_from_briefs() -> None:
    dr = started()
    c = dr.counts()
    dr.change("agent-b", 3, S.COLLECTIVE, Op.BARRIER)
    dr.t += 1.0
    dr.send("agent-b", briefs=[(2, 0.0), (3, 1.5)])
    assert (c.still, c.still_live, c.moving, c.waiting) == (1, 1, 3, 1)
    assert not c.quiet()
    dr.t += 1.0
    dr.send("agent-b", briefs=[(2, 0.0), (3, 0.0)])
    assert (c.still, c.still_live, c.still_waiting) == (0, 0, 0) and c.quiet()
    recounted(dr.d)


def test_a_rank_without_progress_readings_is_counted_unread() -> None:
    dr = started()
    c = dr.counts()
    dr.full("agent-a", (0, 1), S.COLLECTIVE, Op.BARRIER, still=None)
    assert (c.waiting, c.unread_waiting) == (2, 2)
    recounted(dr.d)


def test_ranks_leaving_are_no_longer_counted_live() -> None:
    dr = started()
    c = dr.counts()
    dr.t += 1.0
    dr.send("agent-b", briefs=[(2, 2.0), (3, 0.0)])   # rank 2 sits still, then exits
    dr.send("agent-b", exited=[pb.RankIdentity(job_id=JOB, rank=2, pid=1002)])
    assert (c.live, c.moving, c.still_live, c.by_state[S.COMPUTE]) == (3, 3, 0, 3)
    assert c.still == 1   # a gone rank keeps its still period (Job.still keeps it too)
    recounted(dr.d)
    # A full round without rank 1: gone.
    dr.full("agent-a", (0,), S.COMPUTE)
    assert (c.live, c.moving) == (2, 2)
    recounted(dr.d)
    # Rank 1 back: live again.
    dr.full("agent-a", (0, 1), S.COLLECTIVE, Op.ALL_REDUCE)
    assert (c.live, c.waiting) == (3, 2)
    recounted(dr.d)


def test_ranks_beyond_a_new_world_size_are_dropped() -> None:
    dr = started()
    dr.d.table.resize(JOB, 2, dr.t)
    c = dr.counts()
    assert (c.live, c.moving, set(c.keys)) == (2, 2, {0, 1})
    recounted(dr.d)


def test_a_job_that_leaves_the_table_and_comes_back_is_counted_afresh() -> None:
    dr = started()
    old = dr.counts()
    dr.d.table.job_ttl = 5.0
    for agent, (_, ranks) in AGENTS.items():
        dr.full(agent, (), S.COMPUTE)   # full rounds without the ranks: all gone
    assert old.live == 0
    dr.t += 10.0
    dr.d.tick(now=dr.t)
    assert JOB not in dr.d.table.jobs and JOB not in dr.d.table.counts
    dr.full("agent-a", (0,), S.COLLECTIVE, Op.BARRIER)
    new = dr.counts()
    assert new is not old and (new.live, new.waiting) == (1, 1)
    assert dr.d.table.state_counts(dr.d.table.jobs[JOB]) is new
    recounted(dr.d)


def test_counts_of_another_job_object_are_never_read() -> None:
    dr = started()
    job = dr.d.table.jobs[JOB]
    other = StateCounts.recount(job)
    dr.d.table.counts[JOB] = other
    other.job = object()
    assert dr.d.table.state_counts(job) is None


def test_a_quiet_job_is_passed_over_but_an_old_wait_is_not() -> None:
    """The tick's skip: young waits in a quiet job ask nothing; the same job
    with a wait past half the stall threshold gets its round of stacks."""
    dr = started()
    dr.change("agent-a", 1, S.COLLECTIVE, Op.ALL_REDUCE, seconds=0.5)
    d = dr.d
    job = d.table.jobs[JOB]
    d.tick(now=dr.t)
    assert d._quiet(job, d.budgets[JOB], 2.0)
    assert not any(a.commands for a in d.table.agents.values())
    dr.t += 3.0    # the wait is 3.5 s old (past half the 4 s threshold), its CPU quiet
    dr.send("agent-a", briefs=[(0, 0.0), (1, 0.0)], cpu=0.0)
    d.tick(now=dr.t)
    assert not d._quiet(job, d.budgets[JOB], 2.0)
    assert d.table.agents["agent-a"].commands   # stacks asked: the wait may be a stall


# -- random ingest sequences ------------------------------------------------------------

STATES = [(S.COMPUTE, Op.NONE), (S.DATALOADER, Op.NONE), (S.COLLECTIVE, Op.ALL_REDUCE),
          (S.COLLECTIVE, Op.BARRIER), (S.DEVICE_WAIT, Op.NONE), (S.SAVING, Op.NONE),
          (S.IDLE, Op.NONE), (S.UNKNOWN, Op.NONE)]
agents = st.sampled_from(sorted(AGENTS))
states = st.sampled_from(STATES)
seconds = st.sampled_from([0.0, 1.0, 3.0, 10.0, 40.0])
stills = st.sampled_from([0.0, 0.0, 1.5, 5.0, 30.0])
step = st.one_of(
    st.tuples(st.just("full"), agents, states, seconds, st.one_of(st.none(), stills),
              st.booleans(), st.lists(st.integers(0, 1), max_size=2, unique=True)),
    st.tuples(st.just("change"), agents, st.integers(0, 1), states, seconds, stills),
    st.tuples(st.just("brief"), agents, stills, stills),
    st.tuples(st.just("exit"), agents, st.integers(0, 1)),
)
steps = st.lists(st.tuples(step, st.sampled_from([0.0, 0.5, 1.0, 3.0, 12.0])),
                 min_size=1, max_size=30)


def play(dr: Driver, move) -> None:
    kind, agent = move[0], move[1]
    ranks = AGENTS[agent][1]
    if kind == "full":
        _, _, (state, op), secs, still, full, pick = move
        dr.full(agent, [ranks[i] for i in pick] or ranks, state, op, seconds=secs,
                still=still, full=full)
    elif kind == "change":
        _, _, i, (state, op), secs, still = move
        dr.change(agent, ranks[i], state, op, seconds=secs, still=still)
    elif kind == "brief":
        dr.send(agent, briefs=list(zip(ranks, move[2:])))
    else:
        dr.send(agent, exited=[pb.RankIdentity(job_id=JOB, rank=ranks[move[2]],
                                               pid=1000 + ranks[move[2]])])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_kept_counts_equal_a_recount_after_any_ingest_sequence(seq) -> None:
    dr = started()
    dr.d.table.job_ttl = 20.0
    for move, dt in seq:
        play(dr, move)
        recounted(dr.d)
        views_kept(dr.d, dr.t)
        dr.t += dt
        views_kept(dr.d, dr.t)   # the same records, agents gone stale since
        dr.d.tick(now=dr.t)
        recounted(dr.d)
        views_kept(dr.d, dr.t)


def decisions(d: Daemon) -> dict:
    """What a tick decides: incidents, commands queued, budgets."""
    return {
        "active": {k: (inc.finding.summary, inc.finding.waiting, inc.finding.started_at,
                       tuple(c.rank for c in inc.finding.culprits), inc.finding.provisional)
                   for k, inc in d.incidents.active.items()},
        "ended": [(i.job_id, i.kind) for i in d.incidents.ended],
        "commands": {a: [c.SerializeToString() for c in rec.commands]
                     for a, rec in d.table.agents.items()},
        "budgets": dict(d.budgets),
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_a_daemon_using_the_counts_decides_as_one_that_walks_every_rank(seq) -> None:
    """The same reports to a daemon with counts and to one whose table gives
    none (every detector walks, no job is passed over): the same incidents,
    the same commands, the same budgets, tick by tick."""
    fast, slow = started(), started()
    slow.d.table.state_counts = lambda job: None
    for move, dt in seq:
        for dr in (fast, slow):
            play(dr, move)
            dr.t += dt
            dr.d.tick(now=dr.t, wall=dr.t)
        assert decisions(fast.d) == decisions(slow.d)
