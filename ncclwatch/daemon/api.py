"""``/api/v1/jobs``: the jobs, their ranks, active stalls with culprit stacks.

Plain dicts: job heads and incidents built on the event loop, the per-rank
part and the JSON in the HTTP thread (``collect_jobs``/``finish_jobs``). Times
are given as ages ("for_seconds") and as wall-clock timestamps of this
daemon; never as another node's clock.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote

from ncclwatch import actions, advice, frameworks, gpuactivity, remediation, syscalls, timeoutsource
from ncclwatch.contract.checks import REASONS
from ncclwatch.daemon import clock, links, progress
from ncclwatch.daemon.core import Daemon
from ncclwatch.daemon.detect.hang import blocked_words
from ncclwatch.daemon.incidents import TRACE_FIELDS, Incident
from ncclwatch.model import rank_label, rank_ranges
from ncclwatch.stacks import short_path

API_VERSION = "v1"
MAX_STACK_FRAMES = 64


#: Page sizes: jobs per page (summaries), or ranks per page with ``ranks=1``.
JOBS_LIMIT, MAX_JOBS_LIMIT = 100, 1000
RANKS_LIMIT, MAX_RANKS_LIMIT = 1000, 20000


@dataclass(frozen=True)
class JobsQuery:
    """``/api/v1/jobs`` parameters: ``job``, ``ranks``, ``limit``, ``cursor``.

    Summaries by default (no per-rank list: ``rank_states`` groups the ranks);
    ``ranks=1`` adds each rank's detail. Pages are ordered by job id, then
    rank: ``limit`` jobs per page, or with ``ranks=1`` ``limit`` ranks (a job
    larger than a page continues on the next one); ``next_cursor`` resumes.
    """

    job: str | None = None
    ranks: bool = False
    limit: int = 0
    #: (job id, key of the page's first rank; None: the page starts after that job).
    #: Keys: rank numbers, and -1, -2, ... for members of unknown rank (first).
    cursor: tuple[str, int | None] | None = None

    @property
    def page_size(self) -> int:
        return self.limit or (RANKS_LIMIT if self.ranks else JOBS_LIMIT)

    @classmethod
    def parse(cls, query: str) -> "JobsQuery":
        """From a URL query string; ValueError (HTTP 400) names what is wrong."""
        q = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        unknown = set(q) - {"job", "ranks", "limit", "cursor"}
        if unknown:
            raise ValueError(f"unknown parameter(s): {', '.join(sorted(unknown))}")
        ranks = q.get("ranks", "0").lower()
        if ranks not in ("0", "1", "true", "false"):
            raise ValueError("ranks: 1 or 0")
        detail = ranks in ("1", "true")
        limit = 0
        if "limit" in q:
            top = MAX_RANKS_LIMIT if detail else MAX_JOBS_LIMIT
            if not q["limit"].isdigit() or not 1 <= int(q["limit"]) <= top:
                raise ValueError(f"limit: a whole number from 1 to {top}")
            limit = int(q["limit"])
        cursor = None
        if q.get("cursor"):
            cursor = _parse_cursor(q["cursor"])
        return cls(job=q.get("job") or None, ranks=detail, limit=limit, cursor=cursor)


#: A cursor's rank key: a rank, or a rank-less member's key (-1, -2, ...).
_KEY_RANGE = range(-(1 << 31), 1 << 31)
MAX_CURSOR = 1024


def _parse_cursor(text: str) -> tuple[str, int | None]:
    """``[job, rank key or null]`` as _cursor wrote it, or ValueError (HTTP 400):
    not JSON, not that shape, a float (``Infinity``, ``NaN``, ``1.5``), a key
    out of range, an overlong cursor."""
    bad = ValueError("cursor: not one this API gave out")
    if len(text) > MAX_CURSOR:
        raise bad
    try:
        got = json.loads(base64.urlsafe_b64decode(text.encode()),
                         parse_constant=_no_constant)
    except (ValueError, TypeError, binascii.Error, RecursionError):
        raise bad from None
    if not (isinstance(got, list) and len(got) == 2 and isinstance(got[0], str)
            and (got[1] is None or type(got[1]) is int and got[1] in _KEY_RANGE)):
        raise bad
    return got[0], got[1]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a cursor value")


def _cursor(job: str, rank: int | None) -> str:
    return base64.urlsafe_b64encode(json.dumps([job, rank]).encode()).decode()


@dataclass
class JobsPage:
    """What ``collect_jobs`` takes on the event loop; ``finish_jobs`` renders it."""

    now: float
    wall: float
    fresh: Any
    jobs: list[tuple[dict[str, Any], list, int, list | None]]  # head, ranks, world, detail
    agents: list  # AgentRecords (copied list), rendered by finish_jobs
    staleness: float
    next_cursor: str | None
    shards: dict[str, Any] | None = None  # ShardMap.view(): every shard's page
    #: Ended incidents kept (a day), newest first, with their outcome (ended_view).
    ended: list[dict[str, Any]] | None = None
    #: Node identity -> (its fault counts by reason, daemon time of the last).
    faults: dict[str, tuple[dict[str, int], float]] | None = None


def jobs_view(d: Daemon, query: JobsQuery | None = None, *, ranks: bool = True,
              now: float | None = None) -> dict[str, Any]:
    """Both steps at once (tests, the page); ``ranks``: detail when no query is given.

    ``now``: the daemon's monotonic time (tests that drive a clock pass theirs).
    """
    return finish_jobs(collect_jobs(d, query or JobsQuery(ranks=ranks), now))


def collect_jobs(d: Daemon, q: JobsQuery, now: float | None = None, *,
                 detail_upto: int = 0) -> JobsPage:
    """On the event loop: job heads, incidents, and list copies of the page's ranks.

    The per-rank work (states, detail dicts) and JSON are left to the HTTP
    thread, so a 16k-rank job does not hold the loop for the render.
    ``detail_upto``: jobs with at most this many ranks get their detail anyway
    (the page shows small jobs rank by rank).
    """
    now = time.monotonic() if now is None else now
    wall = time.time()
    jobs = d.table.jobs
    ids = sorted(jobs) if q.job is None else [q.job] if q.job in jobs else []
    if q.cursor:
        cj, cr = q.cursor
        ids = [j for j in ids if j > cj or (j == cj and cr is not None)]
    out: list[tuple[dict[str, Any], list, int, list | None]] = []
    budget, next_cursor = q.page_size, None
    for n, job_id in enumerate(ids):
        job = jobs[job_id]
        detail = None
        if not q.ranks and len(job.ranks) <= detail_upto:
            detail = sorted(job.ranks.items())
        elif q.ranks:
            first = q.cursor[1] if q.cursor and q.cursor[0] == job_id else None
            keys = sorted(r for r in job.ranks if first is None or r >= first)
            detail = [(r, job.ranks[r]) for r in keys[:budget]]
            budget -= len(detail)
        out.append((_job_head(d, job_id, job, now, wall), list(job.ranks.items()),
                     job.world_size, detail))
        if q.ranks and len(keys) > len(detail):
            next_cursor = _cursor(job_id, keys[len(detail)])
            break
        if (budget <= 0 or not q.ranks and len(out) >= budget) and n + 1 < len(ids):
            if q.ranks:                      # the next job, from its first rank
                nxt = ids[n + 1]
                next_cursor = _cursor(nxt, min(jobs[nxt].ranks, default=0))
            else:
                next_cursor = _cursor(job_id, None)
            break
    return JobsPage(now=now, wall=wall, fresh=d.table.fresh, jobs=out,
                    agents=list(d.table.agents.values()), staleness=d.table.staleness,
                    next_cursor=next_cursor,
                    shards=d.config.shards.view() if d.config.shards else None,
                    ended=ended_view(d, now) if q.job is None and q.cursor is None else None,
                    faults=node_faults(d))


def finish_jobs(p: JobsPage) -> dict[str, Any]:
    """The per-rank part of the view (any thread: it only reads the copied lists)."""
    now, wall = p.now, p.wall
    jobs = []
    for head, recs, world, detail in p.jobs:
        job = dict(head)
        job["rank_states"] = rank_states(recs, world, p.fresh, now)
        if detail is not None:
            job["ranks"] = [_rank(r, rec, p.fresh(rec, now), now, wall) for r, rec in detail]
        jobs.append(job)
    out = {"api": API_VERSION, "generated_at": wall, "jobs": jobs,
           "agents": agents_view(p.agents, now, p.staleness, p.faults),
           "next_cursor": p.next_cursor}
    if p.shards is not None:
        out["shards"] = p.shards
    if p.ended is not None:
        out["ended"] = p.ended
    return out


def _assumed_view(b) -> dict[str, Any]:
    """Whether the budget's timeout is a guess, and the clause that says so
    (timeoutsource.note; empty when the job or the operator stated it)."""
    return {"timeout_assumed": b.assumed, "timeout_note": timeoutsource.note(b.timeout, b.source)}


def _job_head(d: Daemon, job_id: str, job, now: float, wall: float) -> dict[str, Any]:
    b = d.budget_of(job_id, now)
    return {
        "job": job_id, "source": job.source, "world_size": job.world_size,
        "scheduler_job": job.scheduler_job,
        "ranks_reporting": job.live_ranks, "nodes": sorted(job.nodes),
        "watchdog": {"timeout_seconds": b.timeout, "timeout_source": b.source,
                     **_assumed_view(b),
                     "remaining_seconds": _down(b.remaining),
                     "longest_blocked_rank": b.blocked_rank,
                     "longest_blocked_seconds": round(b.blocked_seconds, 1)},
        "hang_threshold": hang_threshold_view(d, job, now),
        "timeout_changes": [{"seconds_ago": round(now - t, 1), "timeout": what,
                             "from_seconds": old, "to_seconds": new, "host": node,
                             "rank": rank}
                            for t, what, old, new, node, rank in job.timeout_changes],
        "contested_ranks": contested_view(d, job_id, job, now),
        "env": dict(job.env),
        "config_warnings": [{"code": w.code, "severity": w.severity, "message": w.message}
                            for w in job.warnings],
        "stalls": [incident_view(d, i, now) for i in d.incidents.for_job(job_id)],
        **({"shard": d.config.shards.job_view(job_id)} if d.config.shards else {}),
    }


def contested_view(d: Daemon, job_id: str, job, now: float) -> list[dict[str, Any]]:
    """Ranks another node also reports (ownership.py): who owns each, who else
    claims it, and what each showed of the process."""
    out = []
    for rank in d.ownership.ranks_of(job_id):
        rec = job.ranks.get(rank)
        rivals = d.ownership.of(job_id, rank, now)
        if rec is None or not rivals:
            continue
        out.append({"rank": rank, "owner": {"host": rec.node, "pid": rec.pid,
                                            "started_seconds_ago": _ago(rec.start, now)},
                    "contenders": [{"host": c.node, "pid": c.pid,
                                    "started_seconds_ago": _ago(c.start, now),
                                    "last_seen_seconds": round(now - c.seen, 1)}
                                   for c in rivals]})
    return out


def _ago(t: float | None, now: float) -> float | None:
    return None if t is None else round(now - t, 1)


def unreported(keys: set[int], world: int, unidentified: int) -> list[int]:
    """Rank numbers no record has, shown as unknown, unless the job's live members
    of unknown rank (each one of those numbers) account for all of them."""
    numbered = sum(1 for k in keys if k >= 0)
    if world - numbered <= unidentified:
        return []
    return [r for r in range(world) if r not in keys]


def rank_states(ranks: list, world: int, fresh, now: float) -> list[dict[str, Any]]:
    """Every rank of the job by state (and op), as counts and rank ranges.

    ``ranks``: (key, record) pairs; members of unknown rank (keys -1, -2, ...)
    read '?1', '?2', and each stands for one of the numbers nobody reported."""
    groups: dict[tuple[str, str], list[int]] = {}
    seen, unidentified = set(), 0
    # A member numbered later leaves its '?N' record behind (gone): the same
    # process, now counted under its number, is not an unknown rank too.
    numbered = {(rec.node, rec.pid) for r, rec in ranks if r >= 0 and rec.gone_at is None}
    for r, rec in ranks:
        if r < 0 and rec.gone_at is not None and (rec.node, rec.pid) in numbered:
            continue
        key = (rec.state.value, rec.op.value) if fresh(rec, now) else ("unknown", "none")
        groups.setdefault(key, []).append(r)
        seen.add(r)
        unidentified += r < 0 and rec.gone_at is None
    missing = unreported(seen, world, unidentified)
    if missing:
        groups.setdefault(("unknown", "none"), []).extend(missing)
    return [{"state": state, "op": None if op == "none" else op, "count": len(ranks),
             "ranks": rank_ranges(ranks)} for (state, op), ranks in sorted(groups.items())]


def _rank(r: int, rec, fresh: bool, now: float, wall: float) -> dict[str, Any]:
    return {
        "rank": r if r >= 0 else None, "member": rank_label(r),
        "identified_by": rec.rank_source or "env:RANK",
        "rank_conflict": rec.rank_conflict or None,
        "local_rank": rec.local_rank, "host": rec.node, "pid": rec.pid,
        "container": container_view(rec.container),
        "state": rec.state.value if fresh else "unknown",
        "op": rec.op.value if rec.op.value != "none" else None,
        "for_seconds": round(now - rec.since, 1),
        "since": round(wall - (now - rec.since), 3),
        "fresh": fresh, "gone": rec.gone_at is not None,
        "last_seen_seconds": round(now - rec.seen, 1),
        "stack_id": rec.stack_id or None,
        **_waiting_evidence(rec, fresh, now),
        "cpu_utilization": round(rec.cpu_util, 3), "rss_bytes": rec.rss_bytes,
        "io_write_bytes": rec.io_write_bytes,
        "write_bytes_per_second": round(rec.write_rate, 1),
        "files_writing": _files(rec),
        "memory_limits": [{"device": dv, "used_bytes": u, "limit_bytes": lim}
                          for dv, u, lim in rec.limits],
        "gpu": _gpus(rec),
    }


def _gpus(rec) -> list[dict[str, Any]]:
    """The rank's devices: its memory there, and the device's utilisation, power and judged activity."""
    act = {a[0]: a for a in rec.gpu_activity}
    out = []
    for i, u, t in rec.gpu:
        _, util, power, limit = act.get(i, (i, -1, -1.0, 0.0))
        out.append({"device": i, "used_bytes": u, "total_bytes": t,
                    "util_percent": util if util >= 0 else None,
                    "power_watts": round(power, 1) if power >= 0 else None,
                    "power_limit_watts": round(limit, 1) if limit > 0 else None,
                    "activity": gpuactivity.judge(util, power, limit)})
    return out


def _waiting_evidence(rec, fresh: bool, now: float) -> dict[str, Any]:
    """How the rank's waiting was established (issue 18), and its stillness."""
    ev = rec.evidence.value if fresh and rec.evidence.value != "none" else None
    return {"evidence": ev, "native_frame": (rec.native_frame or None) if ev else None,
            "still_seconds": (round(now - rec.still_since, 1)
                              if fresh and rec.still_since is not None else None),
            # A native dump of this still period found no wait: never called waiting.
            "still_reason": "unknown" if fresh and rec.native_no_wait else None}


