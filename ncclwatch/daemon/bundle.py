"""``/api/v1/dump?job=J``: one job's evidence bundle, for the post-mortem.

Taken before the job is stopped, the stall's evidence is gone once it is: this
packs what the daemon holds of one job into one tar.gz that ``ncclwatch
diagnose`` reads back (diagnose/bundle.py) with the live verdict. Members,
under one folder named after the job and the time:

- ``bundle.json``: the format, this version, the job, when, and what the
  fresh ask brought (which ranks reported after it);
- ``verdict.json``: the job's stalls, active first, then ended (``incident_view``: kind, culprits,
  waiting ranks, diagnosis, fix, and the per-tick timeline ``trace``);
- ``job.json``: the job's view with every rank (``/api/v1/jobs?ranks=1``);
- ``env.json``: the job's allowlisted environment (as the agents sent it);
- ``stacks/rank-N.txt``: each rank's Python stack (every frame the daemon
  holds) and, where a native dump of its current still period was taken, its
  native stack and the wait it found;
- ``flight_recorder.json``: the live Flight Recorder summaries per rank and
  their cross-rank analysis.

A job whose stall lost it (outcome.py) has its bundle packed as it leaves
the table (``Daemon.kept_bundles``): the same URL serves it for a day.

``GET`` (and HEAD) serves what the daemon holds and asks nothing (``fresh``:
``{"asked": false}``). ``POST`` makes the fresh ask first, behind the guard
of dumpguard.py (own origin, a token or header, one dump per job, a rate per
client): the one the daemon makes during a stall, a Python dump of every rank
(py-spy --nonblocking: no pause), a native dump that the agents take only of
ranks already sitting still, within their pause budget (agent/pausing.py),
and the Flight Recorder through each rank's pipe. The HTTP handler waits for
the ranks' next reports and, where the job sets the debug pipe, their Flight
Recorder summaries, bounded (``MAX_WAIT``), then packs what is there.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
from typing import Any
from urllib.parse import parse_qs

from google.protobuf.json_format import MessageToDict

from ncclwatch import __version__
from ncclwatch.contract.health import FLIGHT_RECORDER_MIN_INTERVAL
from ncclwatch.daemon import api, progress
from ncclwatch.daemon.core import Daemon
from ncclwatch.model import rank_label

#: The bundle's format, in bundle.json (diagnose/bundle.py checks it).
FORMAT = "ncclwatch-bundle/1"
#: Seconds the daemon waits for the ranks' reports after a fresh ask, by
#: default and at most (a ``wait`` parameter between 0 and MAX_WAIT).
WAIT, MAX_WAIT = 5.0, 30.0
#: Frames written per stack (the daemon keeps at most this many anyway).
MAX_FRAMES = 512


def ask(d: Daemon, job_id: str) -> int:
    """Ask the job's agents for fresh stacks and Flight Recorder dumps now;
    the agents reached. KeyError: no such job."""
    why = "evidence bundle (ncclwatch dump)"
    n = d.request_stacks(job_id, why)
    d.request_native(job_id, why)    # still ranks only, within the pause budget
    d.request_flight_recorder(job_id, why)
    return n


def pending(d: Daemon, job_id: str, since: float) -> tuple[list[int], list[int]]:
    """Live ranks of the job that have not reported since ``since`` (daemon
    clock), and those with no Flight Recorder summary as fresh as an ask then
    can make, where the job sets the debug pipe the agents ask through (else
    none is coming). An agent asks a rank at most once per
    ``FLIGHT_RECORDER_MIN_INTERVAL`` (its own pacing): a dump taken within
    that before ``since`` is the one this ask gets."""
    job = d.table.jobs.get(job_id)
    if job is None:
        return [], []
    live = sorted(r for r, rec in job.ranks.items() if rec.gone_at is None)
    quiet = [r for r in live if job.ranks[r].seen < since]
    if not job.env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE"):
        return quiet, []
    oldest = since - FLIGHT_RECORDER_MIN_INTERVAL
    return quiet, [r for r in live if job.flight_recorder.get(r, (-1e18,))[0] < oldest]


def collect(d: Daemon, job_id: str, fresh: dict[str, Any] | None = None,
            now: float | None = None) -> dict[str, Any] | None:
    """On the event loop: the bundle's documents (None: no such job)."""
    job = d.table.jobs.get(job_id)
    if job is None:
        return None
    now = time.monotonic() if now is None else now
    view = api.jobs_view(d, api.JobsQuery(job=job_id, ranks=True, limit=api.MAX_RANKS_LIMIT),
                         now=now)
    ended = [i for i in reversed(d.incidents.ended) if i.job_id == job_id]
    stalls = [api.incident_view(d, i, now) for i in [*d.incidents.for_job(job_id), *ended]]
    stacks = {}
    for r, rec in sorted(job.ranks.items()):
        py = d.table.stacks.get(rec.stack_id) if rec.stack_id else None
        nat = d.table.stacks.get(rec.native_stack_id) if rec.native_stack_id else None
        stacks[rank_label(r)] = _stack_text(r, rec, py, nat, d.table.fresh(rec, now), now)
    fr = {rank_label(r): {"seconds_ago": round(now - at, 1),
                          "summary": MessageToDict(s, preserving_proto_field_name=True)}
          for r, (at, s) in sorted(job.flight_recorder.items())}
    return {
        "bundle": {"format": FORMAT, "version": __version__, "job": job_id,
                   "created_at": round(time.time(), 3), "fresh": fresh or {"asked": False}},
        "verdict": {"job": job_id, "stalls": stalls},
        "job": view["jobs"][0] if view["jobs"] else {},
        "env": dict(job.env),
        "stacks": stacks,
        "flight_recorder": {"ranks": fr, "analysis": progress.view(job, None, now)},
    }


