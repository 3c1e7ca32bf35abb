"""Python stacks of a rank through ``py-spy dump --json --nonblocking``.

``--nonblocking`` is not optional for the stacks taken every round: py-spy
otherwise ptrace-stops the target while it reads, and the agent must never
pause a training process that runs. Each dump runs under a timeout (the child
is killed, the rank untouched), and at most one dump per pid runs at a time.

A rank whose root was changed with ``chroot`` (not ``pivot_root``) and
whose interpreter loads a shared libpython is dumped in a root the agent
builds for py-spy (rootview.py says why py-spy needs it); every other rank
exactly as before.

The one exception is ``dump_native``: ``--native`` unwinds C++ frames and
py-spy refuses it with ``--nonblocking``, so it pauses the rank for the
unwind. The agent takes one only of a rank that has already sat still past
a threshold, at most once per still period (policy.native_due); its cost,
py-spy's whole run (an upper bound on the pause), goes into a histogram.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

from ncclwatch.agent import caps, rootview
from ncclwatch.contract import health
from ncclwatch.stacks import DumpFormatError, ThreadDump, parse_pyspy_json

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 3.0
#: A native dump reads libtorch's symbols first: slower than a Python one.
NATIVE_TIMEOUT_SECONDS = 8.0
#: Upper bounds (seconds) of the native-dump histogram buckets; +Inf follows.
NATIVE_BUCKETS = health.NATIVE_BUCKETS


def find_pyspy() -> str | None:
    """py-spy next to this interpreter (the venv), else on PATH."""
    here = Path(sys.executable).with_name("py-spy")
    if here.exists():
        return str(here)
    return shutil.which("py-spy")


def dump_argv(binary: str, pid: int, with_locals: bool = False) -> list[str]:
    """The one place py-spy's command line is built (tests assert on it).
    ``with_locals``: frames' locals too (agent.ranklocals: an unnumbered
    rank's set-up frames), still nonblocking."""
    return [binary, "dump", "--json", *(("--locals",) if with_locals else ()),
            "--nonblocking", "--pid", str(pid)]


def native_argv(binary: str, pid: int) -> list[str]:
    """A native dump: pauses the rank (py-spy refuses --native with --nonblocking)."""
    return [binary, "dump", "--json", "--native", "--pid", str(pid)]


def locals_argv(binary: str, pid: int) -> list[str]:
    """A nonblocking dump with each frame's locals (launchers.spawn_index)."""
    return dump_argv(binary, pid, with_locals=True)


class PySpyError(RuntimeError):
    pass


#: Where the view helper listens (viewhelper.py), unless the agent is told otherwise.
DEFAULT_VIEW_SOCKET = "/run/ncclwatch-view/view.sock"
#: Seconds to tell whether a rank needs a view: its files may sit on a hung mount.
VIEW_ROUTE_TIMEOUT = 2.0
#: A route through the view helper (view_route).
HELPER = "helper"
#: The agent's own py-spy, opened once per path: what a rank's view executes.
_view_fds: dict[str, int] = {}
#: Capabilities a chroot'd rank's view needs and this process lacks (read once).
_view_lacks: list[str] | None = None
_view_warned = False


def view_route(binary: str, pid: int, socket_path: str | None) -> dict | str:
    """How py-spy reaches ``pid``: {} (directly, the common case), HELPER (the
    view helper at ``socket_path`` runs it in the rank's view), or Popen
    arguments that run it in a view made here (an agent that holds the two
    capabilities itself). Reads the rank's files: call it off the event loop."""
    if not rootview.needed(pid):
        return {}
    if socket_path and os.path.exists(socket_path):
        return HELPER
    return view_args(binary, pid, checked=True)


def view_args(binary: str, pid: int, checked: bool = False) -> dict:
    """Popen arguments that run ``binary`` (py-spy) on ``pid`` in its view, or {}
    when py-spy finds the rank's binaries unaided (rootview.needed; ``checked``:
    the caller knows a view is needed)."""
    global _view_lacks, _view_warned
    if not checked and not rootview.needed(pid):
        return {}
    if _view_lacks is None:
        _view_lacks = rootview.missing_capabilities()
    if _view_lacks:
        why = (f"pid {pid}: its root was changed with chroot, and py-spy finds its "
               f"libpython only in a view that needs {' and '.join(_view_lacks)}: run the "
               f"view helper (ncclwatch view-helper, systemd/ncclwatch-view.service) "
               f"(docs/launchers.md, Ranks in containers)")
        if not _view_warned:
            _view_warned = True
            log.warning("no stacks of %s", why)
        raise PySpyError(why)
    try:
        view = rootview.read_view(pid)
        if binary not in _view_fds:
            fd = os.open(binary, os.O_RDONLY | os.O_CLOEXEC)
            problem = rootview.not_static(fd)
            if problem:
                os.close(fd)
                raise PySpyError(f"pid {pid}: py-spy at {binary} is {problem}; a view runs "
                                 f"only a static py-spy (PyPI's py-spy wheels are static)")
            _view_fds[binary] = fd
    except OSError as e:
        raise PySpyError(f"pid {pid}: no view of its root: {e}") from None
    fd = _view_fds[binary]
    # Executed through the fd opened here, in the agent's root, and static:
    # nothing in the view (nothing of the rank's) is ever run.
    return {"executable": f"/proc/self/fd/{fd}", "pass_fds": (fd,),
            "preexec_fn": lambda: rootview.enter(view)}