def evidence_view(f) -> dict[str, list[int | str]]:
    """The finding's waiting ranks by how their waiting was established."""
    out: dict[str, list[int]] = {}
    for r, ev in f.evidence:
        out.setdefault(ev.value, []).append(r)
    return {k: _keys(v) for k, v in sorted(out.items())}


def hang_threshold_view(d: Daemon, job, now: float) -> dict[str, Any]:
    """The job's learned hang threshold now, its bounds, and what it learned per op."""
    policy = d.detect_cfg.waits
    return {"seconds": round(d.hang_threshold_of(job, now), 1), "floor_seconds": policy.floor,
            "ceiling_seconds": policy.ceiling, "by_op": job.waits.view(policy, now)}


def _down(seconds: float) -> float:
    """Seconds of budget to one decimal, rounded down: shown time is never more
    than the time there is."""
    return math.floor(seconds * 10) / 10


def incident_view(d: Daemon, inc: Incident, now: float | None = None) -> dict[str, Any]:
    now = time.monotonic() if now is None else now
    f = inc.finding
    job = d.table.jobs.get(inc.job_id)
    groups: dict[str, list[int]] = {}
    for r in f.waiting:
        rec = job.ranks.get(r) if job else None
        groups.setdefault(rec.stack_id if rec else "", []).append(r)
    dx = inc.diagnosis
    rc = dx.root_cause
    culprits = [dict(rank=c.rank if c.rank >= 0 else None, member=rank_label(c.rank),
                     identified_by=_identified_by(job, c.rank),
                     host=c.node, pid=c.pid,
                     container=container_view(_rec_container(job, c.rank)),
                     state=c.state.value,
                     op=c.op.value if c.op.value != "none" else None,
                     # at the view's one clock (clock.py), not the last tick's
                     for_seconds=round(_for_seconds(job, c, now), 1),
                     **_seen_for(job, c, now),
                     **_culprit_progress(job, c.rank),
                     stack=stack_view(d, c.stack_id)) for c in f.culprits]
    waiting_stacks = [{"ranks": _keys(ranks), "stack": stack_view(d, sid)}
                      for sid, ranks in sorted(groups.items(), key=lambda x: x[1])]
    # The job's framework: what it imported (the agents' evidence, and the full
    # paths of the frames it shows: installed packages), paths only confirm.
    files = [fr.filename for sid in [c.stack_id for c in f.culprits] + list(groups)
             if sid and (st := d.table.stacks.get(sid)) for fr in st.frames]
    fw = frameworks.detect(files, job.packages if job else ())
    left = inc.budget.aged(now) if inc.active else inc.budget  # as it stands now
    return {
        "id": inc.id, "kind": inc.kind.value, "active": inc.active, "summary": f.summary,
        "started_at": round(inc.started_wall, 3), "detected_at": round(inc.detected_wall, 3),
        "ended_at": round(inc.ended_wall, 3) if inc.ended_wall else None,
        "duration_seconds": round((inc.ended_at or now) - inc.started_at, 1),
        "detection_delay_seconds": round(inc.detected_at - inc.started_at, 1),
        "watchdog": {"timeout_seconds": inc.budget.timeout,
                     "timeout_source": inc.budget.source, **_assumed_view(inc.budget),
                     "remaining_seconds": _down(left.remaining),
                     "remaining_at_detection_seconds": round(inc.budget_at_detection.remaining, 1),
                     "min_remaining_seconds": _down(min(inc.min_remaining, left.remaining))},
        "culprits": culprits,
        "unknown_ranks": list(f.unknown),
        "waiting": {"ranks": _keys(f.waiting), "ops": [o.value for o in f.waiting_ops],
                    "evidence": evidence_view(f), "provisional": f.provisional,
                    "stacks": waiting_stacks},
        # The hang threshold that made the finding: learned from the job's steps,
        # or the fixed ceiling (before its first step); None for kinds without one.
        "threshold": ({"basis": f.threshold_basis, "seconds": round(f.threshold_seconds, 1)}
                      if f.threshold_basis and f.threshold_seconds is not None else None),
        "at_risk": inc.at_risk,
        "at_risk_since": (round(inc.started_wall + (inc.at_risk_since - inc.started_at), 3)
                          if inc.at_risk_since is not None else None),
        "diagnosis": {"root_cause": rc.id, "title": rc.title, "cause": dx.sentence,
                      "fix": rc.fix, "example": rc.example,
                      "runbook": f"docs/runbooks/{inc.kind.value}.md#{rc.id}",
                      "runbook_url": f"{_runbook_base(d)}{inc.kind.value}.md#{rc.id}",
                      "history": list(inc.root_causes),
                      "framework": {"id": fw.id, "name": fw.name},
                      "fixes": remediation.fixes_view(fw.id, rc.id)},
        "advice": advice.view(dx.advice, f"{_runbook_base(d)}{inc.kind.value}.md",
                              _commands(job, f)),
        "forecast": forecast_view(dx),
        "clock": clock.view(inc, job, now),
        "flight_recorder": progress.view(job, inc.started_at, now) if job else None,
        "rank_groups": rank_groups(d, job, now) if job else [],
        "env": {k: v for k, v in (job.env if job else {}).items() if k.startswith(RELEVANT_ENV)},
        "cause": dx.sentence, "fix": rc.fix,
        "trace_fields": list(TRACE_FIELDS),
        "trace": [list(p) for p in inc.trace],
        **outcome_view(inc),
    }


