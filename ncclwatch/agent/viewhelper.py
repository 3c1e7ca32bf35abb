"""The one privileged part of reading a chroot'd rank: py-spy in its view.

A rank whose root was changed with ``chroot`` is read in a view
(rootview.py) that takes a mount namespace (CAP_SYS_ADMIN) and a chroot
(CAP_SYS_CHROOT). Those two go to this helper, a unit of its own
(``ncclwatch view-helper``, systemd/ncclwatch-view.service), not to the
agent: the agent asks it over a unix socket that only root reaches, naming a
pid and a mode, and reads back py-spy's output.

What a request can make the helper do is small on purpose: the mode picks
one of the argv builders of pyspy.py (no path, flag or text of the request
is ever used), the pid must be a process whose root needs a view, the py-spy
run is the helper's own and a static ELF (rootview.not_static), under the
mode's timeout, its output bounded (caps.PYSPY_OUTPUT_BYTES), one run per
pid and ``MAX_RUNNING`` in all. Whether a native dump is due (it pauses the
rank) stays the agent's decision (policy.py); the helper adds no dump of its
own.

Who reaches it is checked, not assumed: the socket's folder must be a real
folder (no symlink) owned by root or the agent's uid with no group or other
access, and each connection's peer (SO_PEERCRED) must be the agent's uid.
The pid is pinned when asked (a pidfd and the process's start time) and
checked again before py-spy runs and after, so a pid that exited and was
reused in between is refused, not read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import select
import socket
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass

from ncclwatch.agent import caps, procstat, pyspy, rootview

log = logging.getLogger(__name__)

#: Where the helper listens (its unit's RuntimeDirectory, mode 0700, root's).
DEFAULT_SOCKET = pyspy.DEFAULT_VIEW_SOCKET
#: mode -> (argv of py-spy for a pid, its timeout, whether it pauses the rank).
MODES: dict[str, tuple[Callable[[str, int], list[str]], float, bool]] = {
    "dump": (pyspy.dump_argv, pyspy.DEFAULT_TIMEOUT_SECONDS, False),
    "native": (pyspy.native_argv, pyspy.NATIVE_TIMEOUT_SECONDS, True),
    "locals": (pyspy.locals_argv, pyspy.DEFAULT_TIMEOUT_SECONDS, False),
}
#: A request is one JSON line: {"pid": N, "mode": "dump"}; longer is refused.
MAX_REQUEST_BYTES = 256
#: py-spy runs at once, over all pids.
MAX_RUNNING = 4
#: Seconds to tell whether a pid needs a view (its files may hang).
NEEDED_TIMEOUT = 2.0


class ViewHelperError(RuntimeError):
    pass


def check_folder(d: str, agent_uid: int) -> None:
    """The socket's folder is the helper's to trust: a folder, not a symlink,
    owned by root or the agent's uid, open to no group or other."""
    st = os.lstat(d)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ViewHelperError(f"{d} is not a folder (a symlink?): the socket's folder must be one")
    if st.st_uid not in (0, agent_uid):
        raise ViewHelperError(f"{d} is owned by uid {st.st_uid}: the socket's folder must be "
                              f"root's or the agent's (uid {agent_uid})")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ViewHelperError(f"{d} is open to others: the socket's directory must be 0700")


_PEERCRED = struct.Struct("3i")   # struct ucred: pid, uid, gid


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a unix socket (SO_PEERCRED)."""
    _pid, uid, _gid = _PEERCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return uid


def start_time(pid: int) -> int:
    """The process's start (clock ticks after boot, /proc/<pid>/stat field 22)."""
    try:
        return procstat.start_ticks(pid)
    except (OSError, ValueError, IndexError):
        raise ViewHelperError(f"pid {pid}: no such process") from None


@dataclass(frozen=True)
class Pinned:
    """The process a pid named when the helper was asked."""

    pid: int
    fd: int         # a pidfd: readable once that process has exited
    start: int


