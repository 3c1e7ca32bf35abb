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

The table's judgments of a job are here too (``over_bounds``,
``over_bytes``: jobs, ranks and bytes per agent, node and daemon; the
table read, never written). core.py applies the rest, answers
``dropped_parts`` and counts each reason; it keeps the two judgments that
change the table (a job resized, which node owns a rank: ownership.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

import grpc

from ncclwatch.contract import checks
from ncclwatch.contract.bounds import Bounds
from ncclwatch.contract.checks import Fault
from ncclwatch.contract.limits import DEFAULT_BOUNDS, MAX_ID, MAX_JOB_ID
from ncclwatch.daemon.nodebudget import rank_cost
from ncclwatch.daemon.validate import ReportError, Shape, check_node, read_briefs, read_shape
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


#: A stack's wire digest and text (characters) as the daemon verified it, by id.
Held = Mapping[str, tuple[bytes, int]]


@dataclass
class Admission:
    """What to leave out of an admitted report (already taken out of it):
    ``dropped`` parts, ``rejected`` jobs (left out whole, by why) and the
    ``slots`` of dropped samples and changes (table.apply's left_out_slots:
    protocol 2 briefs of them are skipped).

    Also what the rest of ingest reads instead of the message: its ``shape``
    (validate.Shape: the briefs, those dropped taken out), the ids of stacks taken out
    because the daemon holds them as sent (``held``: they are touched, not
    checked, escaped or stored again) and the wire digest and text of each
    new stack that passed (``wire``, for ``Held`` once it is stored)."""

    dropped: list[Dropped] = field(default_factory=list)
    rejected: dict[str, ReportError] = field(default_factory=dict)
    slots: list[int] = field(default_factory=list)
    shape: Shape | None = field(default=None, compare=False)
    held: list[str] = field(default_factory=list, compare=False)
    wire: dict[str, tuple[bytes, int]] = field(default_factory=dict, compare=False)


def admit(req: pb.ReportRequest,
          world_size_of: Callable[[str], int | None] = lambda job: None,
          bounds: Bounds = DEFAULT_BOUNDS,
          holder_of: Callable[[str, int], int | None] = lambda job, rank: None,
          held: Held | None = None,
          check_job: Callable[[Any, Bounds], Fault | None] | None = None,
          prechecked: bool = False) -> Admission:
    """Check ``req``; raise ReportError for the node's own fault, else take
    each faulty part out of it and return what was left out and why.

    ``world_size_of`` gives a tracked job's world size, or None: a report
    may not change it (the job is left out, FAILED_PRECONDITION).
    ``holder_of`` gives the pid the daemon holds for a (job, rank), or None:
    of two processes claiming it in one report, that one keeps it.
    ``held``: the stacks the daemon holds (``Held``); one sent again byte for
    byte is taken out of the request, counted in the report's stack text.
    ``check_job``: how a sample's JobInfo is checked (checks.check_sample's
    hook; jobinfo.JobInfos.check remembers the verdict for a job's one).
    ``prechecked``: an ingest worker found nothing at fault that the table
    need not know (precheck.clean): only the table's judgments are left, the
    stacks (which it holds) and each job's world size."""
    shape = read_shape(req) if prechecked else check_node(req, bounds)
    r = req.report
    out = Admission(shape=shape)
    # Each part only where the report has some: a steady report is briefs alone.
    if shape.stacks:
        _stacks(r, bounds, out, held or {})
    if shape.samples:
        _samples(r, world_size_of, bounds, out, holder_of, check_job, prechecked)
    if prechecked:
        return out
    if shape.exited:
        _exited(r, out)
    if shape.changes:
        _changes(r, bounds, out)
    if shape.briefs.slot:
        _briefs(r, out)
    return out


def _keep(container, drop: set[int]) -> None:
    """Take the entries at indexes ``drop`` out of a repeated field."""
    kept = [x for i, x in enumerate(container) if i not in drop]
    del container[:]
    container.extend(kept)


def wire_digest(s: pb.Stack) -> bytes:
    """What a stack is as sent: the digest of its wire bytes."""
    return hashlib.blake2b(s.SerializeToString(), digest_size=16).digest()


def _stacks(r: pb.NodeReport, bounds: Bounds, out: Admission, held: Held) -> None:
    """Each stack, and their text in all: a stack that fails (or passes the
    report's total) leaves ``r`` alone. One the daemon holds as sent (the
    same id and wire digest: every agent of a job sends the job's few stacks
    once per stream) is not checked again: its frames were, with its text."""
    text, drop, known = 0, set(), set()
    stacks = r.stacks
    for i, s in enumerate(stacks):
        sid, wire = s.id, wire_digest(s)
        was = held.get(sid)
        if was is not None and was[0] == wire:
            f, n = None, was[1]
        else:
            f, n = checks.check_stack(s, bounds)
            was = None
        if f is None and text + n > bounds.max_report_stack_bytes:
            f = Fault("stack", "stack_too_big", f"{text + n} bytes of stack text in one report "
                      f"(max_report_stack_bytes {bounds.max_report_stack_bytes})",
                      "report_stack_bytes", checks.TOO_BIG)
        if f is not None:
            out.dropped.append(Dropped("stack", f, f.message, stack_id=sid[:MAX_ID]))
            drop.add(i)
            continue
        text += n
        if was is not None:
            known.add(i)
            out.held.append(sid)
        else:
            out.wire.setdefault(sid, (wire, n))
    if drop or known:
        _keep(stacks, drop | known)


def _samples(r: pb.NodeReport, world_size_of: Callable[[str], int | None], bounds: Bounds,
             out: Admission,
             holder_of: Callable[[str, int], int | None] = lambda job, rank: None,
             check_job: Callable[[Any, Bounds], Fault | None] | None = None,
             prechecked: bool = False) -> None:
    samples = r.samples
    drop: dict[int, Fault] = {}
    seen: dict[tuple[str, int], int] = {}
    for i, s in enumerate(() if prechecked else samples):
        f = checks.check_sample(s, bounds, check_job)
        if f is not None:
            drop[i] = f
            continue
        key = checks.rank_key(s.identity)
        j = seen.get(key)
        if j is not None:
            # The process the daemon already holds for the rank keeps it (a newcomer
            # never pushes it out); between newcomers, the contract's preference.
            holder, first = holder_of(*key), samples[j].identity.pid
            if holder is not None and holder in (first, s.identity.pid) \
                    and first != s.identity.pid:
                keep_first = holder == first
            else:
                keep_first = checks.prefer(samples[j], s)
            keep, lose = (j, i) if keep_first else (i, j)
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
    _worlds(samples, drop, world_size_of, out.rejected)
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


def _worlds(samples, drop: dict[int, Fault], world_size_of: Callable[[str], int | None],
            rejected: dict[str, ReportError]) -> None:
    """One world size per job. Where the report's samples of a job disagree, the
    job's is the one the daemon knows, else the one most of them say (the first
    said on a tie); the others are dropped alone: one process with a strange
    WORLD_SIZE costs its own sample, not its job's. Where they all agree on
    another size than the known one, the job is left out of this report
    (rejected, FAILED_PRECONDITION): a restarted job at a new size, which
    core._resized may take. 0 is a world size nobody stated (PMIx)."""
    by_job: dict[str, dict[int, list[int]]] = {}
    for i, s in enumerate(samples):
        if i not in drop and s.identity.world_size:
            by_job.setdefault(s.identity.job_id, {}).setdefault(
                s.identity.world_size, []).append(i)
    for job_id, worlds in by_job.items():
        known = world_size_of(job_id)
        if len(worlds) == 1:
            (world, idx), = worlds.items()
            if known and world != known:
                rejected[job_id] = ReportError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"samples[{idx[0]}]: job {job_id!r} has world size {known}, report "
                    f"says {world}", "", "world_size_mismatch")
            continue
        # The job's own: known, else most said, ties to the first said.
        first = {w: min(idx) for w, idx in worlds.items()}
        own = known or max(
            worlds, key=lambda w: (len(worlds[w]), -first[w]))
        for world, idx in worlds.items():
            if world == own:
                continue
            for i in idx:
                drop[i] = Fault("rank_sample", "world_size_mismatch",
                                f"job {job_id!r} has world size {own}, this process says "
                                f"{world}")


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
    bad = checks.bad_briefs(out.shape.briefs)
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
    out.shape = out.shape._replace(briefs=read_briefs(b))


