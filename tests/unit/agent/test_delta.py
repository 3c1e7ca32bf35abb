"""Protocol 2: steady ranks travel as briefs, and the daemon judges the same.

The equivalence test feeds one sequence of rounds to two daemons, one as
full protocol-1 reports and one through ``StreamDeltas`` as briefs, and
checks that every field a verdict reads, and every verdict, is the same.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ncclwatch.agent.delta import (
    BRIEF,
    CHANGE,
    FULL,
    SNAPSHOT_EVERY,
    StreamDeltas,
    how_sent,
)
from ncclwatch.agent.uplink import Uplink
from ncclwatch.daemon import validate
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.admission import Admission, admit
from ncclwatch.daemon.validate import ReportError
from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.daemons import Harness
from tests.harness.reports import BARRIER, SAVE, report, sample, stack_pb

S, Op = RankState, CollectiveOp
BARRIER_ID, SAVE_ID = stack_pb(BARRIER).id, stack_pb(SAVE).id


def _rank(rank: int, state: RankState, op: CollectiveOp, since: float, now: float, *,
          still: float = 0.0, cpu: float = 0.9, rss: int = 1 << 30, written: int = 0,
          stack: str = BARRIER_ID, stack_at: float | None = None, world: int = 4,
          job: str = "job-1") -> pb.RankSample:
    s = sample(job, rank, world, state, op, seconds=now - since, stack=stack)
    s.stack_age_seconds = now - (stack_at if stack_at is not None else since)
    s.still_seconds = still
    s.process.cpu_utilization = cpu
    s.process.cpu_seconds = 10.0 * cpu + now
    s.process.rss_bytes = rss
    s.process.io_write_bytes = written
    return s


def _round(seq: int, samples: list[pb.RankSample], now: float) -> pb.NodeReport:
    r = report(samples, seq=seq, stacks=[stack_pb(BARRIER), stack_pb(SAVE)]).report
    r.agent_monotonic_seconds = now
    return r


def _v2(deltas: StreamDeltas, r: pb.NodeReport) -> pb.ReportRequest:
    out = pb.NodeReport()
    out.CopyFrom(r)
    del out.samples[:]
    deltas.convert(r, out)
    return pb.ReportRequest(protocol_version=2, report=out)


def _steady(seq: int, now: float) -> pb.NodeReport:
    """Four ranks training: in all_reduce, making progress, memory flat."""
    return _round(seq, [_rank(r, S.COLLECTIVE, Op.ALL_REDUCE, 90.0, now) for r in range(4)],
                  now)


def test_first_report_is_full_then_steady_ranks_go_as_briefs() -> None:
    d = StreamDeltas(phase=0)
    first = _v2(d, _steady(1, 100.0)).report
    assert first.slots_reset and len(first.samples) == 4 and not first.briefs.slot
    assert sorted(s.slot for s in first.samples) == [1, 2, 3, 4]
    second = _v2(d, _steady(2, 101.0)).report
    assert not second.slots_reset and not second.samples
    assert sorted(second.briefs.slot) == [1, 2, 3, 4]
    assert len(second.briefs.still_seconds) == len(second.briefs.cpu_seconds) == 4
    # A brief is a few bytes a rank; the full sample is what it replaces.
    assert second.briefs.ByteSize() < sum(s.ByteSize() for s in first.samples) / 3


def test_every_nth_report_of_a_stream_is_a_full_snapshot() -> None:
    d = StreamDeltas(phase=0)
    fulls = [len(_v2(d, _steady(i, 100.0 + i)).report.samples) for i in range(1, 2 * SNAPSHOT_EVERY + 2)]
    assert [i for i, n in enumerate(fulls) if n == 4] == [0, SNAPSHOT_EVERY, 2 * SNAPSHOT_EVERY]


def test_streams_that_start_together_snapshot_apart() -> None:
    """A restarted daemon's agents reconnect at once: their snapshots must not
    all land in the same round."""
    streams = [StreamDeltas() for _ in range(40)]
    first_snapshot = []
    for d in streams:
        _v2(d, _steady(1, 100.0))
        for seq in range(2, SNAPSHOT_EVERY + 2):
            if _v2(d, _steady(seq, 100.0 + seq)).report.samples:
                first_snapshot.append(seq)
                break
    assert len(first_snapshot) == 40 and len(set(first_snapshot)) > 10


def test_a_round_of_job_info_counts_as_the_snapshot() -> None:
    d = StreamDeltas(snapshot_every=5, phase=0)
    _v2(d, _steady(1, 100.0))
    for seq in (2, 3):
        assert not _v2(d, _steady(seq, 100.0 + seq)).report.samples
    with_job = _steady(4, 104.0)
    for s in with_job.samples:
        s.job.source = "test"
    assert len(_v2(d, with_job).report.samples) == 4
    fulls = [len(_v2(d, _steady(seq, 100.0 + seq)).report.samples) for seq in range(5, 11)]
    assert fulls == [0, 0, 0, 0, 4, 0]  # five reports after the job info round, not after 1


@pytest.mark.parametrize("change,how,why", [
    (dict(state=S.COMPUTE, op=Op.NONE), CHANGE, "changed"),
    (dict(stack=SAVE_ID), CHANGE, "changed"),
    (dict(since=100.5), CHANGE, "since"),
    (dict(stack_at=100.9), CHANGE, "new_stack"),
    (dict(rss=(1 << 30) + (64 << 20)), FULL, "memory"),
    (dict(written=8 << 20), FULL, "writing"),
    (dict(state=S.SAVING, op=Op.NONE, stack=SAVE_ID), FULL, "state"),
    (dict(still=3.0, cpu=0.2), BRIEF, ""),
])
def test_a_rank_goes_in_full_or_as_a_change_when_what_the_daemon_reads_moved(
        change, how, why) -> None:
    d = StreamDeltas(phase=0)
    _v2(d, _steady(1, 100.0))
    kw = dict(state=S.COLLECTIVE, op=Op.ALL_REDUCE, since=90.0)
    kw.update(change)
    state, op, since = kw.pop("state"), kw.pop("op"), kw.pop("since")
    moved = _rank(2, state, op, since, 101.0, **kw)
    others = [_rank(r, S.COLLECTIVE, Op.ALL_REDUCE, 90.0, 101.0) for r in (0, 1, 3)]
    sent = d._sent[("job-1", 2, 1002)]
    assert how_sent(moved, sent, 101.0) == (how, why)
    out = _v2(d, _round(2, others + [moved], 101.0)).report
    assert len(out.briefs.slot) == (3 if how != BRIEF else 4)
    if how == FULL:
        assert [s.identity.rank for s in out.samples] == [2] and not out.changes
        assert out.samples[0].slot == sent.slot  # the rank keeps its slot
    elif how == CHANGE:
        assert not out.samples and [c.slot for c in out.changes] == [sent.slot]
        c = out.changes[0]
        assert (c.state, c.op, c.stack_id) == (moved.state, moved.op, moved.stack_id)
        # Later rounds compare with the change: the same state again is a brief.
        again = _rank(2, state, op, since, 102.0, **kw)
        assert how_sent(again, sent, 102.0)[0] == BRIEF


def test_a_rank_waiting_without_progress_goes_as_a_brief_with_its_reading() -> None:
    d = StreamDeltas(phase=0)
    _v2(d, _steady(1, 100.0))
    still = [_rank(r, S.COLLECTIVE, Op.ALL_REDUCE, 90.0, 101.0, still=4.0, cpu=0.6)
             for r in range(4)]
    out = _v2(d, _round(2, still, 101.0)).report
    assert not out.samples and list(out.briefs.still_seconds) == [4.0] * 4


def test_a_resync_starts_the_slots_over() -> None:
    d = StreamDeltas(phase=0)
    _v2(d, _steady(1, 100.0))
    d.resync()
    out = _v2(d, _steady(2, 101.0)).report
    assert out.slots_reset and len(out.samples) == 4 and not out.briefs.slot


def _judged(d: Daemon, now: float) -> dict:
    """Everything a verdict reads of the table, and the verdicts."""
    out = {}
    for job_id, job in d.table.jobs.items():
        w = job.waits
        out[job_id] = (w.rounds, w.first_at, list(w.still.recent),
                       sorted((op.value, x.evidence, [round(v, 6) for v in x.recent])
                              for op, x in w.ops.items()))
        for r, rec in job.ranks.items():
            out[(job_id, r)] = (rec.state, rec.op, round(rec.since, 6), rec.stack_id,
                                rec.stack_at and round(rec.stack_at, 6),
                                rec.still_since and round(rec.still_since, 6),
                                rec.still_at and round(rec.still_at, 6),
                                rec.seen, round(rec.cpu_util, 5), rec.gone_at, rec.agent_id)
    d.tick(now=now, wall=now)
    out["incidents"] = sorted((k, tuple(c.rank for c in inc.finding.culprits),
                               inc.diagnosis.root_cause.id)
                              for k, inc in d.incidents.active.items())
    return out


_EPISODE = st.tuples(
    st.integers(0, 3),                                     # which rank changes
    st.sampled_from(["wait", "still", "save", "compute", "grow", "none"]),
    st.integers(1, 4),                                     # for how many rounds
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_EPISODE, min_size=1, max_size=12))
def test_briefs_give_the_same_table_and_verdicts_as_full_samples(episodes) -> None:
    full_d, delta_d = Daemon(DaemonConfig()), Daemon(DaemonConfig())
    deltas = StreamDeltas(snapshot_every=7, phase=0)
    since = {r: 50.0 for r in range(4)}
    kind = {r: "wait" for r in range(4)}
    still_from: dict[int, float] = {}
    rss = {r: 1 << 30 for r in range(4)}
    seq, now = 0, 100.0
    for rank, what, rounds in episodes:
        if what != kind[rank]:
            since[rank] = now
            still_from.pop(rank, None)
        kind[rank] = what
        if what == "still":
            still_from.setdefault(rank, now)
        for _ in range(rounds):
            seq, now = seq + 1, now + 1.0
            samples = []
            for r in range(4):
                k = kind[r]
                state, op, stack = {
                    "wait": (S.COLLECTIVE, Op.ALL_REDUCE, BARRIER_ID),
                    "none": (S.COLLECTIVE, Op.ALL_REDUCE, BARRIER_ID),
                    "still": (S.COLLECTIVE, Op.ALL_REDUCE, BARRIER_ID),
                    "save": (S.SAVING, Op.NONE, SAVE_ID),
                    "compute": (S.COMPUTE, Op.NONE, SAVE_ID),
                    "grow": (S.COMPUTE, Op.NONE, SAVE_ID),
                }[k]
                if k == "grow":
                    rss[r] += 20 << 20
                still = now - still_from[r] if r in still_from else 0.0
                samples.append(_rank(r, state, op, since[r], now, still=still,
                                     cpu=0.01 if k == "still" else 0.9, rss=rss[r],
                                     stack=stack))
            r1 = _round(seq, samples, now)
            full_d.ingest(pb.ReportRequest(protocol_version=1, report=r1), now=now)
            resp = delta_d.ingest(_v2(deltas, r1), now=now)
            assert not resp.resync
            assert _judged(full_d, now) == _judged(delta_d, now)
    assert deltas.briefs_total > 0 or seq < 3


def test_a_brief_for_a_slot_the_daemon_lacks_asks_for_a_resync() -> None:
    d = Daemon(DaemonConfig())
    deltas = StreamDeltas(phase=0)
    d.ingest(_v2(deltas, _steady(1, 100.0)), now=100.0)
    fresh = Daemon(DaemonConfig())  # as after a restart on a stream that survived
    resp = fresh.ingest(_v2(deltas, _steady(2, 101.0)), now=101.0)
    assert resp.resync and fresh.table.agents["agent-a"].briefs_unresolved_total == 4
    deltas.resync()
    resp = fresh.ingest(_v2(deltas, _steady(3, 102.0)), now=102.0)
    assert not resp.resync and len(fresh.table.jobs["job-1"].ranks) == 4
    resp = fresh.ingest(_v2(deltas, _steady(4, 103.0)), now=103.0)
    assert not resp.resync and fresh.table.jobs["job-1"].ranks[3].seen == 103.0


def test_briefs_of_a_job_left_out_are_skipped_without_resync() -> None:
    d = Daemon(DaemonConfig())
    d.ingest(report([sample("job-1", 0, 8, S.COMPUTE)], agent="other", node="node-b"), now=99.0)
    deltas = StreamDeltas(phase=0)
    resp = d.ingest(_v2(deltas, _steady(1, 100.0)), now=100.0)  # says world 4: left out
    assert [r.job_id for r in resp.rejected_jobs] == ["job-1"]
    resp = d.ingest(_v2(deltas, _steady(2, 101.0)), now=101.0)
    assert not resp.resync and [r.job_id for r in resp.rejected_jobs] == []
    assert d.table.jobs["job-1"].world_size == 8 and 1 not in d.table.jobs["job-1"].ranks


def _with_briefs(**fields) -> pb.ReportRequest:
    req = report([], seq=2)
    req.protocol_version = 2
    b = req.report.briefs
    for name, values in {**dict(slot=[1], still_seconds=[0.0], cpu_utilization=[0.5],
                                cpu_seconds=[1.0]), **fields}.items():
        getattr(b, name).extend(values)
    return req


@pytest.mark.parametrize("req,match", [
    (_with_briefs(still_seconds=[0.0, 1.0]), "1 slots but 2 still_seconds"),
    (_with_briefs(slot=[0]), "slot 0"),
])
def test_malformed_briefs_are_refused_whole(req, match) -> None:
    """The arrays' shape is the agent's encoding: the node's own fault."""
    with pytest.raises(ReportError, match=match) as e:
        admit(req)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("field", ["still_seconds", "cpu_seconds", "cpu_utilization"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_a_brief_with_a_bad_reading_is_dropped_alone(field, bad) -> None:
    """A reading is its rank's: that brief goes, the other is applied."""
    req = _with_briefs(slot=[1, 2], still_seconds=[0.0, 1.0], cpu_utilization=[0.5, 0.5],
                       cpu_seconds=[1.0, 2.0])
    getattr(req.report.briefs, field)[0] = bad
    adm = admit(req)
    assert [(p.what, p.reason) for p in adm.dropped] == [("brief", "not_finite")]
    assert list(req.report.briefs.slot) == [2] and list(req.report.briefs.cpu_seconds) == [2.0]


def _with_change(**fields) -> pb.ReportRequest:
    req = report([], seq=2)
    req.protocol_version = 2
    req.report.changes.add(**{**dict(slot=1, state=pb.RANK_STATE_COLLECTIVE,
                                     op=pb.COLLECTIVE_OP_BARRIER, state_seconds=3.0), **fields})
    return req


@pytest.mark.parametrize("req,match", [
    (_with_change(slot=0), "slot 0"),
    (_with_change(state=77), "unknown state 77"),
    (_with_change(state_seconds=float("nan")), "state_seconds and stack_age_seconds"),
    (_with_change(stack_age_seconds=-1.0), "state_seconds and stack_age_seconds"),
    (_with_change(cpu_seconds=float("inf")), "cpu_seconds must be finite"),
    (_with_change(stack_id="x" * 65), "stack_id too long"),
])
def test_a_malformed_change_is_dropped_alone(req, match) -> None:
    """One rank's change costs that change (and its slot), never the report."""
    good = req.report.changes.add(slot=2, state=pb.RANK_STATE_COMPUTE, state_seconds=1.0)
    adm = admit(req)
    assert [p.what for p in adm.dropped] == ["change"]
    assert re.search(match, adm.dropped[0].message), adm.dropped[0].message
    assert adm.dropped[0].fault.code == "INVALID_ARGUMENT"
    assert list(req.report.changes) == [good]
    assert adm.slots == ([] if "slot 0" in match else [1])


def test_a_step_into_a_collective_goes_as_a_change_the_daemon_applies() -> None:
    d, deltas = Daemon(DaemonConfig()), StreamDeltas(phase=0)
    d.ingest(_v2(deltas, _round(1, [_rank(r, S.COMPUTE, Op.NONE, 90.0, 100.0, stack=SAVE_ID)
                                    for r in range(4)], 100.0)), now=100.0)
    req = _v2(deltas, _steady(2, 101.0))  # every rank now in all_reduce since 90 s
    assert not req.report.samples and len(req.report.changes) == 4
    assert req.report.changes[0].ByteSize() < 80
    assert not d.ingest(req, now=101.0).resync
    job = d.table.jobs["job-1"]
    assert job.waiting == {0, 1, 2, 3} and job.ranks[2].op is Op.ALL_REDUCE
    assert job.ranks[2].since == pytest.approx(101.0 - 11.0)


def test_briefs_need_protocol_2_and_protocol_1_stays_accepted() -> None:
    req = _with_briefs()
    req.protocol_version = 1
    with pytest.raises(ReportError, match="protocol_version 2"):
        admit(req)
    assert admit(report([sample("j", 0, 1, S.COMPUTE)])) == Admission()


async def _until(cond, seconds: float = 30.0) -> None:
    """Wait for ``cond()`` on the event loop; a loaded CI machine can take
    seconds to open the first stream, so the bound is wide and the loop ends
    as soon as the condition holds."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, f"not within {seconds} s"
        await asyncio.sleep(0.02)


def _acked(h: Harness, seq: int):
    def cond() -> bool:
        agent = h.daemon.table.agents.get("agent-a")
        return agent is not None and agent.last_seq >= seq
    return cond


def _uplink_until(h: Harness, up: Uplink, rounds: int, job: str = "job-1") -> None:
    async def go():
        task = asyncio.create_task(up.run())
        for seq in range(1, rounds + 1):
            up.submit(_steady(seq, 100.0 + seq))
            await _until(_acked(h, seq))
        up.stop()
        await task
    return go()


def test_an_agent_streams_briefs_to_a_real_daemon() -> None:
    async def go():
        async with Harness() as h:
            up = Uplink(h.target, {BARRIER_ID: stack_pb(BARRIER)})
            await _uplink_until(h, up, 2 * SNAPSHOT_EVERY)
            agent = h.daemon.table.agents["agent-a"]
            assert agent.last_seq == 2 * SNAPSHOT_EVERY
            # The first report and one or two snapshots (at the stream's random phase)
            # go in full; every other report is four briefs.
            assert up.briefs_total == agent.briefs_total
            assert up.briefs_total in (4 * (2 * SNAPSHOT_EVERY - 2), 4 * (2 * SNAPSHOT_EVERY - 3))
            assert agent.briefs_unresolved_total == 0 and up.resyncs_total == 0
            rec = h.daemon.table.jobs["job-1"].ranks[3]
            assert rec.state is S.COLLECTIVE and rec.cpu_util == pytest.approx(0.9)
            url = f"http://127.0.0.1:{h.server.http_port}/metrics"
            text = await asyncio.to_thread(lambda: urllib.request.urlopen(url).read().decode())
            forms = {line.split('"')[1]: float(line.split()[-1]) for line in text.splitlines()
                     if line.startswith("ncclwatch_daemon_rank_samples_by_form_total{")}
            assert forms["brief"] == up.briefs_total and forms["change"] == 0
            assert forms["full"] + forms["brief"] == 4 * 2 * SNAPSHOT_EVERY
            assert "ncclwatch_daemon_resyncs_total 0" in text
    asyncio.run(go())


def test_an_agent_falls_back_to_full_samples_for_a_daemon_that_speaks_only_1(
        monkeypatch) -> None:
    monkeypatch.setattr(validate, "PROTOCOL_VERSIONS", frozenset({1}))

    async def go():
        async with Harness() as h:
            up = Uplink(h.target, {BARRIER_ID: stack_pb(BARRIER)})
            await _uplink_until(h, up, 3)
            assert up.protocol == 1 and up.briefs_total == 0
            assert h.daemon.table.agents["agent-a"].last_seq == 3
            assert h.daemon.rejected_total["FAILED_PRECONDITION"] >= 1
    asyncio.run(go())


def test_a_steady_ranks_curve_keeps_only_the_last_span_of_points() -> None:
    from ncclwatch.daemon.curve import CURVE_POINTS, CURVE_SPAN, Curve
    every_snapshot, every_round = Curve(), Curve()
    for i in range(1200):  # 20 minutes
        t = 1000.0 + i
        every_round.add(t, 1 << 30, i, (), ())
        if i % SNAPSHOT_EVERY == 0:
            every_snapshot.add(t, 1 << 30, i, (), ())
    for c in (every_snapshot, every_round):
        assert c.t[-1] - c.t[0] <= CURVE_SPAN and len(c) <= CURVE_POINTS
    assert len(every_snapshot) == int(CURVE_SPAN // SNAPSHOT_EVERY) + 1
    assert len(every_round) == int(CURVE_SPAN) + 1
    assert [p.written for p in every_round.recent()][-1] == 1199


def test_a_resync_resends_job_info_to_the_daemon_that_lost_it() -> None:
    """A daemon that forgot a job under a live stream gets its environment back."""
    async def go():
        async with Harness() as h:
            sent_env = []
            up = Uplink(h.target, {BARRIER_ID: stack_pb(BARRIER)},
                        on_connect=lambda: sent_env.append("reset"))
            task = asyncio.create_task(up.run())
            for seq in range(1, 4):
                up.submit(_steady(seq, 100.0 + seq))
                await _until(_acked(h, seq))  # held by the daemon before it forgets
            h.daemon.table.jobs.clear()  # forgotten (expired) under the live stream
            up.submit(_steady(4, 104.0))
            await _until(lambda: up.resyncs_total > 0)
            up.stop()
            await task
            assert up.resyncs_total == 1 and sent_env == ["reset", "reset"]
            assert h.daemon.table.resyncs_total == 1
    asyncio.run(go())


def test_a_forgotten_job_back_in_a_snapshot_still_asks_for_its_facts() -> None:
    """The report after the daemon forgot a job may be the stream's periodic
    snapshot: every rank in full, nothing unresolved, but no job facts (they
    come with a stream's first report). The daemon asks for a resync anyway,
    and the stream's next report carries them."""
    d, deltas = Daemon(DaemonConfig()), StreamDeltas(snapshot_every=4, phase=1)
    for seq in range(1, 4):
        assert not d.ingest(_v2(deltas, _steady(seq, 100.0 + seq)), now=100.0 + seq).resync
    d.table.jobs.clear()
    snap = _v2(deltas, _steady(4, 104.0))
    assert len(snap.report.samples) == 4 and not snap.report.slots_reset
    assert d.ingest(snap, now=104.0).resync and d.table.resyncs_total == 1
    deltas.resync()
    again = _v2(deltas, _steady(5, 105.0))
    assert again.report.slots_reset
    assert not d.ingest(again, now=105.0).resync  # a stream's first report: no loop


def test_a_queued_report_first_after_a_restart_does_not_date_the_waits_late() -> None:
    """A restarted daemon's first report from an agent may have waited in the
    agent's queue (reconnect backoff): its transit is in the clock offset,
    and the briefs after it carry no state. The better offset of those briefs
    re-dates the waits to the agents' clocks (the offset here is 1000 s)."""
    d, deltas = Daemon(DaemonConfig()), StreamDeltas(phase=0)
    flush = 1110.0  # the queue of rounds built at agent clocks 100..110 arrives at once
    for i, clock in enumerate(range(100, 111)):
        still = [_rank(r, S.COLLECTIVE, Op.ALL_REDUCE, 90.0, float(clock), still=clock - 90.0)
                 for r in range(4)]
        req = _v2(deltas, _round(i + 1, still, float(clock)))
        assert bool(req.report.samples) == (i == 0)  # full once, then briefs
        d.ingest(req, now=flush + 0.001 * i)
    since = d.table.jobs["job-1"].ranks[2].since
    assert since == pytest.approx(1090.0, abs=0.1), since  # not 1100: the first report's age
    assert d.table.reanchored_total >= 1