def _commands(job, f) -> list[dict[str, str]]:
    """How to act on the job where it runs (actions.py), for its first culprit."""
    if not f.culprits:
        return []
    c = f.culprits[0]
    ctr = _rec_container(job, c.rank) or (0, "", "", "", "", "", "", "", "")
    sched = (job.scheduler_job or {}) if job else {}
    rec = job.ranks.get(c.rank) if job else None
    # The process the culprit's pid named when its agent saw it: only while the
    # record is of that same pid (else unknown: no command names the pid).
    start_ticks, uid = rec.proc_id if rec is not None and rec.pid == c.pid else (0, -1)
    return actions.commands(actions.Facts(
        job_id=f.job_id, rank=c.rank, node=c.node, pid=c.pid,
        start_ticks=start_ticks, uid=uid,
        slurm_job=sched.get("job_id", "") if sched.get("scheduler") == "slurm" else "",
        namespace=ctr[5], pod=ctr[6], container_pid=ctr[0],
        pipe_stem=(job.env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "") if job else "")))


def _for_seconds(job, c, now: float) -> float:
    """How long the culprit has been doing what it does, at the view's clock."""
    rec = job.ranks.get(c.rank) if job else None
    return max(0.0, now - rec.since) if rec is not None and rec.since > 0 else c.for_seconds


