"""The agent's long-lived gRPC streams to its daemon(s).

High availability the way Prometheus does it: an agent may report to two
(or more) daemons, each judging and exporting on its own. ``Uplinks`` keeps
one ``Uplink`` per daemon, each with its own stream, queue, backoff and
set of stacks already sent, so a slow or dead daemon never stalls or drops
the reports of another.

Reports wait in a bounded queue that drops the oldest (a report is a full
snapshot, so the newest is worth most) and counts drops. A report leaves
the queue only when the daemon acknowledges it: reports a broken stream
took but never got acked go back to the front, so nothing is lost silently,
except a report the daemon refused for what it holds (``REFUSED``: it would
be refused again): that one is dropped and counted, never sent again, and
the stream starts anew with the next. Stack frames are
attached at send time, once per stream: after a reconnect the daemon may be
a fresh process, so every stack is sent again. Reconnects back off with full
jitter; ``stop()`` interrupts a backoff at once. With a ``ClientTLS`` the
stream is mTLS: the daemon is checked against the CA, and the node's own
certificate proves which node it reports for.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from typing import Callable

import grpc

from ncclwatch.agent import caps, delta
from ncclwatch.agent.report import PROTOCOL_VERSION as FULL_PROTOCOL
from ncclwatch.agent.settings import AgentConfig
from ncclwatch.tls import ClientTLS
from ncclwatch.v1 import collector_pb2 as pb
from ncclwatch.v1 import collector_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


def collector_list(value: object) -> tuple[str, ...]:
    """``"a:7470,b:7470"`` (flag, env) or a TOML list -> ``("a:7470", "b:7470")``."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    out = tuple(str(t).strip() for t in items if str(t).strip())
    if not out:
        raise ValueError("no collector given")
    if len(set(out)) != len(out):
        raise ValueError(f"collector given twice: {', '.join(out)}")
    return out

#: The largest answer the agent takes from a daemon: an ack, the stack ids it
#: lacks, the jobs it left out with their reasons and up to 64 commands are
#: well under it; a larger one (a hostile or broken collector) ends the
#: stream instead of growing the agent's memory.
MAX_RECEIVE_BYTES = 4 * 1024 * 1024

#: Keepalive per gRPC guidance: pings well above the server's minimum
#: interval, so a silent partition is noticed in ~40 s, not at TCP timeout.
CHANNEL_OPTIONS = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
    ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 5_000),
)

#: Statuses that refuse the report itself (malformed, or over a bound of the
#: whole report): sending it again gets the same answer, and a requeued one
#: kept the node's later reports from ever arriving. Any other status (the
#: daemon away, UNAVAILABLE, a deadline) is transient: the report is sent again.
REFUSED = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                     grpc.StatusCode.OUT_OF_RANGE})
#: A daemon that refuses a report while the agent still writes the next ones
#: can reach the agent as INTERNAL ("Internal error from Core") instead: the
#: same report ending this many streams in a row so, unacknowledged, is
#: taken as refused too. (UNAVAILABLE and other statuses never count.)
POISON = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})
POISON_STRIKES = 2

#: Seconds ``stop()`` waits for a session's last acks before cancelling it.
STOP_GRACE = 2.0
#: Seconds between two log lines about the same rejected job.
REJECTION_LOG_INTERVAL = 60.0
#: Dropped parts said once each; past this many, said again from the start.
MAX_PARTS_SAID = 4096


class Backoff:
    """Full-jitter exponential backoff (AWS architecture blog's variant)."""

    def __init__(self, base: float = 0.5, cap: float = 10.0) -> None:
        self.base, self.cap, self.attempt = base, cap, 0

    def next(self) -> float:
        delay = random.uniform(0, min(self.cap, self.base * 2 ** self.attempt))
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0


