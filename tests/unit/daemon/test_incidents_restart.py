"""A stall across a daemon restart keeps its start on the agents' clocks.

A real daemon sees a save stall; it is killed; a fresh one gets the agent's
reports as they come after a restart: the queue built during the reconnect
backoff flushed at once (a tick between reports, as a report's urgent tick
runs mid-flush), then the live rounds. The agent's clock is ``OFF`` seconds
behind the daemons'; the truth is that the waits began at agent clock
``WAIT0``.
"""

from __future__ import annotations

import pytest

from ncclwatch.agent.delta import StreamDeltas
from ncclwatch.daemon import api
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.reports import BARRIER, SAVE, report, sample, stack_pb

OFF = 1000.0          # daemon monotonic = agent clock + OFF
WALL = 500_000.0      # daemon wall = daemon monotonic + WALL
WAIT0, SAVE0 = 100.0, 99.5   # agent clock: ranks 1-2 wait in barrier, rank 0 saves
KILL, BACK, FLUSH = 108, 118, 118.2  # agent clock: last round daemon 1 got, reconnect
TRUE_START = WAIT0 + OFF


def _rank(r: int, clock: float) -> pb.RankSample:
    if r == 0:
        s = sample("job-1", 0, 3, RankState.SAVING, seconds=clock - SAVE0,
                   stack=stack_pb(SAVE).id, timeout=90.0)
        s.stack_age_seconds = 0.3
        s.process.io_write_bytes = int((clock - SAVE0) * 1e6)
    else:
        s = sample("job-1", r, 3, RankState.COLLECTIVE, CollectiveOp.BARRIER,
                   seconds=clock - WAIT0, stack=stack_pb(BARRIER).id, timeout=90.0)
        s.stack_age_seconds = 0.3
        s.still_seconds = clock - WAIT0
    s.process.cpu_utilization = 0.5
    s.process.rss_bytes = 1 << 30
    return s


def _send(d: Daemon, deltas: StreamDeltas, seq: int, clock: float, recv: float,
          queued: float | None = None) -> None:
    """The round built at agent ``clock`` as a stream sends it, received at ``recv``
    (daemon monotonic), then a tick; ``queued``: seconds it sat in the agent's queue."""
    full = report([_rank(r, clock) for r in range(3)], seq=seq,
                  stacks=[stack_pb(BARRIER), stack_pb(SAVE)]).report
    full.agent_monotonic_seconds = clock
    out = pb.NodeReport()
    out.CopyFrom(full)
    del out.samples[:]
    deltas.convert(full, out)
    if queued is not None:
        out.queued_seconds = queued
    d.ingest(pb.ReportRequest(protocol_version=2, report=out), now=recv)
    d.tick(now=recv, wall=recv + WALL)


def _stall(d: Daemon, now: float) -> dict:
    (inc,) = d.incidents.active.values()
    return api.incident_view(d, inc, now)


def _first_daemon() -> tuple[float, float]:
    """Daemon 1 up to the kill: (its duration shown, at when)."""
    d, deltas = Daemon(DaemonConfig()), StreamDeltas(phase=0)
    for seq, clock in enumerate(range(101, KILL), start=1):
        now = clock + OFF + 0.05
        _send(d, deltas, seq, float(clock), now)
    return _stall(d, now)["duration_seconds"], now


def test_the_start_wall_time_moves_with_the_start_when_the_waits_date_earlier() -> None:
    """The restarted daemon opens the incident from the first queued report
    (its queueing inside the clock offset: dated late); the rest of the queue
    dates the waits right. The start's wall time, and the clock anchors read
    off it, go with the start, not stay where the first report put them."""
    shown, killed_at = _first_daemon()
    assert shown == pytest.approx(killed_at - TRUE_START, abs=0.2)
    d, deltas = Daemon(DaemonConfig()), StreamDeltas(phase=0)
    for i, clock in enumerate(range(KILL, BACK)):
        _send(d, deltas, i + 1, float(clock), FLUSH + OFF + 0.01 * i)
    now = BACK + 0.5 + OFF + 0.05
    _send(d, deltas, BACK - KILL + 1, BACK + 0.5, now)
    view = _stall(d, now)
    assert view["duration_seconds"] == pytest.approx(now - TRUE_START, abs=0.2)
    assert view["started_at"] == pytest.approx(TRUE_START + WALL, abs=0.2), view["started_at"]
    first_wait = next(a for a in view["clock"]["anchors"] if a["id"] == "first_wait")
    assert first_wait["at"] == pytest.approx(TRUE_START + WALL, abs=0.2)
    assert view["clock"]["now"] == pytest.approx(now + WALL, abs=0.01)


def test_a_restarted_daemon_dates_the_wait_right_from_the_first_queued_report() -> None:
    """What the restarted daemon shows while the queue is still arriving: the
    wait of the first daemon plus the time since, never the queue's age less.
    (Before, the first queued report dated the waits ~its queueing late, and
    the incident opened and was shown so until the rest of the queue came.)"""
    shown, killed_at = _first_daemon()
    d, deltas = Daemon(DaemonConfig()), StreamDeltas(phase=0)
    seen = []
    for i, clock in enumerate(range(KILL, BACK)):
        recv = FLUSH + OFF + 0.01 * i
        # Sent as it arrives (the network adds nothing here): queued since built.
        _send(d, deltas, i + 1, float(clock), recv, queued=recv - OFF - clock)
        if d.incidents.active:
            seen.append((recv, _stall(d, recv)["duration_seconds"]))
    assert seen, "the stall shows during the flush"
    for recv, duration in seen:
        assert duration >= shown + (recv - killed_at) - 0.2, (recv - OFF, duration, seen)
        assert duration == pytest.approx(recv - TRUE_START, abs=0.2), seen


def test_a_queued_reports_still_ranks_are_dated_from_when_it_was_built() -> None:
    """A still reading counts back from the report's build time on the daemon's
    clock, as the states' ages do, not from its receipt: the first queued
    report of a restart arrives ~10 s after it was built, and a wait dated
    from its receipt would start 10 s late (and its learned length be short)."""
    d, deltas = Daemon(DaemonConfig()), StreamDeltas(phase=0)
    recv = FLUSH + OFF
    _send(d, deltas, 1, float(KILL), recv, queued=recv - OFF - KILL)
    job = d.table.jobs["job-1"]
    for r in (1, 2):
        assert job.ranks[r].still_since == pytest.approx(TRUE_START, abs=0.2), \
            (r, job.ranks[r].still_since - TRUE_START)
    # the next (briefs) reports of the queue keep it there
    for i, clock in enumerate(range(KILL + 1, KILL + 4)):
        recv = FLUSH + OFF + 0.01 * (i + 1)
        _send(d, deltas, i + 2, float(clock), recv, queued=recv - OFF - clock)
        for r in (1, 2):
            assert job.ranks[r].still_since == pytest.approx(TRUE_START, abs=0.2), \
                (clock, r, job.ranks[r].still_since - TRUE_START)