def _seen_for(job, c, now: float) -> dict[str, float]:
    """``for_seconds_min``: at least this long (the first report that showed the
    state), where the start is known only as a span (clock.seen_for)."""
    rec = job.ranks.get(c.rank) if job else None
    at_least = clock.seen_for(rec, now) if rec is not None else None
    return {} if at_least is None else {"for_seconds_min": round(at_least, 1)}


def _runbook_base(d: Daemon) -> str:
    """Where the runbooks are for operators: --runbook-url, else this daemon's own
    (relative: it works through whatever address the reader used)."""
    return links.runbook_base(d.config.runbook_url, "")


#: Env variables shown with an incident (the job view has all allowlisted ones).
RELEVANT_ENV = ("TORCH_NCCL_", "NCCL_", "TORCH_FR_", "TORCH_DISTRIBUTED_", "NCCLWATCH_")


def forecast_view(dx) -> dict[str, Any]:
    ev = dx.evidence
    w = ev.write
    return {
        "checkpoint": None if w is None else {
            "rank": _keys([w.rank])[0], "path": w.path, "written_bytes": w.written_bytes,
            "expected_bytes": w.expected_bytes, "expected_source": w.expected_source or None,
            "previous_checkpoint": w.previous_path or None,
            "expected_exact": w.exact,
            "write_bytes_per_second": round(w.rate_bytes_per_second, 1),
            "rate_source": w.rate_source or None,
            "eta_seconds": None if w.eta_seconds is None else round(w.eta_seconds, 1),
            "overrun_seconds": None if ev.overrun is None else round(ev.overrun, 1)},
        "memory": [{"rank": _keys([m.rank])[0], "device": m.device, "used_bytes": m.used_bytes,
                    "limit_bytes": m.limit_bytes,
                    # hidden on the page and in status when it does not bear on the
                    # stall (a host-memory ETA during a save that ends first)
                    "applies": ev.memory_applies(m),
                    "growth_bytes_per_second": round(m.rate_bytes_per_second, 1),
                    "eta_seconds": None if m.eta_seconds is None else round(m.eta_seconds, 1)}
                   for m in ev.memory],
    }


