"""Ingest does work in proportion to what changed: a stack the daemon holds as
sent is not checked, escaped or stored again, and a report of briefs alone
whose text is what the daemon stored for its agent is not walked for text to
escape. Each shortcut must give what the whole path gives."""

from __future__ import annotations

import random

from bench.loadgen import Pool, SimAgent, fleet
from ncclwatch import sanitize
from ncclwatch.contract import checks
from ncclwatch.daemon.core import Daemon
from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.reports import SAVE, checkpoint_job, frames, report, sample, stack_pb


def _stacked(agent: str, node: str, seq: int, stack: pb.Stack) -> pb.ReportRequest:
    s = sample("job", int(agent[-1]), 4, RankState.SAVING, stack=stack.id)
    return report([s], node=node, agent=agent, seq=seq, stacks=[stack])


def test_a_stack_sent_again_byte_for_byte_is_touched_not_checked(monkeypatch) -> None:
    d = Daemon()
    st = stack_pb(SAVE)
    assert not d.ingest(_stacked("agent-0", "n0", 1, st), now=10.0).missing_stack_ids
    assert d.table.stacks.held[st.id][1] > 0          # its wire digest and text kept
    checked = []
    real = checks.check_stack
    monkeypatch.setattr(checks, "check_stack", lambda s, b: checked.append(s.id) or real(s, b))
    resp = d.ingest(_stacked("agent-1", "n1", 1, st), now=10.5)
    assert checked == [] and not resp.dropped_parts and not resp.missing_stack_ids
    assert d.table.jobs["job"].ranks[1].stack_id == st.id
    # The same id with other frames is not the stack held: checked, and refused.
    forged = stack_pb(frames(("write", "/evil.py"), ("main", "/job/train.py")))
    forged.id = st.id
    resp = d.ingest(_stacked("agent-2", "n2", 1, forged), now=11.0)
    assert checked == [st.id]
    assert [(p.what, p.reason.split(":")[0]) for p in resp.dropped_parts] == \
        [("stack", "stack_id_mismatch")]
    assert d.table.stacks.get(st.id).frames[0].filename == "/job/storage.py"


def test_a_stack_evicted_is_forgotten_with_its_digest() -> None:
    d = Daemon()
    d.table.stacks._limit = 1
    a, b = stack_pb(SAVE), stack_pb(frames(("barrier", "/c10d.py")))
    d.ingest(_stacked("agent-0", "n0", 1, a), now=10.0)
    d.ingest(_stacked("agent-1", "n1", 1, b), now=10.5)
    assert a.id not in d.table.stacks and a.id not in d.table.stacks.held
    assert b.id in d.table.stacks.held


def test_a_report_of_briefs_holds_no_text_but_its_header() -> None:
    """What Daemon._known_header relies on: a NodeReport's own strings are its
    node and agent id, its health's only string is the version, and every
    other string sits in a part (samples, changes, stacks, exited) that a
    report of briefs alone does not have. A new string field fails this."""
    plan = sanitize._plan(pb.NodeReport.DESCRIPTOR)
    assert plan.names == ("node", "agent_id") and not plan.lists and not plan.maps
    assert {a for a, _, _ in plan.subs} == {"samples", "changes", "stacks", "exited", "health"}
    health = sanitize._plan(pb.AgentHealth.DESCRIPTOR)
    assert health.names == ("version",) and not health.subs and not health.lists


def _stream(node: str, rounds: int, version: str = "0.1.0") -> list[pb.ReportRequest]:
    job = fleet(1, 16)[0]
    a = SimAgent(job, 0, Pool.build(), random.Random(1), 0.0, 0.0)
    a.node = node
    a.header = pb.NodeReport(node=node, agent_id=a.agent_id, full_round=True,
                             health=pb.AgentHealth(version=version)).SerializeToString()
    return [pb.ReportRequest.FromString(a.report(1000.0 + k)) for k in range(rounds)]


def test_a_hostile_header_is_escaped_in_every_report_of_briefs() -> None:
    """A node name with a control character and a version with a bidi override:
    the stored forms are escaped, so the raw header of the next report (briefs
    alone) is not the stored one and is escaped again, not passed as known."""
    d = Daemon()
    reqs = _stream("evil\x1b[2Jnode", 4, "0.1.0\u202e")
    assert not reqs[-1].report.samples and reqs[-1].report.briefs.slot
    for k, req in enumerate(reqs):
        d.ingest(req, now=10.0 + k)
    (agent,) = d.table.agents.values()
    assert agent.node == "evil\\x1b[2Jnode" and agent.health.version == "0.1.0\\u202e"
    assert d.texts_escaped_total == len(reqs)
    ranks = d.table.jobs[next(iter(d.table.jobs))].ranks
    assert all(r.node == "evil\\x1b[2Jnode" and r.seen == 13.0 for r in ranks.values())


