"""``/api/v1/jobs``: the jobs, their ranks, active stalls with culprit stacks.

Plain dicts built on the event loop, serialised by the HTTP thread. Times
are given as ages ("for_seconds") and as wall-clock timestamps of this
daemon; never as another node's clock.
"""

from __future__ import annotations

import time
from typing import Any

from ncclwatch.daemon import progress
from ncclwatch.daemon.core import Daemon
from ncclwatch.daemon.incidents import TRACE_FIELDS, Incident
from ncclwatch.model import rank_ranges
from ncclwatch.stacks import short_path

API_VERSION = "v1"
MAX_STACK_FRAMES = 64


def jobs_view(d: Daemon, *, with_ranks: bool = True, now: float | None = None) -> dict[str, Any]:
    """``now``: the daemon's monotonic time (tests that drive a clock pass theirs)."""
    now = time.monotonic() if now is None else now
    wall = time.time()
    jobs = []
    for job_id, job in sorted(d.table.jobs.items()):
        b = d.budget_of(job_id, now)
        ranks = []
        if with_ranks:
            for r in sorted(job.ranks):
                rec = job.ranks[r]
                fresh = d.table.fresh(rec, now)
                ranks.append({
                    "rank": r, "local_rank": rec.local_rank, "host": rec.node, "pid": rec.pid,
                    "state": rec.state.value if fresh else "unknown",
                    "op": rec.op.value if rec.op.value != "none" else None,
                    "for_seconds": round(now - rec.since, 1),
                    "since": round(wall - (now - rec.since), 3),
                    "fresh": fresh, "gone": rec.gone_at is not None,
                    "last_seen_seconds": round(now - rec.seen, 1),
                    "stack_id": rec.stack_id or None,
                    "cpu_utilization": round(rec.cpu_util, 3), "rss_bytes": rec.rss_bytes,
                    "io_write_bytes": rec.io_write_bytes,
                    "write_bytes_per_second": round(rec.write_rate, 1),
                    "files_writing": _files(rec),
                    "memory_limits": [{"device": d, "used_bytes": u, "limit_bytes": lim}
                                      for d, u, lim in rec.limits],
                    "gpu": [{"device": i, "used_bytes": u, "total_bytes": t}
                            for i, u, t in rec.gpu],
                })
        jobs.append({
            "job": job_id, "source": job.source, "world_size": job.world_size,
            "ranks_reporting": job.live_ranks, "nodes": sorted(job.nodes),
            "watchdog": {"timeout_seconds": b.timeout, "timeout_source": b.source,
                         "remaining_seconds": round(b.remaining, 1),
                         "longest_blocked_rank": b.blocked_rank,
                         "longest_blocked_seconds": round(b.blocked_seconds, 1)},
            "hang_threshold": hang_threshold_view(d, job, now),
            "env": job.env,
            "config_warnings": [{"code": w.code, "severity": w.severity, "message": w.message}
                                for w in job.warnings],
            "stalls": [incident_view(d, i, now) for i in d.incidents.for_job(job_id)],
            "ranks": ranks,
        })
    return {"api": API_VERSION, "generated_at": wall, "jobs": jobs,
            "agents": agents_view(d, now)}


def hang_threshold_view(d: Daemon, job, now: float) -> dict[str, Any]:
    """The job's learned hang threshold now, its bounds, and what it learned per op."""
    policy = d.detect_cfg.waits
    return {"seconds": round(d.hang_threshold_of(job, now), 1), "floor_seconds": policy.floor,
            "ceiling_seconds": policy.ceiling, "by_op": job.waits.view(policy, now)}


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
    return {
        "id": inc.id, "kind": inc.kind.value, "active": inc.active, "summary": f.summary,
        "started_at": round(inc.started_wall, 3), "detected_at": round(inc.detected_wall, 3),
        "ended_at": round(inc.ended_wall, 3) if inc.ended_wall else None,
        "duration_seconds": round((inc.ended_at or now) - inc.started_at, 1),
        "detection_delay_seconds": round(inc.detected_at - inc.started_at, 1),
        "watchdog": {"timeout_seconds": inc.budget.timeout,
                     "remaining_seconds": round(inc.budget.remaining, 1),
                     "remaining_at_detection_seconds": round(inc.budget_at_detection.remaining, 1),
                     "min_remaining_seconds": round(inc.min_remaining, 1)},
        "culprits": [dict(rank=c.rank, host=c.node, pid=c.pid, state=c.state.value,
                          op=c.op.value if c.op.value != "none" else None,
                          for_seconds=round(c.for_seconds, 1),
                          **_culprit_progress(job, c.rank),
                          stack=stack_view(d, c.stack_id)) for c in f.culprits],
        "unknown_ranks": list(f.unknown),
        "waiting": {"ranks": list(f.waiting), "ops": [o.value for o in f.waiting_ops],
                    "stacks": [{"ranks": ranks, "stack": stack_view(d, sid)}
                               for sid, ranks in sorted(groups.items(), key=lambda x: x[1])]},
        "at_risk": inc.at_risk,
        "at_risk_since": (round(inc.started_wall + (inc.at_risk_since - inc.started_at), 3)
                          if inc.at_risk_since is not None else None),
        "diagnosis": {"root_cause": rc.id, "title": rc.title, "cause": dx.sentence,
                      "fix": rc.fix, "example": rc.example,
                      "runbook": f"docs/runbooks/{inc.kind.value}.md#{rc.id}",
                      "history": list(inc.root_causes)},
        "forecast": forecast_view(dx),
        "flight_recorder": progress.view(job, inc.started_at, now) if job else None,
        "rank_groups": rank_groups(d, job, now) if job else [],
        "env": {k: v for k, v in (job.env if job else {}).items() if k.startswith(RELEVANT_ENV)},
        "cause": dx.sentence, "fix": rc.fix,
        "trace_fields": list(TRACE_FIELDS),
        "trace": [list(p) for p in inc.trace],
    }


