"""gRPC front of the daemon: thin handlers over ``Daemon``.

Methods are registered with raw-bytes handlers so that a message that is
not valid protobuf gets INVALID_ARGUMENT with a reason, not grpc's generic
INTERNAL "Exception deserializing request!". The step itself (parse,
validate, apply, answer) is ingest.py's, shared with the ingest workers.
"""

from __future__ import annotations

from typing import AsyncIterator

import grpc

from ncclwatch.daemon import ingest
from ncclwatch.daemon.core import Daemon
from ncclwatch.daemon.validate import ReportError
from ncclwatch.tls import peer_names

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


class CollectorService:
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.log_rejection = ingest.RejectionLog()

    async def report(self, requests: AsyncIterator[bytes],
                     context: grpc.aio.ServicerContext) -> None:
        """One agent's stream: apply each report, answer with its ack."""
        # The certificate's names are fixed for the connection: read them once.
        stream = ingest.Stream(self.daemon, context.peer(), peer_names(context),
                               self.log_rejection)
        try:
            await ingest.serve(context, stream.report)
        finally:
            stream.close()

    async def dump_stacks(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            req = ingest.dump_request(raw)
            return ingest.dump_stacks(self.daemon, req, peer_names(context))
        except ReportError as e:
            await context.abort(e.code, e.message)

    def handler(self) -> grpc.GenericRpcHandler:
        return rpc_handler(self.report, self.dump_stacks)


def rpc_handler(report, dump_stacks) -> grpc.GenericRpcHandler:
    """The service's methods, raw bytes in and out (the ingest workers' too)."""
    return grpc.method_handlers_generic_handler(SERVICE, {
        "Report": grpc.stream_stream_rpc_method_handler(report),
        "DumpStacks": grpc.unary_unary_rpc_method_handler(dump_stacks),
    })