def test_a_clean_header_known_for_its_agent_is_not_walked(monkeypatch) -> None:
    d = Daemon()
    reqs = _stream("node-7", 4)
    d.ingest(reqs[0], now=10.0)
    walked = []
    real = sanitize.neutralise
    monkeypatch.setattr(sanitize, "neutralise", lambda m: walked.append(1) or real(m))
    for k, req in enumerate(reqs[1:]):
        d.ingest(req, now=11.0 + k)
    assert not walked and d.texts_escaped_total == 0
    job = d.table.jobs[next(iter(d.table.jobs))]
    assert {r.seen for r in job.ranks.values()} == {13.0}
    assert job.waits.rounds >= 8 * 3    # every rank's progress counted, once per rank


def test_a_jobinfo_every_rank_sends_is_read_once_and_judged_alike() -> None:
    """Every rank sends its job's one JobInfo: its environment is read into a
    dict once and shared; a JobInfo the contract refuses costs each sample
    that carries it, the first and the ones after."""
    d = Daemon()
    ok = pb.JobInfo(source="torchrun", env={"NCCL_DEBUG": "INFO",
                                            "SLURM_JOB_NODELIST": "gpu[1-2]"})
    bad = pb.JobInfo(source="torchrun", env={"NCCL_DEBUG": "x" * 100_000})
    samples = []
    for rank in range(4):
        s = sample("job", rank, 4, RankState.COMPUTE)
        s.job.CopyFrom(ok)
        samples.append(s)
    d.ingest(report(samples), now=10.0)
    job = d.table.jobs["job"]
    assert job.env == {"NCCL_DEBUG": "INFO", "SLURM_JOB_NODELIST": "gpu[1-2]"}
    assert job.env is d.table.infos.facts(ok).env
    assert d.table.infos.facts(ok).nodes == frozenset({"gpu1", "gpu2"})
    worse = []
    for rank in range(2):
        s = sample("job", rank, 4, RankState.COMPUTE)
        s.job.CopyFrom(bad)
        worse.append(s)
    resp = d.ingest(report(worse, seq=2, full=False), now=11.0)
    assert [(p.what, p.reason.split(":")[0]) for p in resp.dropped_parts] == \
        [("rank_sample", "env_too_long")] * 2
    assert job.env["NCCL_DEBUG"] == "INFO"


def test_a_stack_that_may_complete_a_stall_wakes_the_ticks_until_it_opens() -> None:
    """A newer stack of a rank at checkpoint work while others wait may complete
    the evidence: the daemon wakes its ticks (the server ticks at once) instead
    of leaving the decision to the next regular tick; once the incident is open,
    further stacks do not wake it, and steady reports never do."""
    d = Daemon()
    woken = []
    d.wake = lambda: woken.append(1)
    d.ingest(report([sample("j", r, 4, RankState.COMPUTE) for r in range(4)]), now=100.0)
    assert not woken                     # nobody waits, nobody at checkpoint work
    for k in range(3):
        req = checkpoint_job("j", 4, save_for=5.0 + k, wait_for=5.0 + k, seq=2 + k)
        for s in req.report.samples:
            s.stack_age_seconds = 0.0    # every round a fresh stack of each rank
        d.ingest(req, now=101.0 + k)
    # Not by the stall's first report: rank 0 comes before its waiters in it.
    assert len(woken) == 2
    d.tick(now=104.0)
    assert d.incidents.for_job("j")
    req = checkpoint_job("j", 4, save_for=9.0, wait_for=9.0, seq=5)
    d.ingest(req, now=105.0)
    assert len(woken) == 2               # open: nothing more to decide sooner


def test_ranks_gathering_inside_a_collective_do_not_wake_the_ticks() -> None:
    """Every rank gathering a state dict inside all_gather is at checkpoint work
    and waits: none is a culprit (detect/checkpoint.py), so a healthy gather's
    fresh stacks never tick the daemon faster."""
    d = Daemon()
    woken = []
    d.wake = lambda: woken.append(1)
    for k in range(3):
        samples = [sample("g", r, 4, RankState.GATHERING_STATE_DICT, CollectiveOp.ALL_GATHER,
                          seconds=5.0 + k) for r in range(4)]
        d.ingest(report(samples, seq=1 + k), now=100.0 + k)
    assert d.table.jobs["g"].waiting == {0, 1, 2, 3} and not woken
