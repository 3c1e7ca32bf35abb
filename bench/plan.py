"""How big a collector a site needs: cores and memory for a job or a fleet.

    python -m bench.daemon_ingest --plan 100000               # one job of 100k ranks
    python -m bench.daemon_ingest --plan 200000 --jobs 400    # 400 jobs, 200k ranks in all

Measured on this machine first (about a minute), then scaled:

- the core's CPU per rank-sample (decode and ``Daemon.ingest``, protocol 2 as
  agents send it, in process) and per rank per tick during a stall (a tick
  walks a stalled job's waiting ranks; two ticks a second);
- the transport's CPU per rank-sample: a grpc.aio server that only parses
  and acks, saturated by simulated agents (one stream of 8 ranks each); it
  runs in the daemon, or in ingest workers (``--ingest-workers``);
- memory per rank: a real daemon's RSS with a job's agents reporting, gRPC
  streams included, over its ranks.

A daemon's core (one process, single-threaded) is planned at up to
``CORE_BUDGET`` of a core, the rest kept for bursts (a stall's start
changes every rank at once, a restart sends every rank in full) so that a
decision is not queued behind reports. Past it, gRPC moves to ingest
workers; past that, the fleet is sharded by job (``--collector
'a0,b0;a1,b1'``): a job is never split, so one job past a core's budget is
said to be beyond one daemon.
"""

from __future__ import annotations

import gc
import math
import random
import time
from dataclasses import asdict, dataclass

#: The share of one core a daemon's core process is planned at.
CORE_BUDGET = 0.6
#: Ranks per agent stream (one node of 8 GPUs).
RANKS_PER_NODE = 8
#: Detection ticks a second (settings: tick = 0.5 s).
TICKS_PER_SECOND = 2.0


@dataclass(frozen=True)
class Costs:
    """What this machine measured, per rank-sample, per rank and per stream."""

    ingest_us_per_sample: float       # decode + Daemon.ingest, the core's
    transport_us_per_sample: float    # gRPC parse and ack, the daemon's or its workers'
    tick_us_per_rank: float           # a tick of a stalled job, per rank of it
    bytes_per_rank: float             # daemon RSS per rank, gRPC streams included
    base_bytes: int                   # a daemon's RSS with nothing connected
    measured_ranks: int               # of the job the memory was read at


def measure(world: int = 2048) -> Costs:
    """This machine's costs (about a minute: in process, then two real daemons)."""
    from bench import daemon_ingest as di
    from ncclwatch.agent.delta import SNAPSHOT_EVERY

    inp = di.in_process(world, SNAPSHOT_EVERY)
    p = di.QUICK
    floor = di.saturated_rate(p, null=True)
    mem = _memory(world)
    return Costs(ingest_us_per_sample=1e6 / inp["decode_ingest_samples_per_cpu_s"],
                 transport_us_per_sample=1e6 / floor["samples_per_daemon_cpu_s"],
                 tick_us_per_rank=_tick_cost(8192), bytes_per_rank=mem["bytes_per_rank"],
                 base_bytes=mem["base_bytes"], measured_ranks=world)


def _memory(world: int) -> dict:
    from bench import daemon_ingest as di
    from bench.loadgen import Clients, DaemonProc, fleet

    jobs = fleet(1, world)
    d = DaemonProc(cpu=di.DAEMON_CPUS[0], stall_threshold=di.STALL_THRESHOLD)
    try:
        rss0 = di.settled_rss(d)
        cl = Clients(jobs, [d.grpc], processes=di.CLIENT_PROCESSES, interval=di.INTERVAL,
                     stack_change=di.STACK_CHANGE, cpus=di.CLIENT_CPUS)
        try:
            cl.wait_ready(300)
            time.sleep(6.0)   # a few ticks: the heap frozen and trimmed once
            rss1 = d.rss()
        finally:
            cl.stop()
    finally:
        d.stop()
    return {"bytes_per_rank": (rss1 - rss0) / world, "base_bytes": rss0}


