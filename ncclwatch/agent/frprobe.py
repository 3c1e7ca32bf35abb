"""Ask the job itself: live Flight Recorder dumps of the ranks during a stall.

When the daemon suspects a stall it sends DumpFlightRecorder for the job.
For each rank of the job on this node whose environment names a debug-info
pipe, the probe writes one byte to the rank's FIFO (frpipe.trigger: never
blocking, never anything but a FIFO), then watches the dump file on later
rounds until torch has rewritten it, reads it, and hands back a compact
per-process-group summary for the rank's next sample. Training goes on: the
dump is written by torch's own thread.

Paths are the ones the rank sees: they are reached through
``/proc/<pid>/root`` (and ``/proc/<pid>/cwd`` for relative ones), so a rank in
a container is asked through its own mount namespace.
"""

from __future__ import annotations

import logging
import os
import pwd
import time
from dataclasses import dataclass
from typing import Iterable

from ncclwatch.agent import caps, frpipe
from ncclwatch.agent.discover import RankProcess
from ncclwatch.contract import health
from ncclwatch.flightrec import FrDump, summarize
from ncclwatch.sanitize import gate
from ncclwatch.v1 import collector_pb2 as pb

log = logging.getLogger(__name__)

#: Give up on a dump that did not appear this long after the trigger (torch
#: polls its pipe every second with dump-on-timeout on, else every 8 minutes).
WAIT_SECONDS = 15.0
#: Ask one rank at most this often, whatever the daemon says.
MIN_INTERVAL = health.FLIGHT_RECORDER_MIN_INTERVAL


def _in_ns(pid: int, path: str) -> str:
    """The path as the rank sees it, reached from here. A rank that has exited has no
    /proc entry: the path then does not exist (no fallback to this agent's own view,
    where the same name may be another process's pipe)."""
    if os.path.isabs(path):
        return f"/proc/{pid}/root{path}"
    return f"/proc/{pid}/cwd/{path}"


def _env_with_home(proc: RankProcess) -> dict[str, str]:
    """The allowlisted env with the raw paths the agent keeps for itself (a
    redacted path would name no file), plus HOME (torch's default dump prefix
    is under it)."""
    env = {**proc.env, **proc.local}
    if "HOME" not in env:
        try:
            env["HOME"] = pwd.getpwuid(os.stat(f"/proc/{proc.pid}").st_uid).pw_dir
        except (OSError, KeyError):
            pass
    return env


def summary_pb(dump: FrDump, written_at: float, now_wall: float) -> pb.FlightRecorderSummary:
    """The compact summary the daemon gets (per group: seq ids, pending op, timeout)."""
    out = pb.FlightRecorderSummary(version=gate("FlightRecorderSummary.version", dump.version),
                                   dump_age_seconds=max(0.0, now_wall - written_at))
    groups = summarize(dump)
    kept = _within_caps(groups)
    if len(kept) < len(groups):
        caps.COUNTS.flight_recorder_trimmed_total += 1
    for p in kept:
        pending_s = 0.0
        if p.pending_since_ns:
            pending_s = max(0.0, written_at - p.pending_since_ns / 1e9)
        out.groups.append(pb.ProcessGroupProgress(
            # Names inside a dump are the job's text: escaped and capped like any.
            pg_id=gate("ProcessGroupProgress.pg_id", p.pg_id),
            pg_name=gate("ProcessGroupProgress.pg_name", p.pg_name),
            pg_desc=gate("ProcessGroupProgress.pg_desc", p.pg_desc), ranks=list(p.ranks),
            last_enqueued=p.last_enqueued, last_started=p.last_started,
            last_completed=p.last_completed, pending_op=gate("ProcessGroupProgress.pending_op", p.pending_op),
            pending_seq=p.pending_seq,
            pending_timeout_ms=p.pending_timeout_ms or p.timeout_ms or 0,
            pending_seconds=pending_s, last_op=gate("ProcessGroupProgress.last_op", p.last_op)))
    return out


