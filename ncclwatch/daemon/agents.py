"""What the daemon knows of each agent: its stream, its commands, its clock.

Durations travel as ages on each agent's monotonic clock; the daemon anchors
them at its receive time with ``clock_offset``, a sliding minimum over recent
reports (transit only ever adds), tightened by timed acknowledgements.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Any

from ncclwatch.v1 import collector_pb2 as pb

#: Seconds of reports the transit-free clock offset is the minimum over
#: (AgentRecord.clock_offset).
CLOCK_WINDOW = 30.0
#: A transit longer than this is taken for a clock that stopped or jumped.
CLOCK_JUMP = 10.0


@dataclass
class AgentRecord:
    agent_id: str
    node: str
    last_seq: int = 0
    last_recv: float = 0.0       # daemon monotonic
    last_recv_wall: float = 0.0  # daemon wall clock, for the timestamp metric
    interval: float = 1.0
    gaps_total: int = 0
    reports_total: int = 0
    connected: bool = False
    health: pb.AgentHealth = field(default_factory=pb.AgentHealth)
    #: The samples the agent says it left out before sending (its health's
    #: parts_left_out, summed), and when that last grew (daemon monotonic).
    left_out_total: int = 0
    left_out_at: float | None = None
    ranks: set[tuple[str, int]] = field(default_factory=set)
    #: Jobs this agent reported that the table still holds (live or gone, until
    #: they expire): what bounds.max_jobs_per_agent counts.
    jobs: set[str] = field(default_factory=set)
    commands: collections.deque = field(default_factory=lambda: collections.deque(maxlen=64))
    #: Protocol 2: slot -> (job, rank record, (job id, rank)) of this agent's
    #: stream; None: a rank of a job left out of the report (briefs skip it).
    slots: dict[int, Any] = field(default_factory=dict)
    #: Briefs named slots not held: ask the agent for full samples (once).
    resync: bool = False
    briefs_total: int = 0
    changes_total: int = 0
    #: Briefs and changes that named a slot not held.
    briefs_unresolved_total: int = 0
    #: The node identity it counts against (nodebudget.py): its certificate's
    #: node; without TLS, its node.
    identity: str = ""

    #: (receipt, recv - agent clock) of recent reports, offsets increasing:
    #: the sliding minimum of ``clock_offset`` (an upper bound on the offset).
    _offsets: collections.deque = field(default_factory=collections.deque)
    #: (receipt, a lower bound on the offset) from timed acknowledgements,
    #: bounds decreasing: their sliding maximum.
    _lows: collections.deque = field(default_factory=collections.deque)
    #: seq -> recv - agent clock of recent reports, for their timed acks.
    _by_seq: dict = field(default_factory=dict)
    _last_clock: float = 0.0
    #: The offset the last report's ages were anchored with (JobTable._reanchor).
    anchored_offset: float = math.inf

    def stale(self, now: float, staleness: float) -> bool:
        return now - self.last_recv > max(staleness, 3 * self.interval)

    def clock_offset(self, recv: float, agent_clock: float, seq: int = 0,
                     timed_seq: int = 0, round_trip: float = 0.0,
                     queued: float = 0.0) -> float:
        """Daemon time minus agent time, no larger than it truly is when the
        agent times its acknowledgements, and with as little transit in it
        as the reports allow when it does not.

        ``recv - agent_clock`` holds the clocks' offset plus this report's
        transit (queueing in the agent, the network, the daemon's loop): an
        anchor at ``recv`` puts every age in the report that much late, and a
        late start makes the watchdog budget err large. Each report bounds the
        offset from above; the smallest bound of the last CLOCK_WINDOW seconds
        wins (a window, not all time: two hosts' clocks drift, a paused VM's
        stops). A timed acknowledgement (report ``timed_seq`` was acknowledged
        ``round_trip`` after it was built) bounds that report's transit, so
        its ``recv - clock - round_trip`` bounds the offset from below: the
        largest such bound of the window is the offset used, and ages count
        back from no later than the truth, whatever the transit. An agent
        clock that went back (a new agent process), or fell behind by more
        than CLOCK_JUMP (a suspended host: its waits would be dated that much
        early), starts afresh. ``queued``: the seconds the agent says the
        report sat in its queue before it was sent (a restarted daemon's first
        reports waited out the reconnect backoff), taken out of the transit:
        ``recv - clock - queued`` still bounds the offset from above.
        """
        raw = recv - agent_clock
        off = raw - queued if queued > 0 else raw
        q, lows = self._offsets, self._lows
        if agent_clock <= 0 or agent_clock < self._last_clock \
                or (q and off - q[0][1] > CLOCK_JUMP):
            q.clear()
            lows.clear()
            self._by_seq.clear()
        self._last_clock = agent_clock
        if agent_clock <= 0:
            return off  # no clock in the report: anchor at receipt
        while q and q[-1][1] >= off:
            q.pop()
        q.append((recv, off))
        while q[0][0] < recv - CLOCK_WINDOW:
            q.popleft()
        timed = self._by_seq.pop(timed_seq, None) if timed_seq else None
        if seq:
            # The acknowledgement's round trip counts from the report's building.
            self._by_seq[seq] = raw
            if len(self._by_seq) > 128:
                del self._by_seq[next(iter(self._by_seq))]
        # A bound far below the upper one (a round trip of more than
        # CLOCK_JUMP) says little and may come from a clock that jumped.
        if timed is not None and 0 <= round_trip <= CLOCK_JUMP:
            low = timed - round_trip
            while lows and lows[-1][1] <= low:
                lows.pop()
            lows.append((recv, low))
        while lows and lows[0][0] < recv - CLOCK_WINDOW:
            lows.popleft()
        return min(lows[0][1], q[0][1]) if lows else q[0][1]