def rank_groups(d: Daemon, job, now: float) -> list[dict[str, Any]]:
    """All ranks grouped by identical stack, smallest (the outliers) first."""
    groups: dict[tuple[str, str, str], list[int]] = {}
    for r, rec in job.ranks.items():
        fresh = d.table.fresh(rec, now)
        key = (rec.stack_id if fresh else "", rec.state.value if fresh else "unknown",
               rec.op.value if fresh else "none")
        groups.setdefault(key, []).append(r)
    missing = unreported(set(job.ranks), job.world_size, job.unidentified)
    if missing:
        groups.setdefault(("", "unknown", "none"), []).extend(missing)
    out = []
    for (sid, state, op), ranks in sorted(groups.items(), key=lambda kv: (len(kv[1]),
                                                                         min(kv[1]))):
        out.append({"count": len(ranks), "ranks": rank_ranges(ranks), "state": state,
                    "op": None if op == "none" else op, "stack": stack_view(d, sid)})
    return out


def _keys(keys) -> list[int | str]:
    """Rank numbers, and '?1'-style labels for members whose rank is unknown."""
    return [k if k >= 0 else rank_label(k) for k in keys]


def container_view(c: tuple | None) -> dict[str, Any] | None:
    """The container a rank runs in (None: on the host): its own pid there,
    hostname, runtime's id, the Kubernetes pod the node names, and the pod
    the rank's environment declares."""
    if not c:
        return None
    pid, hostname, cid, runtime, uid, namespace, pod, dns, dpod = c
    return {"pid": pid or None, "hostname": hostname or None, "id": cid or None,
            "runtime": runtime or None, "pod_uid": uid or None,
            "namespace": namespace or None, "pod": pod or None,
            # The rank's own POD_NAMESPACE/POD_NAME: its word, never a label.
            "declared_by_rank": {"namespace": dns or None, "pod": dpod} if dpod else None}