class Uplink:
    def __init__(self, target: str, stacks: dict[str, pb.Stack], *,
                 max_queue: int = AgentConfig.max_queue,
                 on_command: Callable[[pb.Command], None] = lambda c: None,
                 on_connect: Callable[[], None] = lambda: None,
                 tls: ClientTLS | None = None) -> None:
        self.target = target
        self.tls = tls
        self._stacks = stacks  # id -> Stack, owned by the agent
        self._queue: collections.deque[pb.NodeReport] = collections.deque()
        self._max_queue = max_queue
        self._ready = asyncio.Event()
        self._stopped = asyncio.Event()
        self._on_command = on_command
        self._on_connect = on_connect
        self.dropped_total = 0
        self.rejected_jobs_total = 0
        #: Reports the daemon refused (REFUSED): dropped, not sent again.
        self.refused_total = 0
        self._strikes = (0, 0)   # (seq, streams it ended in a row with a POISON status)
        #: Stacks the daemon left out of reports (dropped_parts) on this stream.
        self._held: set[str] = set()
        self._rejection_logged: dict[str, float] = {}
        #: Parts the daemon left out of reports (dropped_parts), and those said.
        self.parts_dropped_total = 0
        self._parts_said: set[tuple[str, str, int, str]] = set()
        self.sent_total = 0
        self.connected = False
        self.last_error = ""
        #: 2 (briefs) until a daemon says it speaks only 1.
        self.protocol = delta.PROTOCOL_VERSION
        self._deltas: delta.StreamDeltas | None = None
        self.briefs_total = 0
        self.resyncs_total = 0
        #: (seq, seconds from its build to its acknowledgement) of the latest
        #: report acknowledged on the current stream (None: none yet).
        self._timed: tuple[int, float] | None = None

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    def submit(self, report: pb.NodeReport) -> None:
        while len(self._queue) >= self._max_queue:
            self._queue.popleft()
            self.dropped_total += 1
        self._queue.append(report)
        self._ready.set()

    def stop(self) -> None:
        self._stopped.set()
        self._ready.set()

    async def run(self) -> None:
        backoff = Backoff()
        while not self._stopped.is_set():
            try:
                got_reply = await self._session_until_stopped()
                if got_reply:
                    backoff.reset()
            except grpc.aio.AioRpcError as e:
                self._log_error(f"{e.code().name}: {e.details()}")
                if (e.code() == grpc.StatusCode.FAILED_PRECONDITION and self.protocol > 1
                        and "protocol_version" in (e.details() or "")):
                    log.warning("collector %s speaks an older protocol: sending full "
                                "samples (protocol %d)", self.target, FULL_PROTOCOL)
                    self.protocol = FULL_PROTOCOL
                    backoff.reset()
            except Exception as e:  # never let transport trouble end the agent
                self._log_error(f"{type(e).__name__}: {e}")
            self.connected = False
            if self._stopped.is_set():
                break
            try:
                await asyncio.wait_for(self._stopped.wait(), backoff.next())
            except asyncio.TimeoutError:
                pass

    async def _session_until_stopped(self) -> bool:
        """A session; ``stop()`` ends it within ``STOP_GRACE`` even when the daemon
        never answers (a wedged host that accepts TCP and says nothing)."""
        session = asyncio.ensure_future(self._session())
        stopped = asyncio.ensure_future(self._stopped.wait())
        try:
            await asyncio.wait({session, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not session.done():  # stopping: let in-flight acks arrive, briefly
                await asyncio.wait({session}, timeout=STOP_GRACE)
        finally:
            stopped.cancel()
            if not session.done():
                session.cancel()
                try:
                    await session
                except asyncio.CancelledError:
                    pass
        return False if session.cancelled() else session.result()

    def _log_error(self, msg: str) -> None:
        # Deduplicate: a dead collector should not flood the log.
        if msg != self.last_error:
            log.warning("collector %s: %s (retrying with backoff)", self.target, msg)
        self.last_error = msg

    async def _session(self) -> bool:
        self._timed = None  # a new stream (perhaps to another daemon): untimed
        sent: set[str] = set()
        inflight: collections.deque[pb.NodeReport] = collections.deque()
        got_reply = False
        live = [True]  # gRPC may pull from the generator after the call ended
        self._held = set()
        try:
            async with self._channel() as ch:
                stub = pb_grpc.CollectorServiceStub(ch)
                call = stub.Report(self._requests(sent, inflight, live))
                async for resp in call:
                    while inflight and inflight[0].seq <= resp.ack_seq:
                        acked = inflight.popleft()
                        if acked.seq == resp.ack_seq:
                            self._time_ack(acked)
                    got_reply = self._on_reply(resp, sent, got_reply)
        except grpc.aio.AioRpcError as e:
            if inflight and self._poisoned(inflight[0], e.code()):
                self._refused(inflight.popleft(), e)
            raise
        finally:
            live[0] = False
            self._requeue(inflight)
        return got_reply

    def _poisoned(self, head: pb.NodeReport, code: grpc.StatusCode) -> bool:
        """The report at the head of the stream is the one the daemon refused."""
        if code in REFUSED:
            return True
        if code not in POISON:
            self._strikes = (0, 0)
            return False
        seq, n = self._strikes
        n = n + 1 if seq == head.seq else 1
        self._strikes = (head.seq, n)
        return n >= POISON_STRIKES

    def _refused(self, report: pb.NodeReport, e: grpc.aio.AioRpcError) -> None:
        """The daemon answers a report in order and ends the stream at the one it
        refuses: the oldest unacknowledged. Dropped, counted, said."""
        self.refused_total += 1
        log.warning("collector %s refused report %d (%s: %s): dropped, not sent again",
                    self.target, report.seq, e.code().name, (e.details() or "")[:300])

    def _time_ack(self, acked: pb.NodeReport) -> None:
        """How long after it was built a report's acknowledgement came back:
        the next report tells the daemon (a bound on that report's transit,
        which the daemon takes out of its wait starts; table.clock_offset)."""
        rtt = time.monotonic() - acked.agent_monotonic_seconds
        if acked.agent_monotonic_seconds > 0 and 0 <= rtt < 60.0:
            self._timed = (acked.seq, rtt)

    def _channel(self) -> grpc.aio.Channel:
        if self.tls is None:
            return grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS)
        return grpc.aio.secure_channel(self.target, self.tls.credentials(),
                                       options=CHANNEL_OPTIONS + self.tls.options())

    def _requeue(self, inflight: "collections.deque[pb.NodeReport]") -> None:
        """Put unacknowledged reports back in front, within the queue bound."""
        while inflight:
            self._queue.appendleft(inflight.pop())
        while len(self._queue) > self._max_queue:
            self._queue.popleft()
            self.dropped_total += 1

    def _on_reply(self, resp: pb.ReportResponse, sent: set[str], got_reply: bool) -> bool:
        if not got_reply:
            self.connected = True
            if self.last_error:
                log.info("collector %s: connected", self.target)
            self.last_error = ""
        for part in resp.dropped_parts:
            self._on_dropped(part, sent)
        sent.difference_update(m for m in resp.missing_stack_ids if m not in self._held)
        if resp.resync and self._deltas is not None:
            # The daemon lost our ranks (restarted under this stream, or forgot
            # a job): full samples, job info included, as on a new stream.
            self.resyncs_total += 1
            self._deltas.resync()
            self._on_connect()
        for cmd in resp.commands:
            self._on_command(cmd)
        for rej in resp.rejected_jobs:
            self._on_rejected(rej)
        return True

    def _on_rejected(self, rej: pb.JobRejection) -> None:
        """The daemon left one job of a report out: say so once a minute per job
        (it repeats every round while the job's ranks disagree)."""
        self.rejected_jobs_total += 1
        now = asyncio.get_running_loop().time()
        if now - self._rejection_logged.get(rej.job_id, -1e9) >= REJECTION_LOG_INTERVAL:
            self._rejection_logged[rej.job_id] = now
            log.warning("collector %s left job %s out of the report (%s): %s", self.target,
                        rej.job_id, rej.code, rej.reason)

    def _on_dropped(self, part: pb.DroppedPart, sent: set[str]) -> None:
        """The daemon left one part out (a stack, a FR summary, a rank's
        sample), the rest applied: counted, said once per part and reason. A
        stack is held back on this stream, never attached again; a sample is
        neither resent nor a cause to resync (the daemon skips its slot)."""
        self.parts_dropped_total += 1
        if part.stack_id:
            self._held.add(part.stack_id)
            sent.add(part.stack_id)
        key = (part.what, part.stack_id or part.job_id, part.rank, part.bound or part.reason[:64])
        if key in self._parts_said:
            return
        if len(self._parts_said) >= MAX_PARTS_SAID:
            self._parts_said.clear()
        self._parts_said.add(key)
        log.warning("collector %s left a %s out of the report (%s%s): %s", self.target,
                    part.what, part.bound or "malformed",
                    f", job {part.job_id} rank {part.rank}" if part.job_id else "",
                    part.reason[:300])

    async def _requests(self, sent: set[str], inflight: "collections.deque[pb.NodeReport]",
                        live: list[bool]):
        self._on_connect()
        protocol = self.protocol
        deltas = self._deltas = delta.StreamDeltas() if protocol >= 2 else None
        while not self._stopped.is_set() and live[0]:
            if not self._queue:
                self._ready.clear()
                await self._ready.wait()
                continue
            report = self._queue.popleft()
            inflight.append(report)
            out = pb.NodeReport()
            out.CopyFrom(report)
            if deltas is None:
                full = report.samples
            else:
                del out.samples[:]
                full = deltas.convert(report, out)
                self.briefs_total += len(out.briefs.slot)
            # This stream's own queue and drops: each daemon sees its own link.
            out.health.queue_length = len(self._queue)
            if self._timed is not None:
                out.timed_seq, out.timed_round_trip_seconds = self._timed
            if report.agent_monotonic_seconds > 0:
                out.queued_seconds = max(0.0, time.monotonic() - report.agent_monotonic_seconds)
            out.health.reports_dropped_total = self.dropped_total
            out.health.reports_refused_total = self.refused_total
            self._attach_stacks(out, full, sent)
            self.sent_total += 1
            yield pb.ReportRequest(protocol_version=protocol, report=out)


    def _attach_stacks(self, out: pb.NodeReport, samples, sent: set[str]) -> None:
        """The stacks this stream has not sent that ``samples`` name, within
        the report's share (caps.REPORT_STACKS, REPORT_STACK_TEXT): the rest
        go with the next report."""
        text = 0
        for sid in (i for s in samples for i in (s.stack_id, s.native_stack_id)):
            if not sid or sid in sent or sid not in self._stacks:
                continue
            stack = self._stacks[sid]
            n = len(stack.thread_name) + sum(len(f.name) + len(f.filename)
                                             for f in stack.frames)
            if len(out.stacks) >= caps.REPORT_STACKS or text + n > caps.REPORT_STACK_TEXT:
                break
            out.stacks.append(stack)
            sent.add(sid)
            text += n


class Uplinks:
    """One ``Uplink`` per daemon; every report goes to each (an HA pair judges twice).

    Nothing is shared between the links but the agent's stack table, which
    they only read: each has its own queue (and drop count), stream, backoff
    and record of which stacks its daemon holds.
    """

    def __init__(self, targets: "str | list[str] | tuple[str, ...]",
                 stacks: dict[str, pb.Stack], **kw) -> None:
        self.links = [Uplink(t, stacks, **kw) for t in collector_list(targets)]

    @property
    def target(self) -> str:
        return ",".join(u.target for u in self.links)

    @property
    def connected(self) -> bool:
        return any(u.connected for u in self.links)

    @property
    def last_error(self) -> str:
        return "; ".join(f"{u.target}: {u.last_error}" for u in self.links if u.last_error)

    @property
    def queue_length(self) -> int:
        return max(u.queue_length for u in self.links)

    @property
    def dropped_total(self) -> int:
        return sum(u.dropped_total for u in self.links)

    @property
    def sent_total(self) -> int:
        return sum(u.sent_total for u in self.links)

    @property
    def refused_total(self) -> int:
        return sum(u.refused_total for u in self.links)

    def submit(self, report: pb.NodeReport) -> None:
        for u in self.links:
            u.submit(report)

    def stop(self) -> None:
        for u in self.links:
            u.stop()

    async def run(self) -> None:
        await asyncio.gather(*(u.run() for u in self.links))

    def status(self) -> str:
        """``collector a:7470 connected`` or one clause per daemon of a pair."""
        parts = []
        for u in self.links:
            state = ("connected" if u.connected else
                     "unreachable" if u.last_error else "connecting")
            queue = f" (queue {u.queue_length})" if u.queue_length else ""
            parts.append(f"{u.target} {state}{queue}")
        return ("collector " if len(parts) == 1 else "collectors ") + ", ".join(parts)
