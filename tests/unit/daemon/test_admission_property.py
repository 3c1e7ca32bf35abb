"""One process, one part: whatever one process of a node shows, the rest of the
node's report is applied (issue 44, item 5).

A valid report of three ranks of two jobs is applied once (the daemon knows
the jobs), then sent again with ONE process's readings changed to any value
the wire types allow: huge, negative or non-finite numbers, unknown enums,
empty or control-character or oversized strings, another process's
identity (as a learned number: the environment's keeps it), a stack
thousands of frames deep, a Flight Recorder summary of thousands of groups.
The daemon's real ingest must never refuse the report, never name another
process in ``dropped_parts``, and apply every other process's sample.

``NCCLWATCH_FUZZ_EXAMPLES`` sets the examples (300 in ``make test``,
``make fuzz`` runs 10k).
"""

from __future__ import annotations

import math
import os

from hypothesis import HealthCheck, given, settings, strategies as st

from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.stacks import Frame, stack_id
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.reports import report, sample, stack_pb

EXAMPLES = min(int(os.environ.get("NCCLWATCH_FUZZ_EXAMPLES", "300")), 10_000)
INT32 = st.integers(-2**31, 2**31 - 1)
UINT64 = st.integers(0, 2**64 - 1)
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([-1.0, 0.0, 1e300, -1e300, math.nan, math.inf, -math.inf]))
TEXT = st.one_of(st.text(max_size=40), st.just(""), st.just("\x1b[2J\r\n\u202e"),
                 st.integers(1, 20_000).map(lambda n: "x" * n))

#: The report as a node sends it: (job, rank, world, state, op, pid, age).
RANKS = (("job-a", 0, 4, RankState.SAVING, CollectiveOp.NONE, 1100, 300.0),
         ("job-a", 1, 4, RankState.COLLECTIVE, CollectiveOp.BARRIER, 1101, 300.0),
         ("job-b", 0, 2, RankState.COMPUTE, CollectiveOp.NONE, 1200, 50.0))


def _stack(pid: int) -> list[Frame]:
    return [Frame("step", f"/job/train_{pid}.py", 10), Frame("main", "/job/train.py", 1)]


def _report(seq: int) -> pb.ReportRequest:
    samples, stacks = [], []
    for job, rank, world, state, op, pid, age in RANKS:
        s = sample(job, rank, world, state, op, pid=pid, seconds=5.0,
                   stack=stack_id(_stack(pid)), timeout=90.0)
        s.identity.rank_source = "env:RANK"
        s.identity.process_age_seconds = age
        s.process.rss_bytes = 1 << 30
        samples.append(s)
        stacks.append(stack_pb(_stack(pid)))
    return report(samples, seq=seq, stacks=stacks)


def _set(path: str, value):
    def mutate(s: pb.RankSample, r: pb.NodeReport) -> None:
        *parents, name = path.split(".")
        msg = s
        for p in parents:
            msg = getattr(msg, p)
        setattr(msg, name, value)
    mutate.__name__ = f"{path}={value!r}"[:80]
    return mutate


def _learned_twin(k: int):
    """Another process's (job, rank), as a number learned after discovery."""
    def mutate(s: pb.RankSample, r: pb.NodeReport) -> None:
        other = RANKS[k]
        s.identity.job_id, s.identity.rank, s.identity.world_size = other[0], other[1], other[2]
        s.identity.rank_source = "flight_recorder"
        s.identity.process_age_seconds = 1.0
    return mutate


def _deep_stack(frames: int):
    def mutate(s: pb.RankSample, r: pb.NodeReport) -> None:
        deep = [Frame(f"f{i}", "/job/deep.py", i) for i in range(frames)]
        s.stack_id = stack_id(deep)
        r.stacks.append(stack_pb(deep))
    return mutate


def _groups(n: int, ranks: int):
    def mutate(s: pb.RankSample, r: pb.NodeReport) -> None:
        fr = s.flight_recorder
        for g in range(n):
            fr.groups.add(pg_name=str(g), ranks=list(range(ranks)), pending_seq=g,
                          last_completed=-1, pending_op="barrier")
    return mutate


MUTATIONS = st.one_of(
    *(st.builds(_set, st.just(f), INT32) for f in (
        "identity.world_size", "identity.rank", "identity.pid", "identity.local_rank")),
    *(st.builds(_set, st.just(f), FLOATS) for f in (
        "state_seconds", "stack_age_seconds", "identity.process_age_seconds",
        "process.cpu_utilization", "process.cpu_seconds", "job.watchdog_timeout_seconds")),
    *(st.builds(_set, st.just(f), UINT64) for f in ("process.rss_bytes", "process.vms_bytes")),
    *(st.builds(_set, st.just(f), st.integers(0, 2**31 - 1)) for f in ("state", "op")),
    *(st.builds(_set, st.just(f), TEXT) for f in (
        "identity.job_id", "identity.rank_source", "identity.rank_conflict", "stack_id",
        "native_frame", "job.source", "job.watchdog_timeout_source")),
    st.builds(_learned_twin, st.sampled_from([0, 1, 2])),
    st.builds(_deep_stack, st.integers(1025, 5000)),
    st.builds(_groups, st.integers(1, 3000), st.integers(0, 64)),
)


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(victim=st.sampled_from([0, 1, 2]), mutations=st.lists(MUTATIONS, min_size=1, max_size=3))
def test_one_process_costs_only_its_own_part(victim: int, mutations) -> None:
    d = Daemon(DaemonConfig())
    d.ingest(_report(1), now=100.0)
    seen = {(j, r): d.table.jobs[j].ranks[r].seen for j, r, *_ in RANKS}
    req = _report(2)
    s = req.report.samples[victim]
    for m in mutations:
        m(s, req.report)
    mine = (s.identity.job_id, s.identity.rank)   # as sent (ingest escapes it in place)
    resp = d.ingest(req, now=101.0)          # never refused: it would raise
    theirs = {stack_id(_stack(pid)) for i, (*_, pid, _) in enumerate(RANKS) if i != victim}
    for i, (job, rank, _, _, _, pid, _) in enumerate(RANKS):
        if i == victim:
            continue
        rec = d.table.jobs[job].ranks[rank]
        assert rec.pid == pid and rec.seen > seen[job, rank], (job, rank, rec.pid, rec.seen)
    for p in resp.dropped_parts:             # only the victim's parts are named
        if p.what == "stack":
            assert p.stack_id not in theirs, p
        else:
            assert (p.job_id, p.rank) == (mine[0][:len(p.job_id)], mine[1]) or \
                p.reason.startswith("duplicate_rank"), p
    assert all(rj.job_id == mine[0][:len(rj.job_id)] for rj in resp.rejected_jobs), \
        resp.rejected_jobs
