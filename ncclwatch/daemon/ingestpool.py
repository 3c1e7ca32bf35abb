"""The core's side of the ingest workers (``--ingest-workers N``).

The daemon process keeps the job table, the detection ticks, HTTP and the
commands; N worker processes (ingestworker.py) terminate the agents' gRPC on
the daemon's port (SO_REUSEPORT) and forward raw reports here over a
socketpair each. Every forwarded report is applied on the event loop by
ingest.py's step, the one service.py calls in process: the same
validation, the same mTLS identity check (the worker forwards the names the
connection's certificate proves), the same counters; the answer (the
serialized ReportResponse, or the status to abort with) goes back in the
same batch as the others of that read. A stream's end marks its agent
disconnected. The transport's CPU (HTTP/2, TLS, protobuf framing and a
first parse, and every check that needs no job table: precheck.py) moves to
the workers; the core pays one parse, the table's checks and the apply.

A worker that exits is started again (with a backoff if it keeps dying at
once), and so is one silent for ``WEDGED_AFTER`` (killed first); its agents
reconnect by themselves, to any worker. Stopping the core
closes the links: each worker finishes its streams and exits, and any still
there after the grace is killed. A worker also exits when its link reaches
EOF, so none outlives a core killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

import ncclwatch
from ncclwatch.daemon import ingest
from ncclwatch.daemon import ingestlink as L
from ncclwatch.daemon.core import Daemon
from ncclwatch.daemon.validate import ReportError
from ncclwatch.tls import ServerTLS

log = logging.getLogger(__name__)

#: Seconds a worker gets to import, bind and say READY.
START_TIMEOUT = 60.0
#: A worker that dies sooner than this after its start is restarted with a backoff.
QUICK_DEATH = 10.0
#: A listening worker silent this long (it says its CPU every second) is wedged:
#: it is killed, and so started again.
WEDGED_AFTER = 30.0
#: Environment the workers must not inherit: systemd talks to the core alone.
PRIVATE_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID",
               "LISTEN_FDNAMES")


@dataclass
class WorkerStats:
    """One worker slot's counters, kept across its restarts (self-metrics)."""

    index: int
    pid: int = 0
    listening: bool = False
    forwarded_total: int = 0   # reports the core received from it
    prechecked_total: int = 0  # of them, found clean by the worker (precheck.py)
    restarts_total: int = 0
    cpu_done: float = 0.0      # CPU seconds of its earlier processes
    cpu_now: float = 0.0       # of the current one, as it last said (every second)

    @property
    def cpu_seconds_total(self) -> float:
        return self.cpu_done + self.cpu_now


@dataclass(eq=False)
class _Process:
    """One process of a slot: its link and its open streams."""

    stats: WorkerStats
    proc: asyncio.subprocess.Process
    started: float
    link: L.Link | None = None
    ready: asyncio.Future | None = None
    streams: dict[int, ingest.Stream] = field(default_factory=dict)
    gone: bool = False
    heard: float = 0.0  # monotonic time of its last frame