#: Env variables shown with an incident (the job view has all allowlisted ones).
RELEVANT_ENV = ("TORCH_NCCL_", "NCCL_", "TORCH_FR_", "TORCH_DISTRIBUTED_", "NCCLWATCH_")


def forecast_view(dx) -> dict[str, Any]:
    ev = dx.evidence
    w = ev.write
    return {
        "checkpoint": None if w is None else {
            "rank": w.rank, "path": w.path, "written_bytes": w.written_bytes,
            "expected_bytes": w.expected_bytes, "expected_source": w.expected_source or None,
            "previous_checkpoint": w.previous_path or None,
            "write_bytes_per_second": round(w.rate_bytes_per_second, 1),
            "eta_seconds": None if w.eta_seconds is None else round(w.eta_seconds, 1),
            "overrun_seconds": None if ev.overrun is None else round(ev.overrun, 1)},
        "memory": [{"rank": m.rank, "device": m.device, "used_bytes": m.used_bytes,
                    "limit_bytes": m.limit_bytes,
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
    missing = set(range(job.world_size)) - set(job.ranks)
    if missing:
        groups.setdefault(("", "unknown", "none"), []).extend(missing)
    out = []
    for (sid, state, op), ranks in sorted(groups.items(), key=lambda kv: (len(kv[1]),
                                                                         min(kv[1]))):
        out.append({"count": len(ranks), "ranks": rank_ranges(ranks), "state": state,
                    "op": None if op == "none" else op, "stack": stack_view(d, sid)})
    return out


def _files(rec) -> list[dict[str, Any]]:
    return [{"path": p, "size_bytes": s, "previous_path": pp or None,
             "previous_size_bytes": ps or None} for p, s, pp, ps in rec.files]


def _culprit_progress(job, rank: int) -> dict[str, Any]:
    rec = job.ranks.get(rank) if job else None
    if rec is None:
        return {}
    return {"rss_bytes": rec.rss_bytes, "write_bytes_per_second": round(rec.write_rate, 1),
            "files_writing": _files(rec)}


def stack_view(d: Daemon, stack_id: str) -> dict[str, Any] | None:
    s = d.table.stacks.get(stack_id) if stack_id else None
    if s is None:
        return None
    return {"id": stack_id, "thread": s.thread_name,
            "frames": [{"name": f.name, "file": short_path(f.filename), "line": f.line}
                       for f in s.frames[:MAX_STACK_FRAMES]]}


def agents_view(d: Daemon, now: float) -> list[dict[str, Any]]:
    out = []
    for a in sorted(d.table.agents.values(), key=lambda a: (a.node, a.agent_id)):
        out.append({"node": a.node, "agent_id": a.agent_id, "connected": a.connected,
                    "stale": a.stale(now, d.table.staleness),
                    "last_report_seconds": round(now - a.last_recv, 1),
                    "ranks_watched": a.health.ranks_watched, "nvml_up": a.health.nvml_up,
                    "version": a.health.version, "report_gaps": a.gaps_total})
    return out


def incidents_view(d: Daemon) -> dict[str, Any]:
    now = time.monotonic()
    return {"api": API_VERSION,
            "active": [incident_view(d, i, now) for i in d.incidents.active.values()],
            "ended": [incident_view(d, i, now) for i in reversed(d.incidents.ended)]}