def _rec_container(job, key: int) -> tuple | None:
    rec = job.ranks.get(key) if job else None
    return rec.container if rec else None


def _identified_by(job, key: int) -> str:
    rec = job.ranks.get(key) if job else None
    return (rec.rank_source or "env:RANK") if rec else "unknown"


def _files(rec) -> list[dict[str, Any]]:
    return [{"path": p, "size_bytes": s, "previous_path": pp or None,
             "previous_size_bytes": ps or None, "expected_size_bytes": es or None,
             "expected_source": src or None} for p, s, pp, ps, es, src in rec.files]


def _culprit_progress(job, rank: int) -> dict[str, Any]:
    rec = job.ranks.get(rank) if job else None
    if rec is None:
        return {}
    # What its thread is blocked in, while it sits still (hang.blocked_words).
    call, wchan = syscalls.parse(rec.blocked_in) if blocked_words(rec) else ("", "")
    return {"rss_bytes": rec.rss_bytes, "write_bytes_per_second": round(rec.write_rate, 1),
            "files_writing": _files(rec), "blocked_in": blocked_words(rec) or None,
            "syscall": call or None, "wchan": wchan or None}


def stack_view(d: Daemon, stack_id: str) -> dict[str, Any] | None:
    s = d.table.stacks.get(stack_id) if stack_id else None
    if s is None:
        return None
    return {"id": stack_id, "thread": s.thread_name,
            "frames": [{"name": f.name, "file": short_path(f.filename), "line": f.line}
                       for f in s.frames[:MAX_STACK_FRAMES]]}