def _within_caps(groups: list) -> list:
    """The groups a summary may carry (caps.FR_GROUPS, caps.FR_RANKS listed in
    all): those with a collective pending first (the wait the daemon looks
    for), then the others, each in the dump's order."""
    order = [g for g in groups if g.pending_op] + [g for g in groups if not g.pending_op]
    kept, listed = [], 0
    for g in order:
        if len(kept) >= caps.FR_GROUPS or listed + len(g.ranks) > caps.FR_RANKS:
            break
        kept.append(g)
        listed += len(g.ranks)
    return kept


@dataclass
class _Pending:
    watcher: frpipe.DumpWatcher
    paths: list[str]
    deadline: float


class FlightRecorderProbe:
    """Per-rank dump requests in flight and the summaries they produced."""

    def __init__(self, wait: float = WAIT_SECONDS, min_interval: float = MIN_INTERVAL) -> None:
        self.wait, self.min_interval = wait, min_interval
        self._pending: dict[int, _Pending] = {}
        self._asked: dict[int, float] = {}
        self.requests_total = 0
        self.dumps_total = 0
        self.failures_total = 0
        self._told: set[str] = set()

    def request(self, procs: Iterable[RankProcess], now: float | None = None) -> int:
        """Trigger a dump of each rank that has a pipe; returns how many were asked."""
        now = time.monotonic() if now is None else now
        asked = 0
        for proc in procs:
            if proc.pid in self._pending or now - self._asked.get(proc.pid, -1e9) < self.min_interval:
                continue
            if not proc.identity.known:
                continue  # the pipe's name ends in the rank, which nobody knows
            env = _env_with_home(proc)
            pipe = frpipe.pipe_path(env, proc.identity.rank)
            if pipe is None:
                continue
            paths = [_in_ns(proc.pid, p) for p in frpipe.dump_candidates(env, proc.identity.rank)]
            watcher = frpipe.DumpWatcher(paths, rank=proc.identity.rank)
            self._asked[proc.pid] = now
            try:
                ok = frpipe.trigger(_in_ns(proc.pid, pipe))
            except frpipe.PipeUnavailable as e:
                # Said once per cause (a missing capability is the same on every rank).
                if e.reason not in self._told:
                    self._told.add(e.reason)
                    log.warning("rank %d: live Flight Recorder unavailable: %s "
                                "(said once)", proc.identity.rank, e)
                log.debug("rank %d: %s", proc.identity.rank, e)
                ok = False
            if not ok:
                self.failures_total += 1
                log.debug("rank %d (pid %d): nobody reads %s", proc.identity.rank, proc.pid, pipe)
                continue
            self.requests_total += 1
            self._pending[proc.pid] = _Pending(watcher, paths, now + self.wait)
            asked += 1
        return asked

    @property
    def waiting(self) -> bool:
        return bool(self._pending)

    def pending(self, pid: int) -> bool:
        """A dump of this rank was asked and has not been read (nor given up on)."""
        return pid in self._pending

    def poll(self, now: float | None = None) -> dict[int, pb.FlightRecorderSummary]:
        """pid -> summary for every dump that appeared since the last poll."""
        now = time.monotonic() if now is None else now
        out: dict[int, pb.FlightRecorderSummary] = {}
        for pid, p in list(self._pending.items()):
            try:
                dump = p.watcher.poll()
            except Exception:  # noqa: BLE001 - a strange file must not stop the agent
                log.exception("reading the Flight Recorder dump of pid %d", pid)
                dump = None
                p.deadline = 0.0
            if dump is not None:
                sig = frpipe._signature(dump.path)      # the file, inside the rank's root
                written = sig[0] / 1e9 if sig is not None else time.time()
                out[pid] = summary_pb(dump, written, time.time())
                self.dumps_total += 1
                del self._pending[pid]
            elif now > p.deadline:
                self.failures_total += 1
                log.info("pid %d: no Flight Recorder dump within %.0f s of the request "
                         "(checked %s)", pid, self.wait, ", ".join(p.paths))
                del self._pending[pid]
        return out

    def forget(self, pid: int) -> None:
        self._pending.pop(pid, None)
        self._asked.pop(pid, None)
