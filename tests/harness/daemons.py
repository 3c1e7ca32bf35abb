"""A real daemon in this process, on loopback ports: its gRPC side driven by the test
(``Harness``), or its HTTP side served from a thread (``serving``); ``until`` waits in
the test's event loop for what the daemon shows."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from typing import Iterator

import grpc

from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.server import DaemonServer
from ncclwatch.tls import ClientTLS, server_tls
from ncclwatch.v1 import collector_pb2 as pb
from ncclwatch.v1 import collector_pb2_grpc as pb_grpc


class Harness:
    """A ``Daemon`` and its ``DaemonServer`` on free loopback ports, in the test's event loop.

    Without ``pki``: plaintext gRPC, ``send`` on the harness's own channel. With
    ``pki`` (``credentials.make_pki``): mTLS from ``pki/ca``, the target named
    ``localhost`` as the daemon's certificate is; ``send_over`` a channel made by
    ``secure`` with a node's credentials. ``config``: more DaemonConfig fields.
    """

    def __init__(self, pki: Path | None = None, **config) -> None:
        tls = None
        if pki is not None:
            d = pki / "ca"
            tls = server_tls({"tls_cert": str(d / "daemon.pem"),
                              "tls_key": str(d / "daemon-key.pem"),
                              "tls_client_ca": str(d / "ca.pem")})
        self.tls = tls is not None
        self.daemon = Daemon(DaemonConfig(grpc="127.0.0.1:0", http="127.0.0.1:0", tls=tls,
                                          **config))
        self.server = DaemonServer(self.daemon)
        self.channel: grpc.aio.Channel | None = None

    async def __aenter__(self) -> "Harness":
        await self.server.start()
        if self.tls:
            self.target = f"localhost:{self.server.grpc_port}"
        else:
            self.target = f"127.0.0.1:{self.server.grpc_port}"
            self.channel = grpc.aio.insecure_channel(self.target)
            self.stub = pb_grpc.CollectorServiceStub(self.channel)
        return self

    async def __aexit__(self, *exc) -> None:
        if self.channel is not None:
            await self.channel.close()
        await self.server.stop(grace=0.1)

    async def send(self, *reqs: pb.ReportRequest) -> list[pb.ReportResponse]:
        """Reports on one stream of the harness's plaintext channel; the acks."""
        call = self.stub.Report(iter(reqs))
        return [r async for r in call]

    async def send_raw(self, payload: bytes) -> None:
        """Bytes on the Report stream as they are, no protobuf in between."""
        call = self.channel.stream_stream("/ncclwatch.v1.CollectorService/Report",
                                          request_serializer=None, response_deserializer=None)
        async for _ in call(iter([payload])):
            pass

    def secure(self, tls: ClientTLS) -> grpc.aio.Channel:
        """A channel to the daemon with a node's credentials (``credentials.client``)."""
        return grpc.aio.secure_channel(self.target, tls.credentials(), options=tls.options())

    async def send_over(self, channel: grpc.aio.Channel, *reqs) -> list:
        """Reports on one stream of ``channel`` (closed after); the acks."""
        async with channel:
            call = pb_grpc.CollectorServiceStub(channel).Report(iter(reqs))
            return [r async for r in call]


@contextlib.contextmanager
def serving(web=None, **config) -> Iterator[int]:
    """A real DaemonServer on an event loop in a thread, with ``--web-config``
    ``web`` (``webconfig.load``) and more DaemonConfig fields; yields the HTTP port."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = DaemonServer(Daemon(DaemonConfig(grpc="127.0.0.1:0", http="127.0.0.1:0", web=web,
                                              **config)))
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    try:
        yield server.http_port
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(0.1), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


async def until(pred, timeout: float = 10.0, what: str = "") -> None:
    """Wait in the running event loop until ``pred()`` holds; fail after ``timeout`` s."""
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what or pred}")
        await asyncio.sleep(0.05)
