"""Start a job's ranks directly, the way ranks on separate nodes live.

torchrun tears every local rank down when one dies; across nodes, the ranks
on the other nodes keep waiting in their collective until the watchdog
fires, and that is the case ``rank_lost`` is about. This launcher starts N
rank processes of ``ncclwatch.demo.job`` with the usual environment (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), relays their output, and
leaves the others running when one exits:

    python -m ncclwatch.demo.launch --nproc 3 [--ranks 1-2] [--master-port P] -- \\
        --scenario park --op barrier --save-seconds 60

SIGTERM/SIGINT stop every rank. Exit status: the first non-zero rank status.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(text: str | None, n: int) -> list[int]:
    if not text:
        return list(range(n))
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def _relay(proc: subprocess.Popen, lock: threading.Lock) -> None:
    for line in proc.stdout:
        with lock:  # whole lines only: ranks share this stdout
            sys.stdout.write(line)
            sys.stdout.flush()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, required=True, help="world size")
    p.add_argument("--ranks", help="start only these global ranks, e.g. 2-3 (another 'node')")
    p.add_argument("--master-port", type=int, default=None)
    p.add_argument("job", nargs=argparse.REMAINDER, help="-- then ncclwatch.demo.job arguments")
    args = p.parse_args(argv)
    job_args = args.job[1:] if args.job[:1] == ["--"] else args.job
    port = args.master_port or _free_port()
    ranks = _ranks(args.ranks, args.nproc)
    procs: list[subprocess.Popen] = []
    lock = threading.Lock()
    for local, rank in enumerate(ranks):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(local),
               "WORLD_SIZE": str(args.nproc), "LOCAL_WORLD_SIZE": str(len(ranks)),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "ncclwatch.demo.job", *job_args], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1))
    relays = [threading.Thread(target=_relay, args=(pr, lock), daemon=True) for pr in procs]
    for t in relays:
        t.start()

    def stop(signum, _frame) -> None:
        for pr in procs:
            if pr.poll() is None:
                pr.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    codes = [pr.wait() for pr in procs]
    for t in relays:
        t.join(5)
    return next((c for c in codes if c != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
