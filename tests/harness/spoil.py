"""One process's readings spoiled any way the wire allows, in a node's report.

The one-process-one-part property (tests/unit/daemon/test_admission_property.py)
and the ingest workers' prechecks (tests/unit/daemon/test_precheck.py) draw
from the same mutations: huge, negative or non-finite numbers, unknown enums,
empty, control-character or oversized strings, another process's identity,
a stack thousands of frames deep, a Flight Recorder summary of thousands of
groups. ``report(seq)`` is the valid report of three ranks of two jobs they
spoil one sample of.

``NCCLWATCH_FUZZ_EXAMPLES`` sets the examples (300 in ``make test``,
``make fuzz`` runs 10k).
"""

from __future__ import annotations

import math
import os

from hypothesis import strategies as st

from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.stacks import Frame, stack_id
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.reports import report as _node_report, sample, stack_pb

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


def stack(pid: int) -> list[Frame]:
    return [Frame("step", f"/job/train_{pid}.py", 10), Frame("main", "/job/train.py", 1)]


def report(seq: int) -> pb.ReportRequest:
    samples, stacks = [], []
    for job, rank, world, state, op, pid, age in RANKS:
        s = sample(job, rank, world, state, op, pid=pid, seconds=5.0,
                   stack=stack_id(stack(pid)), timeout=90.0)
        s.identity.rank_source = "env:RANK"
        s.identity.process_age_seconds = age
        s.process.rss_bytes = 1 << 30
        samples.append(s)
        stacks.append(stack_pb(stack(pid)))
    return _node_report(samples, seq=seq, stacks=stacks)


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
