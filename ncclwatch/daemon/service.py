"""gRPC front of the daemon: thin handlers over ``Daemon``.

Methods are registered with raw-bytes handlers so that a message that is
not valid protobuf gets INVALID_ARGUMENT with a reason, not grpc's generic
INTERNAL "Exception deserializing request!".
"""

from __future__ import annotations

import logging
import time
from typing import AsyncIterator

import grpc
from google.protobuf.message import DecodeError

from ncclwatch.daemon.core import Daemon
from ncclwatch.daemon.validate import ReportError
from ncclwatch.tls import peer_names
from ncclwatch.v1 import collector_pb2 as pb

log = logging.getLogger(__name__)

SERVICE = "ncclwatch.v1.CollectorService"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

SERVER_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Accept the agents' keepalive pings (every 30 s) without GOAWAY.
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 20_000),
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
)


def _parse(cls, data: bytes):
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


class CollectorService:
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.log_rejection = RejectionLog()

    async def report(self, requests: AsyncIterator[bytes],
                     context: grpc.aio.ServicerContext) -> None:
        """One agent's stream: apply each report, answer with its ack.

        Reads and writes go through ``context`` rather than the request
        iterator and an async generator: one layer less per message, about
        15% less CPU per report at the transport (bench/daemon_ingest.py).
        """
        agent_id = ""
        peer = context.peer()
        names = peer_names(context)  # fixed for the connection: read it once
        try:
            while True:
                raw = await context.read()
                if raw is grpc.aio.EOF:
                    return
                try:
                    try:
                        req = _parse(pb.ReportRequest, raw)
                    except ReportError as e:
                        self.daemon.rejected_total[e.code.name] += 1
                        raise
                    resp = self.daemon.ingest(req, cert_names=names)  # counts its rejections
                except ReportError as e:
                    self.log_rejection(peer, e.code.name, e.message)
                    await context.abort(e.code, e.message)
                    return
                if not agent_id:
                    agent_id = req.report.agent_id
                    log.info("agent %s on %s connected from %s", agent_id[:8],
                             req.report.node, peer)
                await context.write(resp.SerializeToString())
        finally:
            if agent_id:
                self.daemon.disconnected(agent_id)
                log.info("agent %s disconnected", agent_id[:8])

    async def dump_stacks(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            req = _parse(pb.DumpStacksRequest, raw)
        except ReportError as e:
            await context.abort(e.code, e.message)
        if not req.job_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "job_id is required")
        try:
            n = self.daemon.operator_request_stacks(req.job_id, req.reason or "operator request",
                                                    peer_names(context))
        except ReportError as e:
            await context.abort(e.code, e.message)
        return pb.DumpStacksResponse(agents=n).SerializeToString()

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(SERVICE, {
            "Report": grpc.stream_stream_rpc_method_handler(self.report),
            "DumpStacks": grpc.unary_unary_rpc_method_handler(self.dump_stacks),
        })
