"""An ingest worker: terminates the agents' gRPC, forwards raw reports to the core.

    python -m ncclwatch.daemon.ingestworker --fd N   (started by ingestpool.py)

The core (the daemon process: job table, ticks, HTTP) starts N of these with
``--ingest-workers N``; each serves CollectorService on the daemon's gRPC
port with SO_REUSEPORT, so the kernel spreads the agents' connections over
them. A worker holds no daemon state. Per stream it reads one report,
checks that it is protobuf (else INVALID_ARGUMENT, as the in-process
service) and runs the checks that need no job table (precheck.py: a clean
report is forwarded as CHECKED, and the core skips them), forwards the raw bytes with the stream's id (and, first, the
agent's peer and the names its client certificate proves) and waits for the
core's answer: the serialized ReportResponse to write, or the status to
abort the stream with. One report per stream in flight keeps each stream's
order, and an agent is acked only for what the core applied. DumpStacks is
forwarded the same way.

The core sends the listen address and TLS material (the PEM bytes it read
and checked at startup: no key file to reopen here) in the first frame. The
worker exits when the link reaches EOF: the core stopped or died, so no
worker outlives it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import signal
import socket
import sys

import grpc

from ncclwatch.contract.bounds import Bounds
from ncclwatch.contract.limits import DEFAULT_BOUNDS
from ncclwatch.daemon import ingest, precheck
from ncclwatch.daemon import ingestlink as L
from ncclwatch.daemon.jobinfo import JobInfos
from ncclwatch.daemon.service import SERVER_OPTIONS, rpc_handler
from ncclwatch.daemon.validate import ReportError
from ncclwatch.tls import ServerTLS, peer_names
from ncclwatch.v1 import collector_pb2 as pb

log = logging.getLogger("ncclwatch.ingestworker")

#: Each worker binds the same port; the kernel balances connections over them.
WORKER_OPTIONS = SERVER_OPTIONS + (("grpc.so_reuseport", 1),)
#: Seconds between CPU reports to the core (its self-metrics).
STATS_EVERY = 1.0


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class Worker:
    def __init__(self, link_sock: socket.socket) -> None:
        self.sock = link_sock
        self.link: L.Link | None = None
        self.pending: dict[int, asyncio.Future] = {}
        self.ids = itertools.count(1)
        self.log_rejection = ingest.RejectionLog()
        self.config: asyncio.Future = asyncio.get_running_loop().create_future()
        self.lost = asyncio.Event()
        #: The core's bounds (in the first frame), and JobInfo verdicts by value.
        self.bounds = DEFAULT_BOUNDS
        self.infos = JobInfos()

    # -- the link to the core ------------------------------------------------------

    def on_frames(self, frames: list[tuple[int, int, bytes]]) -> None:
        for kind, sid, body in frames:
            if kind == L.CONFIG:
                if not self.config.done():
                    self.config.set_result(json.loads(body))
                continue
            fut = self.pending.pop(sid, None)
            if fut is not None and not fut.done():
                fut.set_result((kind, body))

    def on_lost(self) -> None:
        self.lost.set()
        if not self.config.done():
            self.config.set_exception(ConnectionError("the core closed the link"))
        for fut in self.pending.values():
            if not fut.done():
                fut.set_result((L.ERR, L.encode_error("UNAVAILABLE", "daemon stopping")))
        self.pending.clear()

    async def ask(self, kind: int, sid: int, body: bytes) -> tuple[int, bytes]:
        """Forward one message and wait for the core's answer to it."""
        if self.lost.is_set():
            return L.ERR, L.encode_error("UNAVAILABLE", "daemon stopping")
        fut = asyncio.get_running_loop().create_future()
        self.pending[sid] = fut
        self.link.send(kind, sid, body)
        return await fut

    # -- the gRPC side ---------------------------------------------------------------

    async def report(self, requests, context: grpc.aio.ServicerContext) -> None:
        """One agent's stream: each report checked here, applied by the core."""
        sid = next(self.ids)
        peer = self._open(sid, context)
        known: precheck.Header | None = None   # the header of its last clean report

        async def forward(raw: bytes) -> bytes:
            nonlocal known
            try:
                req = ingest.parse(pb.ReportRequest, raw)
            except ReportError as e:
                self.link.send(L.REJECT, sid, e.code.name.encode())  # the core counts it
                self.log_rejection(peer, e.code.name, e.message)
                raise
            clean = precheck.clean(req, self.bounds, self.infos.check, known)
            if clean:
                known = precheck.header(req)
            return await self._answer(L.CHECKED if clean else L.REPORT, sid, raw)
        try:
            await ingest.serve(context, forward)
        finally:
            self.pending.pop(sid, None)
            self.link.send(L.CLOSE, sid)

    async def dump_stacks(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        sid = next(self.ids)
        self._open(sid, context)  # the caller's certificate names (DumpStacks is scoped to them)
        try:
            return await self._answer(L.DUMP, sid, raw)
        except ReportError as e:
            await context.abort(e.code, e.message)

    def _open(self, sid: int, context: grpc.aio.ServicerContext) -> str:
        """Tell the core a call began, with its peer and the names its certificate
        proves; the peer."""
        peer, names = context.peer(), peer_names(context)
        self.link.send(L.OPEN, sid, L.encode_json(
            {"peer": peer, "names": None if names is None else sorted(names)}))
        return peer

    async def _answer(self, kind: int, sid: int, raw: bytes) -> bytes:
        """The core's answer to a forwarded message; ReportError with its status."""
        kind, body = await self.ask(kind, sid, raw)
        if kind == L.ERR:
            code, message = L.decode_error(body)
            raise ReportError(grpc.StatusCode[code], message)
        return body

    def handler(self) -> grpc.GenericRpcHandler:
        # Raw bytes in and out, as service.py: the core parses what it applies.
        return rpc_handler(self.report, self.dump_stacks)

    # -- the process ---------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        _, self.link = await loop.create_unix_connection(
            lambda: L.Link(self.on_frames, self.on_lost), sock=self.sock)
        try:
            cfg = await self.config
        except ConnectionError:
            return 1
        logging.getLogger().setLevel(cfg["log_level"])  # the pool sends all (ingestpool)
        self.bounds = Bounds(**cfg["bounds"])
        server = grpc.aio.server(options=WORKER_OPTIONS)
        server.add_generic_rpc_handlers((self.handler(),))
        port = 0
        try:
            if cfg.get("tls"):
                t = cfg["tls"]
                creds = ServerTLS(cert=t["cert"].encode(), key=t["key"].encode(),
                                  client_ca=t["client_ca"].encode()).credentials()
                port = server.add_secure_port(cfg["addr"], creds)
            else:
                port = server.add_insecure_port(cfg["addr"])
        except RuntimeError:  # grpc's way of saying "cannot bind"
            port = 0
        if port:
            await server.start()
        self.link.send(L.READY, 0, L.encode_json({"port": port, "pid": os.getpid()}))
        if not port:
            log.error("ingest worker %d: cannot listen for gRPC on %s", cfg["index"],
                      cfg["addr"])
            self.link.close()
            return 1
        stats = asyncio.create_task(self._stats())
        await self.lost.wait()  # the core stopped (or died): finish the streams, go
        stats.cancel()
        await server.stop(cfg["grace"])
        return 0

    async def _stats(self) -> None:
        while True:
            self.link.send(L.STATS, 0, L.encode_json({"cpu": _cpu_seconds()}))
            await asyncio.sleep(STATS_EVERY)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ncclwatch.daemon.ingestworker",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--fd", type=int, required=True,
                    help="the worker's end of the core's socketpair")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from ncclwatch.sanitize import install_log_escaping
    install_log_escaping()  # node names in its log lines: escaped, as the core's
    # The core says when to stop (by closing the link); a terminal's ^C or a
    # systemd stop signals the whole group, and the core's answer is what counts.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=a.fd)

    async def go() -> int:
        return await Worker(sock).run()

    return asyncio.run(go())


if __name__ == "__main__":
    sys.exit(main())
