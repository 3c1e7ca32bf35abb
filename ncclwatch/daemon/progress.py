"""The job's own account of a stall: Flight Recorder summaries across ranks.

Stacks say what each rank is doing; the Flight Recorder says which
collective each rank has enqueued and completed, by sequence number. During
a stall the daemon asks the job's agents for dumps (DumpFlightRecorder); the
summaries that come back are analysed together (flightrec.analyze_progress):
the ranks that never enqueued the pending collective are the missing ranks,
named exactly, and its timeout_ms is the exact watchdog budget.
"""

from __future__ import annotations

from typing import Any

from ncclwatch.daemon.records import Job
from ncclwatch.flightrec import FrAnalysis, PgProgress, analyze_progress
from ncclwatch.model import rank_ranges


def progress_from_pb(fr: Any) -> list[PgProgress]:
    """A FlightRecorderSummary (pb) back into flightrec's model."""
    return [PgProgress(pg_id=g.pg_id, pg_name=g.pg_name, ranks=tuple(g.ranks),
                       last_enqueued=g.last_enqueued, last_started=g.last_started,
                       last_completed=g.last_completed, pending_op=g.pending_op,
                       pending_seq=g.pending_seq,
                       pending_timeout_ms=g.pending_timeout_ms or None,
                       pending_since_ns=None, pending_sizes=(), pg_desc=g.pg_desc,
                       timeout_ms=g.pending_timeout_ms or None, last_op=g.last_op)
            for g in fr.groups]


def analysis(job: Job, since: float | None = None) -> FrAnalysis | None:
    """Cross-rank analysis of the dumps written at or after ``since`` (daemon clock)."""
    progress = {r: progress_from_pb(fr) for r, (at, fr) in job.flight_recorder.items()
                if since is None or at >= since}
    if not progress:
        return None
    return analyze_progress(progress, world_size=job.world_size)


def view(job: Job, since: float | None, now: float) -> dict[str, Any] | None:
    """The incident's Flight Recorder evidence (None: no dump during it)."""
    a = analysis(job, since)
    if a is None:
        return None
    dumps = {r: at for r, (at, _fr) in job.flight_recorder.items()
             if since is None or at >= since}
    stuck = a.stuck[0] if a.stuck else None
    sentence = ""
    if stuck is not None and stuck.missing_ranks:
        sentence = (f"Flight Recorder: rank(s) {rank_ranges(stuck.missing_ranks)} never "
                    f"started {stuck.op or 'the collective'} #{stuck.seq} of process group "
                    f"{stuck.pg_desc or stuck.pg_name}; rank(s) "
                    f"{rank_ranges(stuck.waiting_ranks) or '-'} wait in it")
    elif stuck is not None:
        sentence = (f"Flight Recorder: {stuck.op} #{stuck.seq} of process group "
                    f"{stuck.pg_desc or stuck.pg_name} is pending on rank(s) "
                    f"{rank_ranges(stuck.waiting_ranks)}; no dumping rank is missing it")
    if stuck is not None and stuck.unreported_ranks:
        sentence += f" (no dump from rank(s) {rank_ranges(stuck.unreported_ranks)})"
    if stuck is not None and stuck.timeout_ms:
        sentence += f"; its timeout is {stuck.timeout_ms / 1000:g} s"
    return {"ranks_dumped": rank_ranges(dumps), "dumps": len(dumps),
            "oldest_dump_age_seconds": round(now - min(dumps.values()), 1),
            "missing_ranks": a.missing_ranks(), "waiting_ranks": a.waiting_ranks(),
            "timeout_ms": a.timeout_ms, "sentence": sentence,
            "stuck": [s.to_json() for s in a.stuck], "mismatches": [m.to_json() for m in a.mismatches]}