def _exited(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def pin(pid: int) -> Pinned:
    """The process ``pid`` names now (close its ``fd``). Its start is read
    while the pidfd shows it alive, so it is that process's."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        raise ViewHelperError(f"pid {pid}: no such process") from None
    try:
        p = Pinned(pid, fd, start_time(pid))
        same(p)
    except BaseException:
        os.close(fd)
        raise
    return p


def same(p: Pinned) -> None:
    """ViewHelperError unless ``p.pid`` still names the pinned process."""
    if _exited(p.fd):
        raise ViewHelperError(f"pid {p.pid} exited")
    if start_time(p.pid) != p.start:
        raise ViewHelperError(f"pid {p.pid} names another process now (it was replaced)")


def parse_request(line: bytes) -> tuple[int, str]:
    """(pid, mode) of one request line; ViewHelperError says what is wrong."""
    if len(line) > MAX_REQUEST_BYTES:
        raise ViewHelperError(f"request over {MAX_REQUEST_BYTES} bytes")
    try:
        req = json.loads(line)
    except ValueError:
        raise ViewHelperError("request is not JSON") from None
    if not isinstance(req, dict) or set(req) != {"pid", "mode"}:
        raise ViewHelperError('request must be {"pid": N, "mode": M}')
    pid, mode = req["pid"], req["mode"]
    if type(pid) is not int or not 0 < pid < 1 << 22:
        raise ViewHelperError("pid must be a positive process id")
    if mode not in MODES:
        raise ViewHelperError(f"mode must be one of {', '.join(MODES)}")
    return pid, mode


class Helper:
    """Runs py-spy in views for the agent; one per node."""

    def __init__(self, binary: str | None = None, agent_uid: int = 0) -> None:
        self.binary = binary or pyspy.find_pyspy()
        self.agent_uid = agent_uid
        self._running: set[int] = set()
        self._slots = asyncio.Semaphore(MAX_RUNNING)
        self.runs_total = 0
        self.refused_total = 0

    async def run(self, pid: int, mode: str) -> bytes:
        """py-spy's output for ``pid`` in its view (ViewHelperError: refused)."""
        if self.binary is None:
            raise ViewHelperError("py-spy not installed beside the helper")
        if pid in self._running:
            raise ViewHelperError(f"a dump of pid {pid} is already running")
        self._running.add(pid)
        pinned = None
        try:
            pinned = pin(pid)
            try:
                need = await asyncio.wait_for(asyncio.to_thread(rootview.needed, pid),
                                              NEEDED_TIMEOUT)
            except asyncio.TimeoutError:
                raise ViewHelperError(f"pid {pid}: its files did not answer within "
                                      f"{NEEDED_TIMEOUT:.0f}s") from None
            if not need:
                raise ViewHelperError(f"pid {pid} needs no view (the agent reads it itself)")
            argv_of, timeout, paused = MODES[mode]
            async with self._slots:
                self.runs_total += 1
                try:
                    same(pinned)
                    view = pyspy.view_args(self.binary, pid, checked=True)
                    out = await pyspy.run_pyspy(argv_of(self.binary, pid), pid, timeout,
                                                paused, view)
                except pyspy.PySpyError as e:
                    raise ViewHelperError(str(e)) from None
                same(pinned)     # what py-spy read was the process asked for
                return out
        finally:
            self._running.discard(pid)
            if pinned is not None:
                os.close(pinned.fd)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            uid = peer_uid(writer.get_extra_info("socket"))
            if uid != self.agent_uid:
                raise ViewHelperError(f"uid {uid} is not the agent's (uid {self.agent_uid})")
            line = await asyncio.wait_for(reader.readline(), 5.0)
            pid, mode = parse_request(line.strip())
            out = await self.run(pid, mode)
            answer = {"ok": True, "stdout": out.decode(errors="replace")}
        except ViewHelperError as e:
            self.refused_total += 1
            answer = {"ok": False, "error": str(e)[:500]}
        except (asyncio.TimeoutError, asyncio.LimitOverrunError, ValueError):
            self.refused_total += 1
            answer = {"ok": False, "error": "no request line"}
        try:
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()


async def serve(path: str, helper: Helper | None = None) -> None:
    """Listen on ``path`` (made 0600 in a 0700 directory) until cancelled."""
    helper = helper or Helper()
    d = os.path.dirname(path) or "."
    os.makedirs(d, mode=0o700, exist_ok=True)
    check_folder(d, helper.agent_uid)
    if os.path.exists(path):
        os.unlink(path)
    old = os.umask(0o177)
    try:
        server = await asyncio.start_unix_server(helper.handle, path,
                                                 limit=MAX_REQUEST_BYTES + 2)
    finally:
        os.umask(old)
    log.info("view helper listening on %s (py-spy %s)", path, helper.binary)
    async with server:
        await server.serve_forever()


# -- the agent's side ---------------------------------------------------------

def _answer(raw: bytes, pid: int) -> bytes:
    try:
        answer = json.loads(raw)
    except ValueError:
        raise pyspy.PySpyError(f"pid {pid}: the view helper's answer is not JSON") from None
    if not isinstance(answer, dict) or not answer.get("ok"):
        why = answer.get("error") if isinstance(answer, dict) else None
        raise pyspy.PySpyError(f"pid {pid}: the view helper refused: {why or 'no reason'}")
    return str(answer.get("stdout", "")).encode()


#: An answer is py-spy's output, JSON-escaped: room for twice the bound.
_MAX_ANSWER = 2 * caps.PYSPY_OUTPUT_BYTES + 4096


async def ask(path: str, pid: int, mode: str, timeout: float) -> bytes:
    """py-spy's output for ``pid`` from the helper at ``path`` (PySpyError)."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_unix_connection(path, limit=_MAX_ANSWER), timeout)
    except (OSError, asyncio.TimeoutError) as e:
        raise pyspy.PySpyError(f"pid {pid}: no view helper at {path}: {e}") from None
    try:
        writer.write(json.dumps({"pid": pid, "mode": mode}).encode() + b"\n")
        await writer.drain()
        raw = await asyncio.wait_for(reader.readline(), timeout)
    except (OSError, asyncio.TimeoutError, asyncio.LimitOverrunError, ValueError) as e:
        raise pyspy.PySpyError(f"pid {pid}: the view helper did not answer: "
                               f"{e or 'timed out'}") from None
    finally:
        writer.close()
    return _answer(raw, pid)


def ask_sync(path: str, pid: int, mode: str, timeout: float) -> bytes:
    """``ask`` for code off the event loop (launchers.py's --locals read)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(json.dumps({"pid": pid, "mode": mode}).encode() + b"\n")
            chunks, n = [], 0
            while not chunks or not chunks[-1].endswith(b"\n"):
                b = s.recv(1 << 16)
                if not b:
                    break
                n += len(b)
                if n > _MAX_ANSWER:
                    raise pyspy.PySpyError(f"pid {pid}: the view helper's answer is too long")
                chunks.append(b)
    except OSError as e:
        raise pyspy.PySpyError(f"pid {pid}: view helper at {path}: {e}") from None
    return _answer(b"".join(chunks), pid)


#: `ncclwatch view-helper`'s help (cli.py).
HELP = ("run py-spy for the agent on ranks whose root was changed with chroot: the one "
        "part of the agent that needs CAP_SYS_ADMIN and CAP_SYS_CHROOT "
        "(systemd/ncclwatch-view.service)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--socket", default=DEFAULT_SOCKET, metavar="PATH",
                   help=f"unix socket to listen on, in a directory only root reaches "
                        f"(default {DEFAULT_SOCKET}; the agent's --view-helper)")
    p.add_argument("--agent-uid", type=int, default=0, metavar="UID",
                   help="the agent's uid: the only peer served, and with root the only "
                        "owner the socket's folder may have (default 0)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def main(args: argparse.Namespace) -> int:
    """``ncclwatch view-helper``: serve until stopped; 2 when it cannot listen."""
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    lacks = rootview.missing_capabilities()
    if lacks:
        log.warning("the view helper lacks %s: every view will fail", " and ".join(lacks))
    try:
        asyncio.run(serve(args.socket, Helper(agent_uid=args.agent_uid)))
    except (ViewHelperError, OSError) as e:
        log.error("view helper: %s", e)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
