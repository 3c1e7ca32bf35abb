"""Run the daemon: gRPC server, HTTP thread and the detection tick."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from typing import Any, Callable

import grpc

from ncclwatch.daemon.core import Daemon
from ncclwatch.daemon.heap import HeapPolicy
from ncclwatch.daemon.http import HttpServer, allowed_hosts
from ncclwatch.daemon.links import external_url
from ncclwatch.daemon.service import SERVER_OPTIONS, CollectorService
from ncclwatch.sdnotify import Notifier

log = logging.getLogger(__name__)

#: A tick a report woke (Daemon.wake) runs no sooner than this after the last.
URGENT_GAP = 0.05


def split_hostport(addr: str, default_port: int) -> tuple[str, int]:
    """``HOST:PORT``, ``[v6]:PORT``, ``:PORT`` or ``HOST``."""
    if addr.startswith("["):
        host, _, rest = addr[1:].partition("]")
        return host, int(rest.lstrip(":") or default_port)
    host, sep, port = addr.rpartition(":")
    if not sep:
        return addr, default_port
    return host or "0.0.0.0", int(port)


def loop_caller(loop: asyncio.AbstractEventLoop, timeout: float = 10.0) -> Callable:
    """Run ``fn()`` on ``loop`` from another thread and return its result.

    Must be created on the loop's own thread (calls from it run inline).
    """
    owner = threading.get_ident()

    def call(fn: Callable[[], Any]) -> Any:
        if threading.get_ident() == owner:
            return fn()
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as e:  # hand any error to the caller's thread
                fut.set_exception(e)

        loop.call_soon_threadsafe(run)
        return fut.result(timeout)

    return call


class DaemonServer:
    """The daemon's network side; ``await start()``, then ``await stop()``."""

    def __init__(self, daemon: Daemon, notifier: Notifier | None = None, *,
                 local_socket: str | None = None) -> None:
        """``local_socket``: also listen, without TLS, on this unix socket path
        (``run``'s own agent, in a folder only this user can open)."""
        self.daemon = daemon
        self.notifier = notifier
        self.local_socket = local_socket
        self.grpc_port = 0
        self.http_port = 0
        self._server: grpc.aio.Server | None = None
        self._pool = None  # ingestpool.IngestPool with ingest_workers
        self._http: HttpServer | None = None
        self._tick_task: asyncio.Task | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        cfg = self.daemon.config
        loop = asyncio.get_running_loop()
        if cfg.ingest_workers:
            await self._start_workers()
        else:
            self._server = grpc.aio.server(options=SERVER_OPTIONS)
            self._server.add_generic_rpc_handlers((CollectorService(self.daemon).handler(),))
            try:
                if cfg.tls:
                    self.grpc_port = self._server.add_secure_port(_grpc_addr(cfg.grpc),
                                                                  cfg.tls.credentials())
                else:
                    self.grpc_port = self._server.add_insecure_port(_grpc_addr(cfg.grpc))
            except RuntimeError:  # grpc's way of saying "cannot bind"
                self.grpc_port = 0
            if not self.grpc_port:
                raise OSError(f"cannot listen for gRPC on {cfg.grpc}")
            if self.local_socket and not self._server.add_insecure_port(
                    f"unix:{self.local_socket}"):
                raise OSError(f"cannot listen for gRPC on unix:{self.local_socket}")
            await self._server.start()
        host, port = split_hostport(cfg.http, 7471)
        url = external_url(cfg.external_url, cfg.http, bool(cfg.web and cfg.web.ssl_context))
        self._http = HttpServer(self.daemon, host, port, loop_caller(loop), cfg.web,
                                allowed_hosts(cfg.allowed_hosts, host, url))
        self.http_port = self._http.port
        self._http.start()
        self._tick_task = asyncio.create_task(self._ticks(), name="ncclwatch-detect")
        auth = " (basic auth)" if cfg.web and cfg.web.auth else ""
        workers = f", {cfg.ingest_workers} ingest workers" if cfg.ingest_workers else ""
        log.info("ncclwatch daemon: gRPC%s on %s:%d%s, HTTP on %s://%s:%d/%s",
                 " (mTLS)" if cfg.tls else "", split_hostport(cfg.grpc, 7470)[0],
                 self.grpc_port, workers, self._http.scheme, host, self.http_port, auth)
        if self.notifier:  # both ports listen now (every worker, with workers)
            self.notifier.ready(status_line(self.daemon))

    async def _start_workers(self) -> None:
        """``ingest_workers`` processes serve the gRPC port (ingestpool.py); this
        process serves gRPC only on the local socket, if it has one."""
        from ncclwatch.daemon.ingestpool import IngestPool

        cfg = self.daemon.config
        self._pool = IngestPool(self.daemon, cfg.ingest_workers, _grpc_addr(cfg.grpc), cfg.tls)
        await self._pool.start()
        self.grpc_port = self._pool.port
        if self.local_socket:
            self._server = grpc.aio.server(options=SERVER_OPTIONS)
            self._server.add_generic_rpc_handlers((CollectorService(self.daemon).handler(),))
            if not self._server.add_insecure_port(f"unix:{self.local_socket}"):
                await self._pool.stop()
                raise OSError(f"cannot listen for gRPC on unix:{self.local_socket}")
            await self._server.start()

    async def _ticks(self) -> None:
        heap = HeapPolicy()
        loop = asyncio.get_running_loop()
        urgent = asyncio.Event()
        self.daemon.wake = urgent.set
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            while not self._stopping.is_set():
                urgent.clear()
                try:
                    self.daemon.tick()
                    heap.step()
                except Exception:
                    log.exception("detection tick failed")
                else:
                    # Only a loop that still ticks feeds systemd's watchdog.
                    if self.notifier:
                        self.notifier.alive(lambda: status_line(self.daemon))
                ended = loop.time()
                # The next tick after the interval, or as soon as a report may have
                # completed a stall's evidence (Daemon.wake), URGENT_GAP at the least.
                woken = asyncio.ensure_future(urgent.wait())
                await asyncio.wait({stopping, woken}, timeout=self.daemon.config.tick,
                                   return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                if urgent.is_set() and not self._stopping.is_set():
                    await asyncio.sleep(max(0.0, ended + URGENT_GAP - loop.time()))
        finally:
            stopping.cancel()
            self.daemon.wake = None

    async def stop(self, grace: float = 2.0) -> None:
        self._stopping.set()
        if self._tick_task:
            await self._tick_task
        if self._server:
            await self._server.stop(grace)
        if self._pool:
            self._pool.grace = grace
            await self._pool.stop()
        if self._http:
            await asyncio.to_thread(self._http.stop)


def status_line(daemon: Daemon) -> str:
    """One line for ``systemctl status``: jobs, open stalls, connected agents."""
    jobs = len(daemon.table.jobs)
    stalls = sorted(daemon.incidents.active)
    agents = sum(1 for a in daemon.table.agents.values() if a.connected)
    if stalls:
        shown = ", ".join(f"{kind.value} in job {job}" for job, kind in stalls[:2])
        more = f", +{len(stalls) - 2} more" if len(stalls) > 2 else ""
        stall_text = f"{_n(len(stalls), 'stall')} ({shown}{more})"
    else:
        stall_text = "no stalls"
    return f"{_n(jobs, 'job')}, {stall_text}, {_n(agents, 'agent')} connected"


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _grpc_addr(addr: str) -> str:
    host, port = split_hostport(addr, 7470)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