def _tick_cost(world: int) -> float:
    """CPU microseconds per rank of a tick of one job in a checkpoint stall."""
    import logging

    from bench.daemon_ingest import STACK_CHANGE, STALL_THRESHOLD
    from bench.loadgen import Pool, SimAgent, Stall, fleet
    from ncclwatch.daemon.core import Daemon, DaemonConfig
    from ncclwatch.v1 import collector_pb2 as pb

    logging.getLogger("ncclwatch").setLevel(logging.ERROR)
    job = fleet(1, world)[0]
    pool = Pool.build()
    agents = [SimAgent(job, n, pool, random.Random(n), STACK_CHANGE, 0.0)
              for n in range(job.nodes)]
    for a in agents:
        a.stalls = [Stall(3.0, 60.0)]
    d = Daemon(DaemonConfig(stall_threshold=STALL_THRESHOLD))
    base = 1000.0
    for k in range(7):
        for a in agents:
            d.ingest(pb.ReportRequest.FromString(a.report(float(k))), now=base + k)
        d.tick(now=base + k + 0.5)
    gc.collect()
    ticks = []
    for j in range(5):
        d.table._fresh_agents = None   # as after reports: the tick's sets are made again
        c0 = time.process_time()
        d.tick(now=base + 6.6 + 0.05 * j)
        ticks.append(time.process_time() - c0)
    return 1e6 * sorted(ticks)[len(ticks) // 2] / world


@dataclass(frozen=True)
class Layout:
    ranks: int
    jobs: int
    interval: float
    samples_per_s: float
    core: float                 # cores of one daemon's core process, all of it on one
    transport: float            # cores of gRPC (in the daemon, or its workers)
    daemons: int                # shards
    ingest_workers: int         # per daemon (0: gRPC in the daemon process)
    cores_per_daemon: float     # core + workers, planned
    memory_per_daemon: int      # bytes
    fits: bool                  # False: one job is past a daemon core's budget
    note: str


def plan(ranks: int, jobs: int, interval: float, c: Costs) -> Layout:
    """The layout for ``jobs`` jobs of ``ranks`` ranks in all, each agent (8
    ranks) reporting every ``interval`` seconds. A daemon plans for one of its
    jobs (the largest) in a stall at a time: its ticks walk that job."""
    jobs = max(1, min(jobs, ranks))
    job_ranks = math.ceil(ranks / jobs)
    rate = ranks / interval
    ingest = rate * c.ingest_us_per_sample / 1e6
    tick = TICKS_PER_SECOND * c.tick_us_per_rank * job_ranks / 1e6
    transport = rate * c.transport_us_per_sample / 1e6
    one_job = ingest / jobs + tick
    fits = one_job <= CORE_BUDGET
    room = CORE_BUDGET - tick
    daemons = 1 if ingest + tick <= CORE_BUDGET or room <= 0 else \
        min(jobs, math.ceil(ingest / room))
    core = ingest / daemons + tick
    wire = transport / daemons
    workers = 0 if core + wire <= CORE_BUDGET else math.ceil(wire / CORE_BUDGET)
    memory = int(c.base_bytes + c.bytes_per_rank * ranks / daemons)
    if not fits:
        note = (f"one job of {job_ranks} ranks needs {one_job:.2f} of a core on its "
                f"daemon's core (planned at {CORE_BUDGET}): past what one daemon decides "
                "within its budget, and a job is never split across shards")
    elif daemons > 1:
        note = (f"{daemons} daemons, jobs sharded by job id (agents: --collector "
                f"'a0;a1;...'), about {jobs / daemons:.0f} jobs and "
                f"{ranks / daemons:.0f} ranks each"
                + (f", each with --ingest-workers {workers}" if workers else ""))
    elif workers:
        note = f"one daemon with --ingest-workers {workers}: gRPC off its core"
    else:
        note = "one daemon, gRPC in its own process"
    return Layout(ranks, jobs, interval, rate, round(core, 3), round(wire, 3), daemons,
                  workers, round(core + wire, 2), memory, fits, note)


def render(lay: Layout, c: Costs) -> str:
    what = (f"one job of {lay.ranks} ranks" if lay.jobs == 1
            else f"{lay.jobs} jobs, {lay.ranks} ranks in all")
    return "\n".join([
        f"{what}, agents of {RANKS_PER_NODE} ranks reporting every {lay.interval:g} s "
        f"({lay.samples_per_s / 1000:.1f}k rank-samples/s):",
        f"  daemons: {lay.daemons}; per daemon: {lay.cores_per_daemon:.2f} cores "
        f"({lay.core:.2f} on its core process, {lay.transport:.2f} for gRPC"
        + (f" in {lay.ingest_workers} ingest workers" if lay.ingest_workers else "")
        + f"), {lay.memory_per_daemon / 2**20:.0f} MiB",
        f"  {lay.note}" + ("" if lay.fits else "  [DOES NOT FIT]"),
        f"  measured here: ingest {c.ingest_us_per_sample:.1f} us and gRPC "
        f"{c.transport_us_per_sample:.1f} us per rank-sample, a stalled job's tick "
        f"{c.tick_us_per_rank:.2f} us per rank, {c.bytes_per_rank / 1024:.1f} KiB per rank "
        f"(at {c.measured_ranks} ranks, gRPC included); a core planned at "
        f"{CORE_BUDGET:.0%}.",
    ])


def to_json(lay: Layout, c: Costs) -> dict:
    return {"layout": asdict(lay), "costs": asdict(c), "core_budget": CORE_BUDGET}