def locals_sync(binary: str, pid: int, timeout: float,
                socket_path: str | None = DEFAULT_VIEW_SOCKET) -> str:
    """``locals_argv``'s output, for code off the event loop (PySpyError)."""
    route = view_route(binary, pid, socket_path)
    if route == HELPER:
        from ncclwatch.agent import viewhelper
        return viewhelper.ask_sync(socket_path, pid, "locals", timeout + 1.0).decode()
    try:
        out = subprocess.run(locals_argv(binary, pid), capture_output=True, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL,
                             start_new_session=True, **route)
    except (subprocess.TimeoutExpired, OSError, subprocess.SubprocessError) as e:
        raise PySpyError(f"py-spy --locals on pid {pid}: {e}") from None
    if out.returncode != 0:
        raise PySpyError(f"py-spy --locals exit {out.returncode} on pid {pid}")
    return out.stdout


class PySpy:
    """Async py-spy runner with a timeout, a per-pid lock and counters."""

    def __init__(self, binary: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT_SECONDS,
                 native_timeout: float = NATIVE_TIMEOUT_SECONDS,
                 view_socket: str | None = DEFAULT_VIEW_SOCKET) -> None:
        self.binary = binary or find_pyspy()
        self.view_socket = view_socket
        #: pid -> the thread still telling its route (view_route): one at a time.
        self._routing: dict[int, asyncio.Future] = {}
        self.timeout = timeout
        self.native_timeout = native_timeout
        self.runs_total = 0
        self.failures_total = 0
        self.seconds_total = 0.0
        self.native_total = 0
        self.native_failures_total = 0
        self.native_seconds_total = 0.0
        #: Cumulative counts per NATIVE_BUCKETS bound, then +Inf.
        self.native_buckets = [0] * (len(NATIVE_BUCKETS) + 1)
        self._busy: set[int] = set()
        if self.binary is None:
            log.warning("py-spy not found: no stacks, ranks stay 'unknown'")

    @property
    def available(self) -> bool:
        return self.binary is not None

    def busy(self, pid: int) -> bool:
        return pid in self._busy

    @contextlib.contextmanager
    def _one_at_a_time(self, pid: int) -> Iterator[None]:
        """A dump of ``pid`` while no other runs (two tracers of one rank race)."""
        if self.binary is None:
            raise PySpyError("py-spy not installed")
        if pid in self._busy:
            raise PySpyError(f"a dump of pid {pid} is already running")
        self._busy.add(pid)
        try:
            yield
        finally:
            self._busy.discard(pid)

    async def dump(self, pid: int, raw: list | None = None) -> list[ThreadDump]:
        """A nonblocking dump; ``raw``: a list the dump's JSON, locals
        included, is appended to (py-spy is then asked for locals)."""
        with self._one_at_a_time(pid):
            start = time.monotonic()
            self.runs_total += 1
            try:
                return await self._run(pid, "dump", self.timeout, raw=raw)
            except PySpyError:
                self.failures_total += 1
                raise
            finally:
                self.seconds_total += time.monotonic() - start

    async def dump_native(self, pid: int) -> list[ThreadDump]:
        """One native dump (pauses the rank); its duration goes to the histogram."""
        with self._one_at_a_time(pid):
            start = time.monotonic()
            self.native_total += 1
            try:
                return await self._run(pid, "native", self.native_timeout, paused=True)
            except PySpyError:
                self.native_failures_total += 1
                raise
            finally:
                took = time.monotonic() - start
                self.native_seconds_total += took
                for i, bound in enumerate((*NATIVE_BUCKETS, float("inf"))):
                    if took <= bound:
                        self.native_buckets[i] += 1

    async def _route(self, pid: int) -> dict | str:
        """view_route off the event loop, bounded: a rank's files on a hung
        mount cost one thread, never the round (and no second one)."""
        if not rootview.chrooted(pid):
            return {}  # the common rank: one procfs readlink
        if pid in self._routing:
            raise PySpyError(f"pid {pid}: its files did not answer yet (view check)")
        fut = asyncio.ensure_future(asyncio.to_thread(view_route, self.binary, pid,
                                                      self.view_socket))
        self._routing[pid] = fut
        fut.add_done_callback(lambda _f: self._routing.pop(pid, None))
        try:
            return await asyncio.wait_for(asyncio.shield(fut), VIEW_ROUTE_TIMEOUT)
        except asyncio.TimeoutError:
            raise PySpyError(f"pid {pid}: its files did not answer within "
                             f"{VIEW_ROUTE_TIMEOUT:.0f}s (view check)") from None

    async def _run(self, pid: int, mode: str, timeout: float, paused: bool = False,
                   raw: list | None = None) -> list[ThreadDump]:
        """``raw``: a list the dump's JSON (with frames' locals) is put in too."""
        route = await self._route(pid)
        if route == HELPER:
            from ncclwatch.agent import viewhelper
            asked = "locals" if raw is not None and mode == "dump" else mode
            out = await viewhelper.ask(self.view_socket, pid, asked, timeout + 2.0)
        else:
            argv = (native_argv(self.binary, pid) if mode == "native"
                    else dump_argv(self.binary, pid, raw is not None))
            out = await run_pyspy(argv, pid, timeout, paused, route)
        text = out.decode(errors="replace")
        if raw is not None:
            try:
                raw.extend(json.loads(text))
            except (ValueError, TypeError):
                pass
        try:
            return parse_pyspy_json(text)
        except DumpFormatError as e:
            raise PySpyError(str(e)) from None