class IngestPool:
    def __init__(self, daemon: Daemon, count: int, addr: str, tls: ServerTLS | None = None,
                 *, grace: float = 1.0) -> None:
        """``addr``: the gRPC listen address as grpc writes it (``host:port``,
        ``[v6]:port``); port 0 picks one, which the other workers then share."""
        self.daemon = daemon
        self.count = count
        self.addr = addr
        self.tls = tls
        self.grace = grace
        self.port = 0
        self.stats = [WorkerStats(i) for i in range(count)]
        self.current: list[_Process | None] = [None] * count
        self.log_rejection = ingest.RejectionLog()
        self.wedged_after = WEDGED_AFTER
        self._stopping = False
        self._supervisors: list[asyncio.Task] = []

    # -- start, supervise, stop ----------------------------------------------------------

    async def start(self) -> None:
        """Every worker listens when this returns; OSError if one cannot."""
        self.daemon.ingest_workers = self.stats
        host, _, port = self.addr.rpartition(":")
        self.port = int(port)
        try:
            if self.port == 0:  # the first picks the port the others then share
                await self._start_one(0)
                await asyncio.gather(*(self._start_one(i) for i in range(1, self.count)))
            else:
                await asyncio.gather(*(self._start_one(i) for i in range(self.count)))
        except BaseException:
            await self.stop()
            raise
        self._supervisors = [asyncio.create_task(self._supervise(i), name=f"ingest-worker-{i}")
                             for i in range(self.count)]
        self._supervisors.append(asyncio.create_task(self._watch(), name="ingest-watch"))
        log.info("%d ingest workers listening on %s:%d (pids %s)", self.count, host, self.port,
                 ", ".join(str(s.pid) for s in self.stats))

    def _listen_addr(self) -> str:
        host = self.addr.rpartition(":")[0]
        return f"{host}:{self.port}"

    async def _start_one(self, i: int) -> None:
        p = await self._spawn(i)
        port = await self._wait_ready(p)
        if not port:
            raise OSError(f"cannot listen for gRPC on {self._listen_addr()} "
                          f"(ingest worker {i})")
        self.port = self.port or port

    async def _spawn(self, i: int) -> _Process:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {k: v for k, v in os.environ.items() if k not in PRIVATE_ENV}
        # The worker runs this very package: a checkout the core was imported
        # from goes first on its path (an installed one is there already).
        root = str(Path(ncclwatch.__file__).resolve().parent.parent)
        installed = {str(Path(sysconfig.get_paths()[k]).resolve()) for k in ("purelib", "platlib")}
        if root not in installed:
            env["PYTHONPATH"] = os.pathsep.join(x for x in (root, env.get("PYTHONPATH")) if x)
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "ncclwatch.daemon.ingestworker",
                "--fd", str(theirs.fileno()), pass_fds=(theirs.fileno(),), env=env,
                stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        stats = self.stats[i]
        p = _Process(stats, proc, time.monotonic(), ready=loop.create_future())
        p.heard = p.started
        self.current[i] = p
        stats.pid, stats.cpu_now = proc.pid, 0.0
        _, p.link = await loop.create_unix_connection(
            lambda: L.Link(lambda frames: self._on_frames(p, frames), lambda: self._forget(p)),
            sock=ours)
        p.link.send(L.CONFIG, 0, L.encode_json(self._config(i)))
        return p

    def _config(self, i: int) -> dict:
        tls = None
        if self.tls is not None:
            tls = {"cert": self.tls.cert.decode(), "key": self.tls.key.decode(),
                   "client_ca": self.tls.client_ca.decode()}
        return {"index": i, "addr": self._listen_addr(), "tls": tls, "grace": self.grace,
                "bounds": dataclasses.asdict(self.daemon.config.bounds),
                "log_level": logging.getLogger().getEffectiveLevel()}

    async def _wait_ready(self, p: _Process) -> int:
        """The port the worker listens on; 0 if it could not, or died first."""
        exited = asyncio.ensure_future(p.proc.wait())
        try:
            done, _ = await asyncio.wait({p.ready, exited}, timeout=START_TIMEOUT,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            exited.cancel()
        if p.ready in done:
            port = p.ready.result()
            p.stats.listening = bool(port)
            return port
        if not done:
            log.error("ingest worker %d (pid %d) not ready after %.0f s", p.stats.index,
                      p.proc.pid, START_TIMEOUT)
            p.proc.kill()
        return 0

    async def _supervise(self, i: int) -> None:
        quick = 0
        while not self._stopping:
            p = self.current[i]
            rc = await p.proc.wait()
            self._forget(p)
            if self._stopping:
                return
            lived = time.monotonic() - p.started
            quick = quick + 1 if lived < QUICK_DEATH else 0
            delay = min(10.0, 0.5 * 2 ** (quick - 1)) if quick else 0.1
            how = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
            log.warning("ingest worker %d (pid %d) ended (%s) after %.0f s; its agents "
                        "reconnect; starting a new one in %.1f s", i, p.proc.pid, how, lived,
                        delay)
            await asyncio.sleep(delay)
            if self._stopping:
                return
            try:
                new = await self._spawn(i)
            except OSError as e:
                log.error("cannot start ingest worker %d: %s", i, e)
                p.started = time.monotonic()  # counts as a quick death: back off
                continue  # the old process stays current: wait() returns at once
            self.stats[i].restarts_total += 1
            if await self._wait_ready(new):
                log.info("ingest worker %d listening again (pid %d)", i, new.proc.pid)

    async def _watch(self) -> None:
        """Kill a worker that stopped talking (its loop wedged); _supervise restarts it."""
        while not self._stopping:
            await asyncio.sleep(min(5.0, self.wedged_after / 4))
            now = time.monotonic()
            for p in self.current:
                if p is not None and p.stats.listening and not p.gone \
                        and p.proc.returncode is None and now - p.heard > self.wedged_after:
                    log.warning("ingest worker %d (pid %d) silent for %.0f s; killing it",
                                p.stats.index, p.proc.pid, now - p.heard)
                    p.proc.kill()

    def _forget(self, p: _Process) -> None:
        """The process or its link is gone: its streams end, its CPU is banked."""
        if p.gone:
            return
        p.gone = True
        s = p.stats
        s.listening = False
        s.cpu_done += s.cpu_now
        s.cpu_now = 0.0
        for st in p.streams.values():
            if st.agent_id:
                self.daemon.disconnected(st.agent_id)
        p.streams.clear()
        if p.ready is not None and not p.ready.done():
            p.ready.set_result(0)
        if p.link is not None:
            p.link.close()

    async def stop(self) -> None:
        """Close every link (the workers finish their streams and exit), then wait;
        kill what is left after the grace."""
        self._stopping = True
        procs = [p for p in self.current if p is not None]
        for p in procs:
            if p.link is not None:
                p.link.close()
        waits = [asyncio.ensure_future(p.proc.wait()) for p in procs]
        if waits:
            _, late = await asyncio.wait(waits, timeout=self.grace + 5.0)
            for p in procs:
                if p.proc.returncode is None:
                    log.warning("ingest worker %d (pid %d) did not stop; killing it",
                                p.stats.index, p.proc.pid)
                    p.proc.kill()
            if late:
                await asyncio.wait(late, timeout=10.0)
        for p in procs:
            self._forget(p)
        for t in self._supervisors:
            t.cancel()
        await asyncio.gather(*self._supervisors, return_exceptions=True)

    # -- what the workers forward ----------------------------------------------------------

    def _on_frames(self, p: _Process, frames: list[tuple[int, int, bytes]]) -> None:
        p.heard = time.monotonic()
        for kind, sid, body in frames:
            if kind == L.CHECKED:
                p.stats.prechecked_total += 1
                self._report(p, sid, body, prechecked=True)
            elif kind == L.REPORT:
                self._report(p, sid, body)
            elif kind == L.OPEN:
                o = json.loads(body)
                names = None if o["names"] is None else frozenset(o["names"])
                p.streams[sid] = ingest.Stream(self.daemon, o["peer"], names, self.log_rejection,
                                               f" (ingest worker {p.stats.index})")
            elif kind == L.CLOSE:
                st = p.streams.pop(sid, None)
                if st is not None:
                    st.close()
            elif kind == L.REJECT:
                self.daemon.rejected_total[body.decode()] += 1
            elif kind == L.DUMP:
                self._dump(p, sid, body)
            elif kind == L.STATS:
                p.stats.cpu_now = json.loads(body)["cpu"]
            elif kind == L.READY:
                if p.ready is not None and not p.ready.done():
                    p.ready.set_result(json.loads(body)["port"])

    def _report(self, p: _Process, sid: int, raw: bytes, prechecked: bool = False) -> None:
        """One forwarded report, applied by the step service.py applies in process
        (``prechecked``: the worker ran the checks that need no table: precheck.py)."""
        p.stats.forwarded_total += 1
        st = p.streams.get(sid)
        if st is None:  # cannot happen: OPEN comes first on the same link
            p.link.send(L.ERR, sid, L.encode_error("INTERNAL", "unknown stream"))
            return
        try:
            body = st.report(raw, prechecked)  # counts and logs its rejections
        except ReportError as e:
            p.link.send(L.ERR, sid, L.encode_error(e.code.name, e.message))
            return
        except Exception:  # a bug: end this stream (the agent retries), keep the rest
            log.exception("applying a report from %s failed", st.peer)
            p.link.send(L.ERR, sid, L.encode_error("INTERNAL", "the daemon failed to apply "
                                                               "the report"))
            return
        p.link.send(L.OK, sid, body)

    def _dump(self, p: _Process, sid: int, raw: bytes) -> None:
        """A forwarded DumpStacks call, answered by the step service.py answers in process."""
        st = p.streams.pop(sid, None)  # the OPEN the worker sent with the caller's names
        try:
            req = ingest.dump_request(raw)
            if st is None and self.daemon.config.tls is not None:
                raise ReportError(grpc.StatusCode.PERMISSION_DENIED,
                                  "caller's certificate not forwarded")
            body = ingest.dump_stacks(self.daemon, req, st.names if st else None)
        except ReportError as e:
            p.link.send(L.ERR, sid, L.encode_error(e.code.name, e.message))
            return
        p.link.send(L.OK, sid, body)
