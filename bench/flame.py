"""Flame graphs of the daemon's ingest, with py-spy, for before/after comparisons.

    python -m bench.flame grpc OUT.svg      # the daemon process under saturating agents
    python -m bench.flame ingest OUT.svg    # decode + Daemon.ingest in process, no gRPC
    python -m bench.flame replay OUT.svg    # bench.core_replay's core (ingest + ticks)

``grpc``: a real ``DaemonServer`` (``bench.loadgen serve``) pinned to one CPU,
its 2,048-rank job's agents sending as fast as they are acknowledged; py-spy
samples the daemon process alone, so the graph is where one daemon core goes
(gRPC, parse, ingest, ticks). ``ingest`` and ``replay`` run in a child
process that builds its reports first and says when it is ready; py-spy is
attached only then, so the load generator is not in the graph.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
READY = "flame: ready"


def pyspy() -> str:
    exe = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    if exe is None:
        raise SystemExit("py-spy not found (it is in the test extras)")
    return exe


def record(pid: int, out: str, seconds: float, rate: int) -> None:
    subprocess.run([pyspy(), "record", "--pid", str(pid), "--duration", str(int(seconds)),
                    "--rate", str(rate), "--nonblocking", "--function", "--output", out, "--format",
                    "flamegraph"], check=True)


def grpc_flame(out: str, seconds: float, rate: int, world: int) -> None:
    from bench.daemon_ingest import CLIENT_CPUS, CLIENT_PROCESSES, DAEMON_CPUS, STACK_CHANGE
    from bench.loadgen import Clients, DaemonProc, fleet

    jobs = fleet(1, world)
    d = DaemonProc(cpu=DAEMON_CPUS[0], stall_threshold=1.0)
    try:
        cl = Clients(jobs, [d.grpc], processes=CLIENT_PROCESSES, stack_change=STACK_CHANGE,
                     cpus=CLIENT_CPUS)
        try:
            cl.wait_ready(300)
            cl.ask(cmd="mode", mode="saturate")
            time.sleep(3.0)
            record(d.p.pid, out, seconds, rate)
        finally:
            cl.stop()
    finally:
        d.stop()


def child(what: str, world: int, seconds: float) -> None:
    """The workload: build, say READY, then run for ``seconds``."""
    from bench.daemon_ingest import INTERVAL, STACK_CHANGE
    from bench.loadgen import Pool, SimAgent, fleet
    from ncclwatch.v1 import collector_pb2 as pb

    if what == "replay":
        from bench import core_replay
        print(READY, file=sys.stderr, flush=True)   # its generation is in the graph too
        core_replay.run(world, 2)
        return
    from ncclwatch.daemon.core import Daemon

    job = fleet(1, world)[0]
    pool = Pool.build()
    agents = [SimAgent(job, n, pool, random.Random(n), STACK_CHANGE, 0.0)
              for n in range(job.nodes)]
    rounds = max(2, int(seconds * 150_000 / world))  # more than it can apply in ``seconds``
    msgs = [a.report(1000.0 + k * INTERVAL) for k in range(rounds) for a in agents]
    d = Daemon()
    now = time.monotonic()
    parse = pb.ReportRequest.FromString
    print(READY, file=sys.stderr, flush=True)
    n = len(agents)
    for i, m in enumerate(msgs):
        d.ingest(parse(m), now=now + i // n)
        if i % n == n - 1:
            d.tick(now=now + i // n)


def local_flame(what: str, out: str, seconds: float, rate: int, world: int) -> None:
    p = subprocess.Popen([sys.executable, "-m", "bench.flame", "--child", what,
                          "--world", str(world), "--seconds", str(seconds)],
                         cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        for line in p.stderr:
            if line.strip() == READY:
                break
        record(p.pid, out, seconds, rate)
    finally:
        p.kill()
        p.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.flame", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("grpc", "ingest", "replay"))
    ap.add_argument("out", nargs="?", default=None, help="the SVG to write")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--world", type=int, default=None,
                    help="ranks of the job (default: 2048; replay: 100000)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    world = a.world or (100_000 if a.what == "replay" else 2048)
    if a.child:
        child(a.what, world, a.seconds)
        return 0
    if a.out is None:
        ap.error("the SVG to write is required")
    if a.what == "grpc":
        grpc_flame(a.out, a.seconds, a.rate, world)
    else:
        local_flame(a.what, a.out, a.seconds, a.rate, world)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
