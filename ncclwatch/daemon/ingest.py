"""The ingest step: one agent report, or one DumpStacks call, from raw bytes to its answer.

Reports reach the daemon by two roads: its own gRPC service (service.py),
or, with ``--ingest-workers N``, worker processes (ingestworker.py) that
check the bytes and forward them to the core, which applies them
(ingestpool.py). All three call this module, so the parse, the validation,
the status codes, the rejection counters and log lines have one home and
cannot drift between the roads; each road keeps only its transport.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Awaitable, Callable

import grpc
from google.protobuf.message import DecodeError

from ncclwatch.daemon.validate import ReportError
from ncclwatch.v1 import collector_pb2 as pb

if TYPE_CHECKING:
    from ncclwatch.daemon.core import Daemon

log = logging.getLogger(__name__)


def parse(cls, data: bytes):
    """``cls`` from its wire bytes; ReportError (INVALID_ARGUMENT) if they are not one."""
    try:
        return cls.FromString(data)
    except (DecodeError, ValueError) as e:
        raise ReportError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"not a valid {cls.DESCRIPTOR.full_name}: {e}") from None


class RejectionLog:
    """At most one log line per status code every ``every`` seconds.

    A broken or hostile agent can send thousands of bad reports a second;
    the counter (ncclwatch_daemon_rejected_reports_total) sees all of them,
    the log a sample with how many it left out.
    """

    def __init__(self, every: float = 10.0, clock=time.monotonic) -> None:
        self.every, self.clock = every, clock
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def __call__(self, peer: str, code: str, message: str) -> bool:
        now = self.clock()
        if now - self._last.get(code, -1e18) < self.every:
            self._quiet[code] = self._quiet.get(code, 0) + 1
            return False
        more = self._quiet.pop(code, 0)
        self._last[code] = now
        log.warning("rejected report from %s: %s: %s%s", peer, code, message,
                    f" (and {more} more {code} since the last line)" if more else "")
        return True


class Stream:
    """One agent's Report stream, applied in the core (in process, or forwarded).

    ``names``: what the connection's client certificate proves (None without
    TLS); ``where``: said after the peer in the "connected" log line.
    """

    __slots__ = ("daemon", "peer", "names", "log_rejection", "where", "agent_id")

    def __init__(self, daemon: Daemon, peer: str, names: frozenset[str] | None,
                 log_rejection: RejectionLog, where: str = "") -> None:
        self.daemon, self.peer, self.names = daemon, peer, names
        self.log_rejection, self.where = log_rejection, where
        self.agent_id = ""

    def report(self, raw: bytes, prechecked: bool = False) -> bytes:
        """Apply one raw ReportRequest: the serialized ReportResponse, or
        ReportError (counted and logged) to end the stream with.
        ``prechecked``: its worker found it clean (precheck.py)."""
        d = self.daemon
        try:
            try:
                req = parse(pb.ReportRequest, raw)
            except ReportError as e:
                d.rejected_total[e.code.name] += 1
                raise
            resp = d.ingest(req, cert_names=self.names, prechecked=prechecked)  # counts rejections
        except ReportError as e:
            self.log_rejection(self.peer, e.code.name, e.message)
            raise
        if not self.agent_id:
            self.agent_id = req.report.agent_id
            log.info("agent %s on %s connected from %s%s", self.agent_id[:8], req.report.node,
                     self.peer, self.where)
        return resp.SerializeToString()

    def close(self) -> None:
        """The stream ended: its agent, if it said who it is, is disconnected."""
        if self.agent_id:
            self.daemon.disconnected(self.agent_id)
            log.info("agent %s disconnected", self.agent_id[:8])


async def serve(context: grpc.aio.ServicerContext,
                answer: Callable[[bytes], bytes | Awaitable[bytes]]) -> None:
    """Read one Report stream's messages and write each one's answer, in order.

    ``answer(raw)``: the bytes to write, or an awaitable of them; a
    ReportError aborts the stream with its status. Reads and writes go
    through ``context`` rather than the request iterator and an async
    generator: one layer less per message, about 15% less CPU per report
    at the transport (bench/daemon_ingest.py).
    """
    while True:
        raw = await context.read()
        if raw is grpc.aio.EOF:
            return
        try:
            body = answer(raw)
            if not isinstance(body, bytes):
                body = await body
        except ReportError as e:
            await context.abort(e.code, e.message)
            return
        await context.write(body)


def dump_request(raw: bytes) -> pb.DumpStacksRequest:
    """A DumpStacks call's request, checked; ReportError if it is not one."""
    req = parse(pb.DumpStacksRequest, raw)
    if not req.job_id:
        raise ReportError(grpc.StatusCode.INVALID_ARGUMENT, "job_id is required")
    return req


def dump_stacks(daemon: Daemon, req: pb.DumpStacksRequest,
                names: frozenset[str] | None) -> bytes:
    """Queue the stack dumps a DumpStacks call asks for (``names``: what the
    caller's certificate proves, None without TLS): the serialized response,
    or ReportError (NOT_FOUND, PERMISSION_DENIED)."""
    n = daemon.operator_request_stacks(req.job_id, req.reason or "operator request", names)
    return pb.DumpStacksResponse(agents=n).SerializeToString()
