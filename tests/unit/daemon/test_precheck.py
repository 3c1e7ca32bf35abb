"""The ingest workers' table-free checks (daemon/precheck.py) against the core's own.

A report a worker calls clean is applied by the core without those checks
(``prechecked``). That is only sound if, for every report called clean, the
core's answer and table are exactly what its full path gives; and the check
is only worth its CPU if it calls the reports of a real fleet clean. Both
are asserted here: on a 64-rank job of protocol-2 agents (samples, changes,
briefs, stacks, a checkpoint stall) and on the fuzzed reports of the
one-process-one-part property (tests/harness/spoil.py), where each
report not called clean must be one the full path found at fault.
"""

from __future__ import annotations

import enum
import math
import random

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from ncclwatch.contract.limits import DEFAULT_BOUNDS
from ncclwatch.daemon import precheck
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.validate import ReportError
from ncclwatch.model import RankState, StallKind
from ncclwatch.v1 import collector_pb2 as pb
from bench.loadgen import Pool, SimAgent, Stall, fleet
from tests.harness.reports import report, sample
from tests.harness.spoil import EXAMPLES, MUTATIONS, report as spoilable

_SCALARS = (int, float, str, bool, type(None), enum.Enum, tuple, frozenset)


def _table(d: Daemon) -> str:
    """Every rank record's plain fields, and each job's counts and incidents (as
    text: a NaN a process sent is equal to itself there)."""
    out = {}
    for job_id, job in d.table.jobs.items():
        for rank, rec in job.ranks.items():
            out[job_id, rank] = {s: v for s in type(rec).__slots__
                                 if isinstance(v := getattr(rec, s, None), _SCALARS)}
        out[job_id] = d.table.counts[job_id].snapshot()
    out["incidents"] = sorted((i.job_id, i.kind.value, i.started_at, i.detected_at,
                               sorted(i.waiters), sorted(i.others), i.root_causes)
                              for i in [*d.incidents.active.values(), *d.incidents.ended])
    out["counters"] = (d.table.samples_total, dict(d.table.forms_total),
                       dict(d.rejected_total), dict(d.dropped_parts_total),
                       d.texts_escaped_total)
    return repr(out)


def _clean(req: pb.ReportRequest) -> bool:
    return precheck.clean(pb.ReportRequest.FromString(req.SerializeToString()),
                          DEFAULT_BOUNDS)


def test_a_fleets_reports_are_clean_and_the_core_applies_them_alike() -> None:
    """8 agents of a 64-rank job, 40 rounds, a checkpoint stall in the middle:
    every report is clean, and the core that skips the workers' checks answers
    each one byte for byte as the one that runs them, with the same table
    and the same stall opened."""
    job = fleet(1, 64)[0]
    pool = Pool.build()
    agents = [SimAgent(job, n, pool, random.Random(n), 0.3, 0.0) for n in range(job.nodes)]
    for a in agents:
        a.stalls = [Stall(12.0, 32.0)]
    full, fast = (Daemon(DaemonConfig(stall_threshold=5.0, tick=0.5)) for _ in range(2))
    forms = set()
    for k in range(40):
        for n, a in enumerate(agents):
            raw = a.report(float(k) + n / 16)
            now = 1000.0 + k + n / 16
            req = pb.ReportRequest.FromString(raw)
            r = req.report
            forms.update(f for f, has in (("samples", r.samples), ("changes", r.changes),
                                          ("briefs", r.briefs.slot), ("stacks", r.stacks))
                         if has)
            assert precheck.clean(pb.ReportRequest.FromString(raw), DEFAULT_BOUNDS), (k, n)
            a_resp = full.ingest(pb.ReportRequest.FromString(raw), now=now)
            b_resp = fast.ingest(pb.ReportRequest.FromString(raw), now=now, prechecked=True)
            assert a_resp.SerializeToString() == b_resp.SerializeToString(), (k, n)
        for d in (full, fast):
            d.tick(now=1000.0 + k + 0.9)
        assert _table(fast) == _table(full), k
    assert forms == {"samples", "changes", "briefs", "stacks"}
    seen = [*full.incidents.active.values(), *full.incidents.ended]
    assert any(i.kind is StallKind.CHECKPOINT_GATHER and i.waiters for i in seen), seen


@pytest.mark.parametrize("spoil", [
    lambda r: setattr(r.report, "interval_seconds", math.nan),           # the node's own
    lambda r: setattr(r, "protocol_version", 99),
    lambda r: r.report.samples[1].identity.__setattr__("rank", 9),      # one sample's
    lambda r: r.report.samples[1].identity.__setattr__("rank", 0),      # a rank twice
    lambda r: r.report.samples[1].identity.__setattr__("world_size", 8),  # two worlds
    lambda r: r.report.samples[0].identity.__setattr__("job_id", "job\x1b[2J"),  # text
    lambda r: r.report.__setattr__("node", "node\u202e"),
    lambda r: r.report.exited.add(job_id="", rank=0),
    lambda r: r.report.changes.add(slot=0),
    lambda r: (r.__setattr__("protocol_version", 2),
               r.report.briefs.slot.append(3), r.report.briefs.still_seconds.append(-1.0),
               r.report.briefs.cpu_utilization.append(0.0),
               r.report.briefs.cpu_seconds.append(0.0)),
], ids=["interval", "protocol", "rank-range", "rank-twice", "two-worlds", "job-text",
        "node-text", "exited", "change-slot", "brief-reading"])
def test_a_fault_of_any_part_is_left_to_the_core(spoil) -> None:
    req = report([sample("job-1", r, 4, RankState.COMPUTE) for r in range(4)])
    assert _clean(req)
    spoil(req)
    assert not _clean(req)
    d = Daemon()
    try:
        resp = d.ingest(req, now=10.0)
    except ReportError:
        return
    assert resp.dropped_parts or resp.rejected_jobs or d.texts_escaped_total


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(victim=st.sampled_from([0, 1, 2]), mutations=st.lists(MUTATIONS, min_size=1, max_size=3))
def test_clean_means_the_core_finds_nothing_more(victim: int, mutations) -> None:
    """Any one process's readings, as the property test spoils them: a report
    called clean gets the same answer and table from the core without the
    checks as with them; one not called clean was at fault (refused, a part
    other than a stack dropped, a job left out or a text escaped)."""
    req = spoilable(2)
    s = req.report.samples[victim]
    for m in mutations:
        m(s, req.report)
    raw = req.SerializeToString()
    clean = precheck.clean(pb.ReportRequest.FromString(raw), DEFAULT_BOUNDS)
    event("clean" if clean else "not clean")
    full, fast = Daemon(DaemonConfig()), Daemon(DaemonConfig())
    for d in (full, fast):
        d.ingest(spoilable(1), now=100.0)
    try:
        resp = full.ingest(pb.ReportRequest.FromString(raw), now=101.0)
    except ReportError:
        assert not clean
        return
    if not clean:
        assert [p for p in resp.dropped_parts if p.what != "stack"] or resp.rejected_jobs \
            or full.texts_escaped_total, mutations
        return
    got = fast.ingest(pb.ReportRequest.FromString(raw), now=101.0, prechecked=True)
    assert got.SerializeToString() == resp.SerializeToString()
    assert _table(fast) == _table(full)