#: Seconds a node's last dropped part or refused report keeps it said as
#: faulty (page in red, ``ncclwatch status``): a few rounds' worth and more.
FAULT_RECENT_SECONDS = 300.0


def node_faults(d: Daemon) -> dict[str, tuple[dict[str, int], float]]:
    """On the loop: each node identity's fault counts (parts of its reports
    dropped, reports refused whole) and when the last one was."""
    at = d.node_fault_at
    return {who: (dict(n), at.get(who, 0.0))
            for who, n in d.node_faults.items() if n}


def agents_view(agents: list, now: float, staleness: float,
                faults: dict[str, tuple[dict[str, int], float]] | None = None
                ) -> list[dict[str, Any]]:
    """One row per agent; ``faults`` (node_faults) go on every agent of the node
    identity, and a node whose every report was refused (no agent held) still
    gets a row: a blind node is never left out."""
    faults = faults or {}
    out = []
    for a in sorted(agents, key=lambda a: (a.node, a.agent_id)):
        out.append({"node": a.node, "agent_id": a.agent_id, "connected": a.connected,
                    "stale": a.stale(now, staleness),
                    "last_report_seconds": round(now - a.last_recv, 1),
                    "ranks_watched": a.health.ranks_watched, "nvml_up": a.health.nvml_up,
                    "version": a.health.version, "report_gaps": a.gaps_total,
                    **_with_left_out(_faults_of(faults.get(a.identity or a.node), now),
                                     a, now)})
    held = {a.identity or a.node for a in agents}
    for who in sorted(set(faults) - held):
        out.append({"node": who, "agent_id": "", "connected": False, "stale": True,
                     "last_report_seconds": None, "ranks_watched": 0, "nvml_up": False,
                     "version": "", "report_gaps": 0, **_faults_of(faults[who], now),
                     "left_out": {}, "left_out_seconds_ago": None})
    return out


