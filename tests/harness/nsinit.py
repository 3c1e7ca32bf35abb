"""Pid 1 of a test worker's own pid namespace: a worker's monitors see its jobs only.

Each ncclwatch a test starts finds the torch processes of the node it runs on,
as the product does: two tests running at once would each see the other's jobs
(a stall in one is a second job in the other's view, a healthy job's "no stall"
is no longer its own). ``make test`` starts each pytest-xdist worker as

    unshare --pid --fork --mount-proc PYTHON tests/harness/nsinit.py PYTHON -u -c ...

(``--ns-workers``, this module as a pytest plugin, rewrites xdist's ``popen``
specs so): the worker, its jobs and its monitors live
in a pid namespace with its own /proc, as a container's do, and the namespace
dies with the worker (the kernel kills what is left when its pid 1 exits).

Pid 1 of a namespace adopts every orphan there (a daemonised child, a rank
whose launcher died) and must reap it, or it stays a zombie; and it gets no
default action for signals, so it passes the usual ones on to the worker.
This module forks the worker, forwards signals, reaps every child and exits
with the worker's status.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from pathlib import Path

#: Passed on to the worker (a terminal's ^C, xdist's or CI's termination).
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def pytest_addoption(parser) -> None:
    parser.addoption("--ns-workers", action="store_true", default=False,
                     help="start each xdist worker in its own pid namespace (root; "
                     "tests/harness/nsinit.py)")


def pytest_configure(config) -> None:
    """Each local xdist worker (``-n N``: N ``popen`` specs) started through
    unshare and this init. Read by xdist when the session starts, after this."""
    if not config.getoption("ns_workers") or hasattr(config, "workerinput"):
        return
    python = shlex.quote(sys.executable)
    wrapper = (f"unshare --pid --fork --mount-proc {python} "
               f"{shlex.quote(str(Path(__file__).resolve()))} {python}")
    config.option.tx = [f"popen//python={wrapper}" if spec == "popen" else spec
                        for spec in config.getoption("tx") or ()]


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: nsinit.py COMMAND [ARG...]", file=sys.stderr)
        return 2
    worker = os.fork()
    if worker == 0:
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execvp(argv[0], argv)
        except OSError as e:
            print(f"nsinit: cannot run {argv[0]}: {e}", file=sys.stderr)
            os._exit(127)
    for sig in FORWARDED:
        signal.signal(sig, lambda s, _f: os.kill(worker, s))
    # Nothing here reads the worker's pipes: close our copies of them, so that
    # the worker's end of a pipe is the only one.
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        if pid == worker:
            return os.waitstatus_to_exitcode(status) if status else 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.exit(code if code >= 0 else 128 - code)
