"""Admission: what of one report the daemon takes, part by part.

Pure: in, a request, what the table knows (a tracked job's world size) and
the bounds; out, an ``Admission`` (or ReportError for the node's own fault:
daemon/validate.py). Every other fault costs its own part alone, checked by
the contract's functions (contract/checks.py), the ones the agent runs
before sending: a rank sample, a change, a brief, an exited entry, a stack
or a Flight Recorder summary is taken out of the request and listed in
``dropped`` with its reason; a job whose samples contradict its known
world size is left out whole (``rejected``). Two processes holding one
(job, rank) keep the number for the environment's (or the older) one; the
other is dropped as ``duplicate_rank``, never merged, never the report.

core.py applies the rest, answers ``dropped_parts`` and counts each
reason; it adds the table's own judgments (bounds of jobs and bytes, which
node owns a rank).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import grpc

from ncclwatch.contract import checks
from ncclwatch.contract.bounds import Bounds
from ncclwatch.contract.checks import Fault
from ncclwatch.contract.limits import DEFAULT_BOUNDS, MAX_ID, MAX_JOB_ID
from ncclwatch.daemon.validate import ReportError, check_node
from ncclwatch.v1 import collector_pb2 as pb


@dataclass(frozen=True)
class Dropped:
    """A part of a report left out, the rest applied: ``what`` (the part,
    contract.checks.PARTS), its fault, the message said to the agent (with
    where it was), and the stack id or the (job, rank) where known."""

    what: str
    fault: Fault
    message: str
    stack_id: str = ""
    job_id: str = ""
    rank: int = -1

    @property
    def reason(self) -> str:
        return self.fault.reason

    @property
    def bound(self) -> str:
        return self.fault.bound


@dataclass
class Admission:
    """What to leave out of an admitted report (already taken out of it):
    ``dropped`` parts, ``rejected`` jobs (left out whole, by why) and the
    ``slots`` of dropped samples and changes (table.apply's left_out_slots:
    protocol 2 briefs of them are skipped)."""

    dropped: list[Dropped] = field(default_factory=list)
    rejected: dict[str, ReportError] = field(default_factory=dict)
    slots: list[int] = field(default_factory=list)


def admit(req: pb.ReportRequest,
          world_size_of: Callable[[str], int | None] = lambda job: None,
          bounds: Bounds = DEFAULT_BOUNDS) -> Admission:
    """Check ``req``; raise ReportError for the node's own fault, else take
    each faulty part out of it and return what was left out and why.

    ``world_size_of`` gives a tracked job's world size, or None: a report
    may not change it (the job is left out, FAILED_PRECONDITION)."""
    check_node(req, bounds)
    r = req.report
    out = Admission()
    _stacks(r, bounds, out)
    _samples(r, world_size_of, bounds, out)
    _exited(r, out)
    if r.changes:
        _changes(r, bounds, out)
    if r.briefs.slot:
        _briefs(r, out)
    return out


def _keep(container, drop: set[int]) -> None:
    """Take the entries at indexes ``drop`` out of a repeated field."""
    kept = [x for i, x in enumerate(container) if i not in drop]
    del container[:]
    container.extend(kept)


def _stacks(r: pb.NodeReport, bounds: Bounds, out: Admission) -> None:
    """Each stack, and their text in all: a stack that fails (or passes the
    report's total) leaves ``r`` alone."""
    text, drop = 0, set()
    for i, s in enumerate(r.stacks):
        f, n = checks.check_stack(s, bounds)
        if f is None and text + n > bounds.max_report_stack_bytes:
            f = Fault("stack", "stack_too_big", f"{text + n} bytes of stack text in one report "
                      f"(max_report_stack_bytes {bounds.max_report_stack_bytes})",
                      "report_stack_bytes", checks.TOO_BIG)
        if f is not None:
            out.dropped.append(Dropped("stack", f, f.message, stack_id=s.id[:MAX_ID]))
            drop.add(i)
            continue
        text += n
    if drop:
        _keep(r.stacks, drop)


def _samples(r: pb.NodeReport, world_size_of: Callable[[str], int | None], bounds: Bounds,
             out: Admission) -> None:
    samples = r.samples
    drop: dict[int, Fault] = {}
    seen: dict[tuple[str, int], int] = {}
    for i, s in enumerate(samples):
        f = checks.check_sample(s, bounds)
        if f is not None:
            drop[i] = f
            continue
        key = checks.rank_key(s.identity)
        j = seen.get(key)
        if j is not None:
            keep, lose = (j, i) if checks.prefer(samples[j], s) else (i, j)
            seen[key] = keep
            kept = samples[keep].identity
            drop[lose] = Fault("rank_sample", "duplicate_rank",
                               f"rank {key[1]} of job {key[0]!r} appears twice: kept pid "
                               f"{kept.pid} ({kept.rank_source or 'unknown'})")
            continue
        seen[key] = i
        if s.HasField("flight_recorder"):
            f = checks.check_flight_recorder(s.flight_recorder, s.identity.world_size, bounds)
            if f is not None:
                out.dropped.append(Dropped("flight_recorder", f, f"samples[{i}].{f.message}",
                                           job_id=s.identity.job_id, rank=s.identity.rank))
                s.ClearField("flight_recorder")   # the sample itself is applied
    new_jobs: dict[str, int] = {}  # jobs first seen in this very report
    rejected = out.rejected
    for i, s in enumerate(samples):
        if i in drop:
            continue
        ident = s.identity
        job_id, world = ident.job_id, ident.world_size
        known = world_size_of(job_id)
        if known is None:
            known = new_jobs.setdefault(job_id, world)
        if known and world and known != world and job_id not in rejected:
            rejected[job_id] = ReportError(grpc.StatusCode.FAILED_PRECONDITION,
                                           f"samples[{i}]: job {job_id!r} has world size "
                                           f"{known}, report says {world}", "",
                                           "world_size_mismatch")
    if not drop:
        return
    for i, f in sorted(drop.items()):
        s = samples[i]
        ident = s.identity
        out.dropped.append(Dropped("rank_sample", f, f"samples[{i}]: {f.message}",
                                   job_id=ident.job_id[:MAX_JOB_ID], rank=ident.rank))
        if s.slot:
            out.slots.append(s.slot)
    _keep(samples, set(drop))


def _exited(r: pb.NodeReport, out: Admission) -> None:
    drop = set()
    for i, e in enumerate(r.exited):
        f = checks.check_exited(e)
        if f is not None:
            out.dropped.append(Dropped("exited", f, f"exited[{i}]: {f.message}",
                                       job_id=e.job_id[:MAX_JOB_ID], rank=e.rank))
            drop.add(i)
    if drop:
        _keep(r.exited, drop)


def _changes(r: pb.NodeReport, bounds: Bounds, out: Admission) -> None:
    drop = set()
    for i, c in enumerate(r.changes):
        f = checks.check_change(c, bounds)
        if f is not None:
            out.dropped.append(Dropped("change", f, f"changes[{i}]: {f.message}"))
            drop.add(i)
            if c.slot:
                out.slots.append(c.slot)
    if drop:
        _keep(r.changes, drop)


def _briefs(r: pb.NodeReport, out: Admission) -> None:
    """A brief with a reading out of range is dropped alone (its rank keeps
    its slot: the next brief counts)."""
    bad = checks.bad_briefs(r.briefs)
    if not bad:
        return
    b = r.briefs
    for i in bad:
        f = Fault("brief", "not_finite", f"briefs[{i}] (slot {b.slot[i]}): still_seconds, "
                  "cpu_utilization and cpu_seconds must be finite and >= 0")
        out.dropped.append(Dropped("brief", f, f.message))
    drop = set(bad)
    for name in ("slot", "still_seconds", "cpu_utilization", "cpu_seconds"):
        _keep(getattr(b, name), drop)
