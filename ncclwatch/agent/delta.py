"""Reports that carry changes: a stream sends steady ranks as briefs.

The agent builds one full report a round (``report.build_report``); each
uplink stream turns it into a protocol-2 report against what that stream
last sent in full. A stream is one daemon's view, so the table is per
stream: a new stream (a reconnect, a restarted daemon) and a resync the
daemon asks for start over with full samples, and every
``SNAPSHOT_EVERY``-th report is all full samples whatever changed (curve
points for every rank, and a bound on how long any mistake can last).

A rank goes in full when anything its forecasts read moved since its last
full sample (``WHY_FULL``), as a ``RankChange`` when only its state, op,
stack or their times moved (``WHY_CHANGE``: a step into a collective, a new
dump), and as a brief otherwise. A rank waiting
without progress is not among them: a brief carries its progress reading,
which is all the daemon reads of a waiter between stack dumps (each dump is
a full sample), so a stall of 100k ranks costs the daemon briefs, not 100k
full samples a round, exactly when its verdict is due.
"""

from __future__ import annotations

import random
from typing import Callable

from ncclwatch.v1 import collector_pb2 as pb

PROTOCOL_VERSION = 2
#: At most this many reports of a stream from one that carried every rank in
#: full to the next (a snapshot; the agent's job info refresh, every
#: JOB_INFO_EVERY rounds, is one too).
SNAPSHOT_EVERY = 30
#: Memory (RSS, or GPU memory) moving more than this since the last full
#: sample sends a full one: the daemon's memory forecasts need the curve.
MEMORY_STEP_BYTES = 16 << 20
#: Bytes written since the last full sample that make the next one full.
WRITE_STEP_BYTES = 1 << 20
#: A state's start moving by more than this (agent clock): a new episode.
SINCE_SLACK = 0.5
#: A stack's time moving by more than this: a new dump (ages are rounded floats).
STACK_SLACK = 0.01

#: States whose ranks always go in full: the daemon forecasts from their curves.
FULL_STATES = frozenset({
    pb.RANK_STATE_UNSPECIFIED, pb.RANK_STATE_UNKNOWN, pb.RANK_STATE_SAVING,
    pb.RANK_STATE_GATHERING_STATE_DICT, pb.RANK_STATE_LOADING,
})


class Sent:
    """What a stream last sent of one rank in full."""

    __slots__ = ("slot", "state", "op", "stack_id", "since", "stack_at", "rss", "written",
                 "gpu", "evidence", "blocked_in")

    def __init__(self, slot: int, s: pb.RankSample, now: float) -> None:
        self.slot = slot
        self.changed(s, now)
        p = s.process
        self.rss, self.written = p.rss_bytes, p.io_write_bytes
        self.gpu = _gpu_bytes(s)
        self.blocked_in = s.blocked_in

    def changed(self, s: pb.RankSample, now: float) -> None:
        """The stream sent the rank's state (a RankChange or a full sample)."""
        self.state, self.op, self.stack_id = s.state, s.op, s.stack_id
        self.evidence = (s.evidence, s.native_no_wait, s.native_stack_id)
        self.since = now - s.state_seconds
        self.stack_at = now - s.stack_age_seconds


def _gpu_bytes(s: pb.RankSample) -> int:
    return sum(g.used_bytes for g in s.gpu)


Rule = tuple[str, Callable[[pb.RankSample, Sent, float], bool]]

#: Why a rank goes in full although the stream has sent it before, first match.
WHY_FULL: tuple[Rule, ...] = (
    ("state", lambda s, k, now: s.state in FULL_STATES),
    ("job_info", lambda s, k, now: s.HasField("job")),
    ("flight_recorder", lambda s, k, now: s.HasField("flight_recorder")),
    ("no_progress_reading", lambda s, k, now: not s.HasField("still_seconds")
     or not s.HasField("process")),
    ("writing", lambda s, k, now: len(s.process.files_writing) > 0
     or s.process.io_write_bytes - k.written > WRITE_STEP_BYTES),
    ("memory", lambda s, k, now: abs(s.process.rss_bytes - k.rss) > MEMORY_STEP_BYTES
     or abs(_gpu_bytes(s) - k.gpu) > MEMORY_STEP_BYTES),
    # What the thread is blocked in: read each still round, so it changes when
    # a wait begins or moves to another call (rarely within one wait).
    ("blocked_in", lambda s, k, now: s.blocked_in != k.blocked_in),
)

