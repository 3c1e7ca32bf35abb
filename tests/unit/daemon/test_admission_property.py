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

The mutations are tests/harness/spoil.py's; ``NCCLWATCH_FUZZ_EXAMPLES``
sets the examples (300 in ``make test``, ``make fuzz`` runs 10k).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.stacks import stack_id
from tests.harness.spoil import EXAMPLES, MUTATIONS, RANKS, report, stack


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(victim=st.sampled_from([0, 1, 2]), mutations=st.lists(MUTATIONS, min_size=1, max_size=3))
def test_one_process_costs_only_its_own_part(victim: int, mutations) -> None:
    d = Daemon(DaemonConfig())
    d.ingest(report(1), now=100.0)
    seen = {(j, r): d.table.jobs[j].ranks[r].seen for j, r, *_ in RANKS}
    req = report(2)
    s = req.report.samples[victim]
    for m in mutations:
        m(s, req.report)
    mine = (s.identity.job_id, s.identity.rank)   # as sent (ingest escapes it in place)
    resp = d.ingest(req, now=101.0)          # never refused: it would raise
    theirs = {stack_id(stack(pid)) for i, (*_, pid, _) in enumerate(RANKS) if i != victim}
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
