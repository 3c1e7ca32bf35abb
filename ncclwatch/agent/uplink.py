"""The agent's one long-lived gRPC stream to the daemon.

Reports wait in a bounded queue that drops the oldest (a report is a full
snapshot, so the newest is worth most) and counts drops. A report leaves
the queue only when the daemon acknowledges it: reports a broken stream
took but never got acked go back to the front, so nothing is lost silently. Stack frames are
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
from typing import Callable

import grpc

from ncclwatch.agent.report import PROTOCOL_VERSION
from ncclwatch.tls import ClientTLS
from ncclwatch.v1 import collector_pb2 as pb
from ncclwatch.v1 import collector_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

#: Keepalive per gRPC guidance: pings well above the server's minimum
#: interval, so a silent partition is noticed in ~40 s, not at TCP timeout.
CHANNEL_OPTIONS = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 5_000),
)


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
                 max_queue: int = 32,
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
        self.sent_total = 0
        self.connected = False
        self.last_error = ""

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
                got_reply = await self._session()
                if got_reply:
                    backoff.reset()
            except grpc.aio.AioRpcError as e:
                self._log_error(f"{e.code().name}: {e.details()}")
            except Exception as e:  # never let transport trouble end the agent
                self._log_error(f"{type(e).__name__}: {e}")
            self.connected = False
            if self._stopped.is_set():
                break
            try:
                await asyncio.wait_for(self._stopped.wait(), backoff.next())
            except asyncio.TimeoutError:
                pass

    def _log_error(self, msg: str) -> None:
        # Deduplicate: a dead collector should not flood the log.
        if msg != self.last_error:
            log.warning("collector %s: %s (retrying with backoff)", self.target, msg)
        self.last_error = msg

    async def _session(self) -> bool:
        sent: set[str] = set()
        inflight: collections.deque[pb.NodeReport] = collections.deque()
        got_reply = False
        live = [True]  # gRPC may pull from the generator after the call ended
        try:
            async with self._channel() as ch:
                stub = pb_grpc.CollectorServiceStub(ch)
                call = stub.Report(self._requests(sent, inflight, live))
                async for resp in call:
                    while inflight and inflight[0].seq <= resp.ack_seq:
                        inflight.popleft()
                    got_reply = self._on_reply(resp, sent, got_reply)
        finally:
            live[0] = False
            self._requeue(inflight)
        return got_reply

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
        sent.difference_update(resp.missing_stack_ids)
        for cmd in resp.commands:
            self._on_command(cmd)
        return True

    async def _requests(self, sent: set[str], inflight: "collections.deque[pb.NodeReport]",
                        live: list[bool]):
        self._on_connect()
        while not self._stopped.is_set() and live[0]:
            if not self._queue:
                self._ready.clear()
                await self._ready.wait()
                continue
            report = self._queue.popleft()
            inflight.append(report)
            out = pb.NodeReport()
            out.CopyFrom(report)
            for s in report.samples:
                sid = s.stack_id
                if sid and sid not in sent and sid in self._stacks:
                    out.stacks.append(self._stacks[sid])
                    sent.add(sid)
            self.sent_total += 1
            yield pb.ReportRequest(protocol_version=PROTOCOL_VERSION, report=out)