async def run_pyspy(argv: list[str], pid: int, timeout: float, paused: bool,
                    view: dict) -> bytes:
    """One py-spy run under ``timeout``, its output bounded; the child is
    killed (never the rank) past either, and a paused rank continued."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            # Never let py-spy inherit a terminal's signals (Ctrl-C to the agent).
            start_new_session=True,
            **view,
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise PySpyError(f"py-spy did not start for pid {pid}: {e}") from None
    try:
        out, err = await asyncio.wait_for(_communicate(proc), timeout)
    except _TooMuch:
        _kill(proc)
        await proc.wait()
        if paused:
            _resume(pid)
        caps.COUNTS.hit("pyspy_output")
        raise PySpyError(f"py-spy's dump of pid {pid} is over "
                         f"{caps.PYSPY_OUTPUT_BYTES} bytes: left out this round") from None
    except asyncio.TimeoutError:
        _kill(proc)
        await proc.wait()
        if paused:
            _resume(pid)
        raise PySpyError(f"py-spy timed out after {timeout:.1f}s on pid {pid}") from None
    except asyncio.CancelledError:
        _kill(proc)
        if paused:
            _resume(pid)
        raise
    if proc.returncode != 0:
        msg = err.decode(errors="replace").strip().splitlines()
        raise PySpyError(f"py-spy exit {proc.returncode} on pid {pid}: "
                         f"{msg[-1] if msg else 'no message'}")
    return out


class _TooMuch(Exception):
    pass


async def _read_capped(stream: asyncio.StreamReader, limit: int) -> bytes:
    chunks, n = [], 0
    while True:
        b = await stream.read(1 << 16)
        if not b:
            return b"".join(chunks)
        n += len(b)
        if n > limit:
            raise _TooMuch
        chunks.append(b)


async def _communicate(proc: asyncio.subprocess.Process) -> tuple[bytes, bytes]:
    """py-spy's output and error, at most caps.PYSPY_OUTPUT_BYTES of output (a
    rank's thousands of threads, each 4,096 frames deep, made hundreds of MB
    of JSON): _TooMuch past it."""
    out, err = await asyncio.gather(_read_capped(proc.stdout, caps.PYSPY_OUTPUT_BYTES),
                                    _read_capped(proc.stderr, 1 << 20))
    await proc.wait()
    return out, err


def _kill(proc: asyncio.subprocess.Process) -> None:
    try:
        proc.kill()  # the py-spy child, never the rank
    except ProcessLookupError:
        pass


def _resume(pid: int) -> None:
    """A tracer killed mid-unwind can leave the rank in a group stop: continue it."""
    try:
        os.kill(pid, signal.SIGCONT)
    except (ProcessLookupError, PermissionError):
        pass


def can_trace() -> str | None:
    """Why py-spy will fail here, or None: ptrace needs root or CAP_SYS_PTRACE."""
    try:
        scope = int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except (OSError, ValueError):
        scope = 0
    if scope >= 3:
        return "kernel.yama.ptrace_scope=3 forbids ptrace"
    if os.geteuid() != 0 and scope >= 1:
        return "not root and kernel.yama.ptrace_scope>=1: grant CAP_SYS_PTRACE"
    return None