def _with_left_out(view: dict[str, Any], a, now: float) -> dict[str, Any]:
    """The agent's own side (checks.REASONS order): ``left_out``, the samples it
    left out before sending, by reason; recent ones make the node's faults
    recent too (a node whose agent catches every bad part is no less faulty)."""
    counts = {r: n for r, n in zip(REASONS, a.health.parts_left_out) if n}
    ago_ = None if a.left_out_at is None else round(max(0.0, now - a.left_out_at), 1)
    recent = ago_ is not None and ago_ <= FAULT_RECENT_SECONDS
    return {**view, "left_out": counts, "left_out_seconds_ago": ago_,
            "faults_recent": view["faults_recent"] or recent}


def _faults_of(f: tuple[dict[str, int], float] | None, now: float) -> dict[str, Any]:
    """``faults``: counts by reason since the daemon started; ``faults_recent``:
    the last was under FAULT_RECENT_SECONDS ago (say it loud)."""
    if not f:
        return {"faults": {}, "last_fault_seconds_ago": None, "faults_recent": False}
    counts, at = f
    ago_ = round(max(0.0, now - at), 1)
    return {"faults": dict(sorted(counts.items())), "last_fault_seconds_ago": ago_,
            "faults_recent": ago_ <= FAULT_RECENT_SECONDS}


def outcome_view(inc: Incident) -> dict[str, Any]:
    """How the incident ended for the job (outcome.py), and its first save
    forecast scored against that; both None while active or settling."""
    o, sc, f = inc.outcome, inc.score, inc.forecast
    return {
        "outcome": None if o is None else {
            "outcome": o.outcome, "lost": o.lost, "sentence": o.sentence,
            "waited_seconds": o.waited_seconds,
            "lost_rank": None if o.lost_rank is None else rank_label(o.lost_rank),
            "lost_host": o.lost_host or None},
        "forecast_score": None if f is None else {
            "verdict": f.verdict,
            "made_seconds_into_stall": round(f.made_at - inc.started_at, 1),
            "predicted_end_seconds": round(f.ends_at - inc.started_at, 1),
            "budget_end_seconds": round(f.budget_ends_at - inc.started_at, 1),
            "happened": sc.happened if sc else None, "right": sc.right if sc else None,
            "error_seconds": sc.error_seconds if sc else None},
    }


def ended_view(d: Daemon, now: float) -> list[dict[str, Any]]:
    """Ended incidents kept (incidents.KEEP_ENDED), newest first, in brief: also
    those of jobs that left the table, with a link to the evidence bundle where
    one can be had (the job is held, or its bundle was kept as it left)."""
    out = []
    for inc in reversed(d.incidents.ended):
        f = inc.finding
        bundle = inc.job_id in d.table.jobs or inc.job_id in d.kept_bundles
        out.append({
            "id": inc.id, "job": inc.job_id, "kind": inc.kind.value,
            "job_held": inc.job_id in d.table.jobs,
            "started_at": round(inc.started_wall, 3),
            "ended_at": round(inc.ended_wall, 3) if inc.ended_wall else None,
            "ended_seconds_ago": round(now - inc.ended_at, 1) if inc.ended_at else None,
            "duration_seconds": round((inc.ended_at or now) - inc.started_at, 1),
            "culprits": [{"rank": rank_label(c.rank), "host": c.node, "state": c.state.value}
                         for c in f.culprits],
            "unknown_ranks": [rank_label(r) for r in f.unknown],
            "root_cause": inc.diagnosis.root_cause.id, "cause": inc.diagnosis.sentence,
            "evidence_bundle": (f"/api/v1/dump?job={quote(inc.job_id, safe='')}"
                                if bundle else None),
            **outcome_view(inc),
        })
    return out


def incidents_view(d: Daemon) -> dict[str, Any]:
    now = time.monotonic()
    return {"api": API_VERSION,
            "active": [incident_view(d, i, now) for i in d.incidents.active.values()],
            "ended": [incident_view(d, i, now) for i in reversed(d.incidents.ended)]}