#: Why a rank goes as a RankChange (state, op, stack, their times, progress, CPU)
#: when no WHY_FULL rule holds, first match; none: a brief will do.
WHY_CHANGE: tuple[Rule, ...] = (
    ("changed", lambda s, k, now: (s.state, s.op, s.stack_id,
                                   (s.evidence, s.native_no_wait, s.native_stack_id))
     != (k.state, k.op, k.stack_id, k.evidence)),
    ("since", lambda s, k, now: abs(now - s.state_seconds - k.since) > SINCE_SLACK),
    # A new look at the same stack: the daemon confirms stalls by when stacks were taken.
    ("new_stack", lambda s, k, now: abs(now - s.stack_age_seconds - k.stack_at) > STACK_SLACK),
)

FULL, CHANGE, BRIEF = "full", "change", "brief"


def how_sent(s: pb.RankSample, sent: Sent | None, now: float) -> tuple[str, str]:
    """(FULL | CHANGE | BRIEF, the rule that decided it) for ``s`` on this stream."""
    if sent is None:
        return FULL, "new"
    for name, rule in WHY_FULL:
        if rule(s, sent, now):
            return FULL, name
    for name, rule in WHY_CHANGE:
        if rule(s, sent, now):
            return CHANGE, name
    return BRIEF, ""


def rank_key(s: pb.RankSample) -> tuple[str, int, int]:
    i = s.identity
    return (i.job_id, i.rank, i.pid)


class StreamDeltas:
    """One stream's table of what it sent in full, and the conversion."""

    def __init__(self, snapshot_every: int = SNAPSHOT_EVERY, phase: int | None = None) -> None:
        self.snapshot_every = snapshot_every
        #: Reports counted as already past at the stream's start: the agents a
        #: restarted daemon sees connect at once would otherwise snapshot in step,
        #: every rank of the fleet in full in the same second, every 30 rounds.
        self._phase = phase
        self._sent: dict[tuple[str, int, int], Sent] = {}
        self._next_slot = 1
        self._since_full = 0  # reports since one that carried every rank in full
        self._reset = True
        self.briefs_total = 0
        self.changes_total = 0
        self.full_total = 0

    def resync(self) -> None:
        """The daemon lost our slots: the next report is all full, slots anew."""
        self._sent.clear()
        self._next_slot = 1
        self._reset = True

    def convert(self, report: pb.NodeReport, out: pb.NodeReport) -> list:
        """Fill ``out`` (header already copied) with ``report``'s ranks as full
        samples, changes or briefs; return the full samples and changes (their
        stacks may need sending)."""
        now = report.agent_monotonic_seconds
        reset = self._reset
        snapshot = reset or self._since_full >= self.snapshot_every - 1
        if reset:
            out.slots_reset = True
            self._reset = False
        sent, full, briefs = self._sent, [], out.briefs
        seen = set()
        for s in report.samples:
            key = rank_key(s)
            seen.add(key)
            k = sent.get(key)
            how = FULL if snapshot else how_sent(s, k, now)[0]
            if how == BRIEF:
                briefs.slot.append(k.slot)
                briefs.still_seconds.append(s.still_seconds)
                briefs.cpu_utilization.append(s.process.cpu_utilization)
                briefs.cpu_seconds.append(s.process.cpu_seconds)
                continue
            if how == CHANGE:
                p = s.process
                full.append(out.changes.add(
                    slot=k.slot, state=s.state, op=s.op, state_seconds=s.state_seconds,
                    stack_age_seconds=s.stack_age_seconds, stack_id=s.stack_id,
                    still_seconds=s.still_seconds, cpu_utilization=p.cpu_utilization,
                    cpu_seconds=p.cpu_seconds, evidence=s.evidence,
                    native_frame=s.native_frame, native_no_wait=s.native_no_wait,
                    native_stack_id=s.native_stack_id))
                k.changed(s, now)
                self.changes_total += 1
                continue
            slot = k.slot if k is not None else self._take_slot()
            f = out.samples.add()
            f.CopyFrom(s)
            f.slot = slot
            sent[key] = Sent(slot, s, now)
            full.append(f)
        if report.full_round and len(sent) > len(seen):
            for key in [k for k in sent if k not in seen]:
                del sent[key]  # ranks gone: the daemon drops their slots on the next snapshot
        # A round of every rank in full (a snapshot, or the agent's job info
        # refresh) starts the count to the next snapshot over.
        if reset:
            phase = self._phase
            self._since_full = random.randrange(self.snapshot_every) if phase is None else phase
        elif len(out.samples) == len(report.samples):
            self._since_full = 0
        else:
            self._since_full += 1
        self.briefs_total += len(out.briefs.slot)
        self.full_total += len(out.samples)
        return full

    def _take_slot(self) -> int:
        slot = self._next_slot
        self._next_slot += 1
        return slot