# -- the table's judgments: a job left out whole ---------------------------------------


def node_jobs(table: Any, who: str) -> set[str]:
    """The jobs the agents of node identity ``who`` reported that the table holds."""
    agents = table.agents
    return set().union(*(agents[a].jobs for a in table.node_agents.get(who, ())
                         if a in agents))


def _leave_out(rejected: dict, job_id: str, why: str, bound: str, hits: list[str]) -> None:
    """A job of the report left out for a bound (the rest is applied)."""
    hits.append(bound)
    rejected[job_id] = ReportError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                   f"job {job_id!r} left out: {why}", bound,
                                   "job_over_bound")


def over_bounds(table: Any, report: pb.NodeReport, rejected: dict[str, ReportError],
                bounds: Bounds, who: str = "") -> list[str]:
    """Jobs, jobs per agent and per node, ranks per job: a job whose samples would pass
    a bound is left out of the report (RESOURCE_EXHAUSTED in rejected_jobs);
    what the daemon already tracks is never pushed out by newcomers."""
    b, hits = bounds, []
    samples = report.samples
    if not samples:
        return hits
    agent = table.agents.get(report.agent_id)
    mine = agent.jobs if agent is not None else set()
    n = len(samples)
    ids = dict.fromkeys(s.identity.job_id for s in samples)
    new_keys: dict[str, set] = {}
    for job_id in ids:
        job = table.jobs.get(job_id)
        if job_id in rejected or (job is not None and job_id in mine
                                  and len(job.ranks) + n <= b.max_ranks_per_job):
            continue  # the steady case: nothing here can pass a bound
        new_keys[job_id] = set()
    if not new_keys:
        return hits
    for s in samples:  # one pass: the ranks each job to check would gain
        ident = s.identity
        keys = new_keys.get(ident.job_id)
        if keys is None:
            continue
        job = table.jobs.get(ident.job_id)
        if ident.rank >= 0:
            if job is None or ident.rank not in job.ranks:
                keys.add(ident.rank)
        elif job is None or (report.node, ident.pid) not in job.unknown_keys:
            keys.add((report.node, ident.pid))
    jobs_left = b.max_jobs - len(table.jobs)
    agent_jobs = set(mine)
    of_node: set[str] | None = None     # computed once a job is new to the agent
    for job_id, keys in new_keys.items():
        job = table.jobs.get(job_id)
        new = job_id not in agent_jobs
        if new and of_node is None:
            of_node = node_jobs(table, who or report.node)
        why = ""
        if job is None and jobs_left <= 0:
            why, bound = f"the daemon tracks {len(table.jobs)} jobs (max_jobs " \
                         f"{b.max_jobs})", "jobs"
        elif job_id not in agent_jobs and len(agent_jobs) >= b.max_jobs_per_agent:
            why, bound = f"agent {report.agent_id[:8]} reports {len(agent_jobs)} jobs " \
                         f"(max_jobs_per_agent {b.max_jobs_per_agent})", "jobs_per_agent"
        elif new and job_id not in of_node and len(of_node) >= b.max_jobs_per_node:
            why, bound = f"node {who or report.node!r} reports {len(of_node)} jobs " \
                         f"(max_jobs_per_node {b.max_jobs_per_node})", "jobs_per_node"
        elif (len(job.ranks) if job else 0) + len(keys) > b.max_ranks_per_job:
            why, bound = f"job {job_id!r} would have over {b.max_ranks_per_job} ranks " \
                         f"(max_ranks_per_job)", "ranks_per_job"
        if why:
            _leave_out(rejected, job_id, why, bound, hits)
            continue
        jobs_left -= job is None
        agent_jobs.add(job_id)
        if of_node is not None:
            of_node.add(job_id)
    return hits