def _stack_text(key: int, rec, st, native, fresh: bool, now: float) -> str:
    state = rec.state.value if fresh else "unknown"
    op = f" / {rec.op.value}" if rec.op.value != "none" else ""
    lines = [f"rank {rank_label(key)} on {rec.node}, pid {rec.pid}: {state}{op} "
             f"for {now - rec.since:.1f}s (last report {now - rec.seen:.1f}s ago)"]
    if rec.still_since is not None:
        lines.append(f"still for {now - rec.still_since:.1f}s")
    if rec.native_frame:
        lines.append(f"native dump: waits in {rec.native_frame} ({rec.evidence.value})")
    elif rec.native_no_wait:
        lines.append("native dump: found no wait in this still period")
    elif native is None:
        lines.append("native dump: none of this still period (the rank was not paused)")
    lines += _frames("python stack", st) + _frames("native stack", native)
    return "\n".join(lines) + "\n"


def _frames(title: str, st) -> list[str]:
    if st is None:
        return [f"{title}: none"]
    return [f"{title}, thread {st.thread_name or '?'} (innermost first):",
            *(f"  {f.name} ({f.filename}:{f.line})" for f in st.frames[:MAX_FRAMES])]


def archive_name(job_id: str, wall: float) -> str:
    """``ncclwatch-dump-<job>-<UTC time>``: the folder inside and the file's stem."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", job_id)[:80] or "job"
    return f"ncclwatch-dump-{safe}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(wall))}"


def archive(docs: dict[str, Any]) -> tuple[str, bytes]:
    """(file name, tar.gz bytes) of the documents ``collect`` made (any thread)."""
    top = archive_name(docs["bundle"]["job"], docs["bundle"]["created_at"])
    files = {f"{k}.json": json.dumps(docs[k], indent=1).encode()
             for k in ("bundle", "verdict", "job", "env", "flight_recorder")}
    for label, text in docs["stacks"].items():
        files[f"stacks/rank-{label}.txt"] = text.encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mtime, info.mode = len(data), int(docs["bundle"]["created_at"]), 0o644
            tar.addfile(info, io.BytesIO(data))
    return f"{top}.tar.gz", buf.getvalue()


def parse(query: str) -> tuple[str, float]:
    """``job`` and ``wait`` (seconds, 0: no fresh ask) from a query string, or
    ValueError (HTTP 400) saying what is wrong."""
    q = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    unknown = set(q) - {"job", "wait"}
    if unknown:
        raise ValueError(f"unknown parameter(s): {', '.join(sorted(unknown))}")
    if not q.get("job"):
        raise ValueError("job: which job to dump (?job=...)")
    try:
        wait = float(q.get("wait", WAIT))
    except ValueError:
        wait = -1.0
    if not 0 <= wait <= MAX_WAIT:
        raise ValueError(f"wait: seconds from 0 to {MAX_WAIT:.0f}")
    return q["job"], wait


def serve(d: Daemon, call, query: str, fresh_ask: bool = False) -> tuple[int, str, bytes,
                                                                         dict[str, str]]:
    """The HTTP answer (code, type, body, headers), in the handler's thread:
    ``call`` runs a function on the event loop. ``fresh_ask``: only for a POST
    the guard (dumpguard.py) let through; GET and HEAD pause nobody."""
    try:
        job_id, wait = parse(query)
    except ValueError as e:
        return 400, "text/plain", f"bad request: {e}\n".encode(), {}
    kept = call(lambda: None if job_id in d.table.jobs else d.kept_bundles.get(job_id))
    if kept is not None:  # a lost job that left the table: its bundle as it left
        _, name, body = kept
        return 200, "application/gzip", body, {
            "Content-Disposition": f'attachment; filename="{name}"'}
    fresh: dict[str, Any] = {"asked": False}
    if wait > 0 and fresh_ask:
        t0 = time.monotonic()   # the daemon's clock too (one process)
        try:
            agents = call(lambda: ask(d, job_id))
        except KeyError:
            return 404, "text/plain", b"no such job\n", {}
        deadline = time.monotonic() + wait
        quiet, no_fr = call(lambda: pending(d, job_id, t0))
        while (quiet or no_fr) and time.monotonic() < deadline:
            time.sleep(0.2)
            quiet, no_fr = call(lambda: pending(d, job_id, t0))
        fresh = {"asked": True, "agents": agents,
                 "waited_seconds": round(time.monotonic() - t0, 1),
                 "ranks_not_refreshed": [rank_label(r) for r in quiet],
                 "ranks_without_fresh_flight_recorder": [rank_label(r) for r in no_fr]}
    docs = call(lambda: collect(d, job_id, fresh))
    if docs is None:
        return 404, "text/plain", b"no such job\n", {}
    name, body = archive(docs)
    return 200, "application/gzip", body, {
        "Content-Disposition": f'attachment; filename="{name}"'}