def over_bytes(table: Any, report: pb.NodeReport, rejected: dict[str, ReportError],
               bounds: Bounds, who: str) -> list[str]:
    """A job whose full samples would grow what node ``who`` holds past its
    bytes, or all nodes' past theirs, is left out of the report
    (RESOURCE_EXHAUSTED); what is held already is never pushed out. Return
    the labels of the bounds hit."""
    b, hits = bounds, []
    grow: dict[str, int] = {}
    node = report.node
    for s in report.samples:
        ident = s.identity
        job_id = ident.job_id
        if job_id in rejected:
            continue
        job = table.jobs.get(job_id)
        rec = None
        if job is not None:
            key = job.key_of(ident.rank, node, ident.pid, create=False)
            rec = job.ranks.get(key) if key is not None else None
        fr = job.flight_recorder.get(ident.rank) if job and job.flight_recorder else None
        d = rank_cost(s, fr[1] if fr else None) - (
            rec.cost if rec is not None and rec.payer == who else 0)
        if s.HasField("job"):
            d += s.job.ByteSize() - (job.facts_cost if job is not None
                                     and job.facts_payer == who else 0)
        grow[job_id] = grow.get(job_id, 0) + d
    mine, total = table.held.of(who), table.held.total
    for job_id, d in grow.items():
        why = ""
        if d > 0 and mine + d > b.max_node_bytes:
            why, bound = f"node {who!r} would hold {mine + d} bytes (max_node_bytes " \
                         f"{b.max_node_bytes})", "node_bytes"
        elif d > 0 and total + d > b.max_held_bytes:
            why, bound = f"the daemon would hold {total + d} bytes (max_held_bytes " \
                         f"{b.max_held_bytes})", "held_bytes"
        if why:
            _leave_out(rejected, job_id, why, bound, hits)
            continue
        mine += d
        total += d
    return hits
