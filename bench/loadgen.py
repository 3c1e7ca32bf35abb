"""Load generator for the daemon: simulated agents over real gRPC on loopback.

Three kinds of process, all started by ``bench.daemon_ingest``:

- ``serve``: a real ``DaemonServer`` (gRPC + HTTP + detection tick) in a
  process of its own, so "one core" is that process (optionally pinned to
  one CPU) and its CPU time and RSS are read from /proc by the caller.
- ``client``: one of a few processes that play many agents each, one
  grpc.aio stream per agent (and by default one channel, so one TCP
  connection, per agent). 2048 real agent processes would not fit on the
  benchmark machine; a stream per agent is what the daemon sees either way.
- the caller (``DaemonProc`` / ``ClientProc`` here): drives the clients
  through line-JSON commands on stdin/stdout.

Reports are what a real agent sends: 8 ranks per node, full rounds, process
stats with two memory limits and one GPU, job info (environment) on the
first round and every ``JOB_INFO_EVERY`` rounds, interned stacks (a stack's
frames cross a stream once, then only its id). Each round every sample
changes to another stack of its job's pool with probability
``stack_change`` (1% by default). A job can be put into checkpoint stalls
(rank 0 saving, the others in barrier) for given time windows. Agents go to
the daemon ``ncclwatch.shard.shard(job_id, n)`` names; a failed stream is
reopened with the real agent's backoff.

Reports are assembled from pre-serialised parts. Concatenating serialised
messages of one type merges them (protobuf encoding spec), so a sample is
``identity + state + timings + stats`` as bytes and a report costs the
generator a few joins instead of building ~100 protobuf objects; without
this the generator, not the daemon, would be the bottleneck on 2 cores.
``check_assembly`` proves the bytes equal the message built the usual way.

Time is CLOCK_MONOTONIC, which all processes of one machine share, so a
send time taken here and a tick time taken in the daemon can be subtracted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import random
import signal
import struct
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from ncclwatch.agent.agent import JOB_INFO_EVERY  # as the real agent
from ncclwatch.agent.delta import SNAPSHOT_EVERY
from ncclwatch.shard import shard
from ncclwatch.stacks import Frame, stack_id
from ncclwatch.v1 import collector_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
RANKS_PER_NODE = 8
METHOD = "/ncclwatch.v1.CollectorService/Report"
SITE = "/opt/venv/lib/python3.11/site-packages"
#: The round trip a report built ahead of a daemon is taken to have been
#: acknowledged after (SimAgent.ack_rtt): a loopback stream's.
ACK_RTT = 0.002
#: A ReportResponse with nothing but ack_seq (tag + up to 10 varint bytes).
ACK_ONLY_MAX = 11
#: Wire protocol the simulated agents speak (2: briefs, as the real agent; 1: full).
PROTOCOL = 2
#: Each channel its own TCP connection, as separate agent processes would have.
CHANNEL_OPTIONS = (("grpc.use_local_subchannel_pool", 1),
                   ("grpc.max_send_message_length", 16 * 1024 * 1024))


# -- wire assembly ------------------------------------------------------------

def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_bytes(number: int, payload: bytes) -> bytes:
    """A length-delimited field (a sub-message or string)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def field_double(number: int, x: float) -> bytes:
    return varint(number << 3 | 1) + struct.pack("<d", x)


def field_varint(number: int, n: int) -> bytes:
    return varint(number << 3) + varint(n)


# -- stacks -----------------------------------------------------------------------

def _frames(*names: tuple[str, str, int]) -> list[Frame]:
    return [Frame(n, f, line) for n, f, line in names]


TRAIN_TAIL = [("train_step", "/job/train.py", 212), ("train", "/job/train.py", 260),
              ("main", "/job/train.py", 301), ("<module>", "/job/train.py", 310)]
C10D = f"{SITE}/torch/distributed/distributed_c10d.py"
SER = f"{SITE}/torch/serialization.py"


def compute_stack(i: int) -> list[Frame]:
    """A forward/backward stack, ~18 frames deep; ``i`` picks layer and line."""
    mod = f"{SITE}/torch/nn/modules/module.py"
    body = [("forward", f"{SITE}/torch/nn/modules/linear.py", 125 + i),
            ("_call_impl", mod, 1762), ("_wrapped_call_impl", mod, 1751),
            ("forward", "/job/model.py", 40 + (i % 7) * 9)]
    for layer in range(4):
        body += [("_call_impl", mod, 1762), ("_wrapped_call_impl", mod, 1751),
                 ("forward", "/job/model.py", 90 + layer * 11 + i % 5)]
    body += [("forward", f"{SITE}/torch/nn/parallel/distributed.py", 1636)]
    return _frames(*body, *TRAIN_TAIL)


def dataloader_stack(i: int) -> list[Frame]:
    dl = f"{SITE}/torch/utils/data/dataloader.py"
    return _frames(("_recv_bytes", "/usr/lib/python3.11/multiprocessing/connection.py", 430),
                   ("get", "/usr/lib/python3.11/queue.py", 180),
                   ("_try_get_data", dl, 1133 + i), ("_next_data", dl, 1295),
                   ("__next__", dl, 631), *TRAIN_TAIL)


SAVE_STACK = _frames(("write", "/job/storage.py", 68), ("_save", SER, 1312), ("save", SER, 1003),
                     ("save_checkpoint", "/job/train.py", 150), *TRAIN_TAIL)
BARRIER_STACK = _frames(("barrier", C10D, 4750), ("wrapper", f"{SITE}/torch/distributed/"
                                                             "c10d_logger.py", 81),
                        ("save_checkpoint", "/job/train.py", 158), *TRAIN_TAIL)


@dataclass(frozen=True)
class StackPart:
    """One stack: its id, its frames on the wire, and a sample's state fields."""

    sid: str
    wire: bytes   # NodeReport.stacks entry (field 7), frames included
    state: bytes  # RankSample fields state, op, stack_id


def stack_part(frames: list[Frame], state: int, op: int = 0) -> StackPart:
    sid = stack_id(frames)
    s = pb.Stack(id=sid, thread_name="MainThread",
                 frames=[pb.Frame(name=f.name, filename=f.filename, line=f.line) for f in frames])
    return StackPart(sid, field_bytes(7, s.SerializeToString()),
                     pb.RankSample(state=state, op=op, stack_id=sid).SerializeToString())


@dataclass(frozen=True)
class Pool:
    """The stacks of one job: what its ranks do in training, and in a checkpoint stall."""

    normal: tuple[StackPart, ...]
    save: StackPart
    barrier: StackPart

    @classmethod
    def build(cls, size: int = 16) -> "Pool":
        normal = [stack_part(compute_stack(i), pb.RANK_STATE_COMPUTE) for i in range(size - 2)]
        normal += [stack_part(dataloader_stack(i), pb.RANK_STATE_DATALOADER) for i in range(2)]
        return cls(tuple(normal), stack_part(SAVE_STACK, pb.RANK_STATE_SAVING),
                   stack_part(BARRIER_STACK, pb.RANK_STATE_COLLECTIVE, pb.COLLECTIVE_OP_BARRIER))


ENV = {"NCCL_DEBUG": "WARN", "NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "eth0",
       "NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
       "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
       "TORCH_NCCL_ENABLE_MONITORING": "1", "TORCH_DISTRIBUTED_DEBUG": "OFF",
       "NCCLWATCH_PG_TIMEOUT_S": "1800", "NCCL_P2P_LEVEL": "NVL", "NCCL_NVLS_ENABLE": "1"}


# -- simulated agents ---------------------------------------------------------------

@dataclass(frozen=True)
class JobSpec:
    job_id: str
    world: int

    @property
    def nodes(self) -> int:
        return math.ceil(self.world / RANKS_PER_NODE)


def fleet(jobs: int, world: int, prefix: str = "torchelastic") -> list[JobSpec]:
    """``jobs`` jobs of ``world`` ranks, ids shaped like torchrun's run ids."""
    return [JobSpec(f"{prefix}:{uuid.UUID(int=random.Random(i).getrandbits(128))}", world)
            for i in range(jobs)]


@dataclass
class Stall:
    """A checkpoint stall in one job: rank 0 saves from ``start``; the rest wait in barrier."""

    start: float
    end: float


class SimAgent:
    """One node's agent: 8 ranks of one job, reports assembled from byte parts."""

    def __init__(self, job: JobSpec, node_index: int, pool: Pool, rng: random.Random,
                 stack_change: float, started: float, protocol: int = PROTOCOL,
                 ack_rtt: float | None = ACK_RTT) -> None:
        self.job, self.pool, self.rng = job, pool, rng
        #: As the real agent (uplink._time_ack): the last acknowledged report's
        #: seq and round trip, sent with every report after it (timed_seq).
        #: ``ack_rtt``: reports built ahead of a daemon (no stream to ack them)
        #: are taken as acknowledged that long after they were built, before
        #: the next; None: only ``acked`` times them (a live stream).
        self.ack_rtt = ack_rtt
        self.timed: tuple[int, float] | None = None
        self.built: dict[int, float] = {}  # seq -> agent clock it was built at, unacked
        self.protocol = protocol
        self.stream_reports = 0  # reports on the current stream (protocol 2: snapshots)
        self.since_full = 0      # reports since one with every rank in full
        self.job_phase = rng.randrange(JOB_INFO_EVERY)
        #: Per rank, the stack and state start (as -since) of its last full sample.
        self.last_full: list[tuple[str, float] | None] = [None] * RANKS_PER_NODE
        self.stack_change = stack_change
        self.node = f"{job.job_id[-12:]}-n{node_index:05d}"
        self.agent_id = uuid.UUID(int=rng.getrandbits(128)).hex
        first = node_index * RANKS_PER_NODE
        self.ranks = list(range(first, min(first + RANKS_PER_NODE, job.world)))
        self.ident = [pb.RankSample(identity=pb.RankIdentity(
            job_id=job.job_id, rank=r, local_rank=r - first, world_size=job.world,
            pid=10_000 + r)).SerializeToString() for r in self.ranks]
        # A few variants of each rank's process stats, cycled: values move
        # between rounds as real readings do.
        self.stats = [[self._stats(r, k) for k in range(3)] for r in self.ranks]
        self.job_info = pb.RankSample(job=pb.JobInfo(
            source="torchelastic", env=ENV, watchdog_timeout_seconds=1800.0)).SerializeToString()
        self.header = pb.NodeReport(
            node=self.node, agent_id=self.agent_id, full_round=True,
            health=pb.AgentHealth(version="0.1.0", ranks_watched=len(self.ranks), nvml_up=True,
                                  pyspy_runs_total=120, pyspy_seconds_total=31.5,
                                  cpu_seconds_total=12.25, gpus_expected=8),
        ).SerializeToString()
        self.current = [rng.randrange(len(pool.normal)) for _ in self.ranks]
        self.since = [started] * len(self.ranks)  # when each rank entered its state
        self.taken = [started] * len(self.ranks)  # when its current stack was taken
        self.seq = 0
        self.interval = 1.0  # what the reports say (the daemon judges staleness by it)
        self.sent: set[str] = set()  # stack ids whose frames this stream has carried
        self.stalls: list[Stall] = []
        self.in_stall = False
        self.culprit_sends: list[float] = []  # send times of rank 0's reports in a stall

    def _stats(self, rank: int, k: int) -> bytes:
        rss = (7 << 30) + rank * 4096 + k * (3 << 20)
        return pb.RankSample(
            process=pb.ProcessStats(
                cpu_seconds=1000.0 + k, cpu_utilization=0.97 + 0.01 * k, rss_bytes=rss,
                io_read_bytes=(5 << 30) + k * 65536, io_write_bytes=(1 << 30) + k * 4096,
                num_threads=42, vms_bytes=(48 << 30) + k * 4096,
                memory_limits=[
                    pb.MemoryLimit(kind=pb.MEMORY_LIMIT_KIND_HOST, used_bytes=rss,
                                   limit_bytes=rss + (900 << 30)),
                    pb.MemoryLimit(kind=pb.MEMORY_LIMIT_KIND_CGROUP, used_bytes=(60 << 30) + k,
                                   limit_bytes=1600 << 30)]),
            gpu=[pb.GpuMemory(device_index=rank % 8, device_uuid=f"GPU-{uuid.UUID(int=rank)}",
                              used_bytes=(70 << 30) + k * 4096, device_total_bytes=80 << 30,
                              device_used_bytes=(71 << 30) + k * 4096)],
        ).SerializeToString()

    def reconnected(self) -> None:
        """A new stream knows no stacks (and, protocol 2, no slots)."""
        self.sent.clear()
        self.stream_reports = 0
        self.last_full = [None] * RANKS_PER_NODE
        self.timed = None   # a new stream: untimed until its first ack
        self.built.clear()

    def acked(self, seq: int, now: float) -> None:
        """Report ``seq`` was acknowledged at ``now`` (agent clock): the next
        reports carry its round trip (uplink._time_ack's bounds)."""
        t = self.built.pop(seq, None)
        for old in [s for s in self.built if s < seq]:
            del self.built[old]
        if t is not None and t > 0 and 0 <= now - t < 60.0:
            self.timed = (seq, now - t)

    def _stall_at(self, t: float) -> Stall | None:
        for s in self.stalls:
            if s.start <= t < s.end:
                return s
        return None

    def report(self, t: float) -> bytes:
        """The next ReportRequest, serialised, as of monotonic time ``t``."""
        if self.ack_rtt is not None and self.seq in self.built \
                and self.built[self.seq] + self.ack_rtt <= t:
            self.acked(self.seq, self.built[self.seq] + self.ack_rtt)
        self.seq += 1
        self.built[self.seq] = t
        stall = self._stall_at(t) if self.stalls else None
        if self.in_stall and stall is None:  # out of the barrier/save: training again
            self.since = [t] * len(self.ranks)
            self.taken = [t] * len(self.ranks)
        self.in_stall = stall is not None
        parts = [self.header, field_varint(3, self.seq), field_double(4, t),
                 field_double(5, t + 1.7e9), field_double(11, self.interval)]
        if self.timed is not None:
            parts += [field_varint(95, self.timed[0]), field_double(96, self.timed[1])]
        # Job info on the first report, then every JOB_INFO_EVERY rounds at the
        # agent's own phase (agents start at different times).
        with_job = self.seq == 1 or (self.seq + self.job_phase) % JOB_INFO_EVERY == 1
        pool, rng = self.pool, self.rng
        v2 = self.protocol >= 2
        # Protocol 2 as ncclwatch.agent.delta sends it: the stream's first report
        # resets the slots, every SNAPSHOT_EVERY-th is all full samples, and in
        # between a rank whose stack, state start and stack time did not change
        # goes as a brief, one where only those moved as a RankChange.
        snapshot = v2 and (self.stream_reports == 0 or self.since_full >= SNAPSHOT_EVERY - 1)
        if v2 and self.stream_reports == 0:
            parts.append(field_varint(13, 1))
        if v2 and self.stream_reports == 0:  # a stream's snapshots at its own phase
            self.since_full = self.rng.randrange(SNAPSHOT_EVERY)
        elif snapshot or with_job:
            self.since_full = 0
        else:
            self.since_full += 1
        self.stream_reports += 1
        briefs: list[int] = []
        stills: list[float] = []
        stacks = []
        for i, rank in enumerate(self.ranks):
            full = with_job or snapshot or self.last_full[i] is None
            still = 0.0
            if stall is not None:
                if rank == 0:  # saving: a fresh stack each round (the daemon asks)
                    part, secs, age = pool.save, t - stall.start + 1.0, 0.0
                    full = True
                else:  # in barrier since the stall began, still, seen there once
                    part, secs = pool.barrier, t - stall.start
                    age = still = t - stall.start
            else:
                if rng.random() < self.stack_change:
                    j = rng.randrange(len(pool.normal))
                    if pool.normal[j].state != pool.normal[self.current[i]].state:
                        self.since[i] = t
                    self.current[i] = j
                    self.taken[i] = t - 0.4
                part = pool.normal[self.current[i]]
                secs, age = t - self.since[i], max(0.0, t - self.taken[i])
            # What a brief would repeat: stack, state start and when the stack was taken.
            seen = (part.sid, round(t - secs, 3), round(t - age, 3))
            if v2 and not full:
                if self.last_full[i] == seen:
                    briefs.append(i + 1)
                    stills.append(still)
                    continue
                # Only the state moved (agent.delta WHY_CHANGE): a RankChange.
                self.last_full[i] = seen
                if part.sid not in self.sent:
                    self.sent.add(part.sid)
                    stacks.append(part.wire)
                parts.append(field_bytes(14, b"".join([
                    field_varint(1, i + 1), part.state, field_double(4, secs),
                    field_double(5, age), field_double(7, still),
                    varint(8 << 3 | 5), struct.pack("<f", 0.97), field_double(9, 1000.0)])))
                continue
            self.last_full[i] = seen
            if part.sid not in self.sent:
                self.sent.add(part.sid)
                stacks.append(part.wire)
            sample = [self.ident[i], part.state, field_double(4, secs), field_double(5, age),
                      self.stats[i][self.seq % 3], field_double(60, still)]
            if with_job:
                sample.append(self.job_info)
            if v2:
                sample.append(field_varint(61, i + 1))
            parts.append(field_bytes(8, b"".join(sample)))
        if briefs:
            n = len(briefs)
            parts.append(field_bytes(12, b"".join([
                field_bytes(1, b"".join([varint(x) for x in briefs])),
                field_bytes(2, struct.pack(f"<{n}d", *stills)),
                field_bytes(3, struct.pack(f"<{n}f", *[0.97] * n)),
                field_bytes(4, struct.pack(f"<{n}d", *[1000.0] * n))])))
        if stall is not None and self.ranks[0] == 0:
            self.culprit_sends.append(t)
        parts += stacks
        return field_varint(1, self.protocol) + field_bytes(2, b"".join(parts))


def check_assembly() -> None:
    """The assembled bytes are the message a real agent would build."""
    job = JobSpec("torchelastic:check", 16)
    a = SimAgent(job, 1, Pool.build(), random.Random(1), 0.0, 100.0, protocol=1)
    got = pb.ReportRequest.FromString(a.report(105.0))
    r = got.report
    assert got.protocol_version == 1 and r.seq == 1 and r.node == a.node and r.full_round
    assert [s.identity.rank for s in r.samples] == list(range(8, 16))
    s = r.samples[0]
    part = a.pool.normal[a.current[0]]
    assert s.stack_id == part.sid and s.state_seconds == 5.0 and s.job.env == ENV
    assert s.process.memory_limits[1].limit_bytes == 1600 << 30 and s.gpu[0].device_index == 0
    assert {st.id for st in r.stacks} == {p.sid for p in a.pool.normal
                                         if p.sid in {x.stack_id for x in r.samples}}
    again = pb.ReportRequest.FromString(a.report(106.0)).report
    assert not again.stacks and not again.samples[0].HasField("job") and again.seq == 2
    # Protocol 2: a full first report with slots, then briefs the daemon resolves.
    from ncclwatch.daemon.core import Daemon, DaemonConfig
    d = Daemon(DaemonConfig())
    b = SimAgent(job, 1, Pool.build(), random.Random(1), 0.0, 100.0, protocol=2)
    first = pb.ReportRequest.FromString(b.report(105.0))
    assert first.protocol_version == 2 and first.report.slots_reset
    assert [x.slot for x in first.report.samples] == list(range(1, 9))
    assert not d.ingest(first, now=105.0).resync
    second = pb.ReportRequest.FromString(b.report(106.0))
    assert not second.report.samples and list(second.report.briefs.slot) == list(range(1, 9))
    assert not d.ingest(second, now=106.0).resync
    assert d.table.jobs[job.job_id].ranks[15].seen == 106.0 and d.table.samples_total == 16
    # Into a stall and out of it the ranks' states change: full samples, and
    # waiters stay briefs in between with their progress reading (still).
    b.stalls.append(Stall(107.0, 109.0))
    in_stall = pb.ReportRequest.FromString(b.report(107.0)).report
    assert len(in_stall.changes) == 8 and in_stall.changes[0].still_seconds == 0.0
    assert in_stall.changes[0].slot == 1 and in_stall.changes[0].stack_id == b.pool.barrier.sid
    assert in_stall.changes[0].op == pb.COLLECTIVE_OP_BARRIER
    waiting = pb.ReportRequest.FromString(b.report(108.0)).report
    assert not waiting.samples and list(waiting.briefs.still_seconds) == [1.0] * 8
    after = pb.ReportRequest.FromString(b.report(109.0)).report
    assert len(after.changes) == 8 and not after.briefs.slot
    for t, r in ((107.0, in_stall), (108.0, waiting), (109.0, after)):
        assert not d.ingest(pb.ReportRequest(protocol_version=2, report=r), now=t).resync
    steady = pb.ReportRequest.FromString(b.report(110.0)).report
    assert not steady.samples and len(steady.briefs.slot) == 8
    # Each report says the round trip of the one before, acknowledged (the real
    # agent's timed_seq): the daemon keeps no offsets for reports never timed.
    assert not first.report.timed_seq
    assert steady.timed_seq == steady.seq - 1
    assert abs(steady.timed_round_trip_seconds - ACK_RTT) < 1e-9
    assert list(d.table.agents[b.agent_id]._by_seq) == [after.seq]


# -- the daemon process ---------------------------------------------------------------

def serve_main(argv: list[str]) -> int:
    """Run a DaemonServer on loopback; print its ports, then (on SIGTERM) its final state."""
    ap = argparse.ArgumentParser(prog="bench.loadgen serve")
    ap.add_argument("--cpu", type=int, default=None, help="pin the daemon to this CPU")
    ap.add_argument("--stall-threshold", type=float, default=5.0)
    ap.add_argument("--tick", type=float, default=0.5)
    ap.add_argument("--null", action="store_true",
                    help="transport floor: parse each report and ack it, no daemon logic")
    ap.add_argument("--ingest-workers", type=int, default=0,
                    help="the daemon's ingest worker processes (they float over every CPU; "
                         "--cpu pins the core alone)")
    a = ap.parse_args(argv)
    if a.cpu is not None:  # before grpc starts its threads: they inherit it
        os.sched_setaffinity(0, {a.cpu})
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(_serve_null() if a.null else _serve(a.stall_threshold, a.tick,
                                                    a.ingest_workers))
    return 0


def _unpin(pid: int) -> None:
    """Every thread of ``pid`` may run on every CPU (a worker inherits the core's pin)."""
    cpus = set(range(os.cpu_count() or 1))
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass


async def _until_sigterm() -> None:
    """Until SIGTERM, or stdin's end: the caller died, so do not outlive it."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    eof = asyncio.create_task(reader.read())
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait([eof, waiter], return_when=asyncio.FIRST_COMPLETED)
    eof.cancel()
    waiter.cancel()


async def _serve(stall_threshold: float, tick: float, workers: int = 0) -> None:
    from ncclwatch.daemon.core import Daemon, DaemonConfig
    from ncclwatch.daemon.server import DaemonServer

    class TimedDaemon(Daemon):
        """Records, per opened incident, when the tick that opened it ended:
        from then on /metrics and the API show it (they read on this loop)."""

        opened: list[dict] = []

        def tick(self, now=None, wall=None) -> None:
            before = {i.id for i in self.incidents.active.values()}
            super().tick(now, wall)
            end = time.monotonic()
            for inc in self.incidents.active.values():
                if inc.id not in before:
                    self.opened.append({"job": inc.job_id, "kind": inc.kind.value,
                                        "tick_start": inc.detected_at, "tick_end": end})

    d = TimedDaemon(DaemonConfig(grpc="127.0.0.1:0", http="127.0.0.1:0",
                                 stall_threshold=stall_threshold, tick=tick,
                                 ingest_workers=workers))
    srv = DaemonServer(d)
    await srv.start()
    pids = [w.pid for w in d.ingest_workers]
    for pid in pids:
        _unpin(pid)
    print(json.dumps({"grpc": srv.grpc_port, "http": srv.http_port, "pid": os.getpid(),
                      "workers": pids}), flush=True)
    await _until_sigterm()
    t = d.table
    ranks = [r for j in t.jobs.values() for r in j.ranks.values()]
    final = {"samples_total": t.samples_total, "reports_total": t.reports_total,
             "duplicates_total": t.duplicates_total, "rejected": dict(d.rejected_total),
             "ticks": d.ticks_total, "detect_seconds": d.detect_seconds_total,
             "jobs": sorted(t.jobs), "ranks": len(ranks),
             "curve_points_min": min((len(r.curve) for r in ranks), default=0),
             "opened": d.opened,
             "worker_restarts": sum(w.restarts_total for w in d.ingest_workers),
             "worker_reports": [w.forwarded_total for w in d.ingest_workers]}
    await srv.stop(0.2)
    print(json.dumps(final), flush=True)


async def _serve_null() -> None:
    """The same gRPC server, options and handler shape as the daemon's (its
    transport step, ``ingest.serve``), minus the daemon: parse and ack."""
    import grpc

    from ncclwatch.daemon import ingest
    from ncclwatch.daemon.service import SERVER_OPTIONS, SERVICE

    counts = {"samples_total": 0, "reports_total": 0}
    parse, ack = pb.ReportRequest.FromString, pb.ReportResponse

    def answer(raw: bytes) -> bytes:
        r = parse(raw).report
        counts["reports_total"] += 1
        counts["samples_total"] += len(r.samples)
        return ack(ack_seq=r.seq).SerializeToString()

    async def report(requests, context):
        await ingest.serve(context, answer)

    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        SERVICE, {"Report": grpc.stream_stream_rpc_method_handler(report)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(json.dumps({"grpc": port, "http": 0, "pid": os.getpid()}), flush=True)
    await _until_sigterm()
    await server.stop(0.2)
    print(json.dumps(counts), flush=True)


class DaemonProc:
    """The caller's handle on a ``serve`` process."""

    def __init__(self, *, cpu: int | None = None, stall_threshold: float = 5.0,
                 tick: float = 0.5, null: bool = False, ingest_workers: int = 0) -> None:
        argv = [sys.executable, "-m", "bench.loadgen", "serve",
                "--stall-threshold", str(stall_threshold), "--tick", str(tick),
                "--ingest-workers", str(ingest_workers)]
        if cpu is not None:
            argv += ["--cpu", str(cpu)]
        if null:
            argv.append("--null")
        # stdin stays open while this process lives: at its end the daemon stops.
        self.p = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, start_new_session=True)
        info = json.loads(self.p.stdout.readline())
        self.grpc, self.http = f"127.0.0.1:{info['grpc']}", f"http://127.0.0.1:{info['http']}"
        self.ps = psutil.Process(self.p.pid)
        #: The ingest worker processes; their CPU is the daemon's too.
        self.workers = [psutil.Process(pid) for pid in info.get("workers", [])]

    def cpu_seconds(self) -> float:
        """The daemon's CPU: the core and its ingest workers."""
        return self.core_cpu_seconds() + self.worker_cpu_seconds()

    def core_cpu_seconds(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def worker_cpu_seconds(self) -> float:
        total = 0.0
        for w in self.workers:
            try:
                t = w.cpu_times()
            except psutil.NoSuchProcess:  # a worker died (restarts are counted in stop())
                continue
            total += t.user + t.system
        return total

    def rss(self) -> int:
        return self.ps.memory_info().rss

    def stop(self) -> dict:
        """SIGTERM; the daemon's final counters, job ids and opened incidents."""
        self.p.send_signal(signal.SIGTERM)
        out, _ = self.p.communicate(timeout=60)
        return json.loads(out.strip().splitlines()[-1])


# -- the client process -----------------------------------------------------------

@dataclass
class ClientPlan:
    targets: list[str]                   # daemons; a job goes to targets[shard(job, n)]
    agents: list[tuple[str, int, int, int]]  # (job id, world size, node index, fleet index)
    interval: float = 1.0
    stack_change: float = 0.01
    streams_per_channel: int = 1
    seed: int = 0
    base: float = 0.0  # interval mode: fleet agent i sends at base + phase(i) + k*interval


def phase(i: int, interval: float) -> float:
    """Agent i's offset in the round: spread evenly (golden ratio), known to every process."""
    return (i * 0.6180339887498949) % 1.0 * interval


class Client:
    """Many agent streams in one process; commands on stdin, answers on stdout."""

    def __init__(self, plan: ClientPlan) -> None:
        self.plan = plan
        self.mode = "interval"
        self.acked_reports = 0
        self.acked_samples = 0
        self.acked_by_target = [0] * len(plan.targets)  # samples, per daemon
        self.sent_reports = 0
        self.commands = 0
        self.errors: list[str] = []
        pools: dict[str, Pool] = {}
        rng = random.Random(plan.seed)
        now = time.monotonic()
        self.agents: list[tuple[int, SimAgent]] = []
        for job_id, world, node, i in plan.agents:
            pool = pools.setdefault(job_id, Pool.build())
            a = SimAgent(JobSpec(job_id, world), node, pool, random.Random(rng.getrandbits(64)),
                         plan.stack_change, now - 3600.0)
            a.interval = plan.interval
            self.agents.append((i, a))
        self.connected: set[int] = set()  # agents acknowledged at least once
        self.failures = 0                  # streams that failed (and were reopened)
        self.all_acked = asyncio.Event()

    async def run(self, commands: asyncio.StreamReader) -> None:
        import grpc

        channels: dict[tuple[int, int], grpc.aio.Channel] = {}  # (daemon, group) -> channel
        tasks = []
        per = self.plan.streams_per_channel
        n = len(self.plan.targets)
        for k, (i, a) in enumerate(self.agents):
            daemon = shard(a.job.job_id, n)
            key = (daemon, k // per)
            ch = channels.get(key)
            if ch is None:
                ch = channels[key] = grpc.aio.insecure_channel(self.plan.targets[daemon],
                                                               options=CHANNEL_OPTIONS)
            tasks.append(asyncio.create_task(self._stream(i, a, ch, daemon)))
        reader = asyncio.create_task(self._commands(commands))
        await reader
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for ch in channels.values():
            await ch.close()

    async def _stream(self, i: int, a: SimAgent, ch, daemon: int) -> None:
        """Agent ``i``'s stream; like the real agent, reconnect with backoff when it fails.

        Failures are counted: when thousands of agents connect at once, the
        grpc.aio server accepts calls slower than they come, and gRPC cancels
        calls left unaccepted (30 s, or past its pending-call limit).
        """
        from ncclwatch.agent.uplink import Backoff

        backoff = Backoff()
        while True:
            try:
                if await self._session(i, a, ch, daemon):
                    backoff.reset()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.failures += 1
                if len(self.errors) < 20:
                    self.errors.append(f"{a.node} after {a.seq} reports, t={time.monotonic():.1f}:"
                                       f" {type(e).__name__}: {e}"[:1000])
            await asyncio.sleep(backoff.next())

    async def _session(self, i: int, a: SimAgent, ch, daemon: int) -> bool:
        """One stream until it fails; True if the daemon acknowledged anything."""
        import grpc

        call = ch.stream_stream(METHOD, request_serializer=None, response_deserializer=None)()
        a.reconnected()
        a.ack_rtt = None   # the stream's own acknowledgements time its reports
        samples = len(a.ranks)
        acked = False
        try:
            while True:
                if self.mode == "interval":  # else "saturate": send as soon as acked
                    await self._sleep_to_slot(i)
                await call.write(a.report(time.monotonic()))
                self.sent_reports += 1
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    raise RuntimeError("stream ended by the daemon")
                self.acked_reports += 1
                a.acked(a.seq, time.monotonic())
                self.acked_samples += samples
                self.acked_by_target[daemon] += samples
                if len(resp) > ACK_ONLY_MAX:  # missing stacks or commands
                    self._on_response(a, resp)
                if not acked:
                    acked = True
                    if i not in self.connected:
                        self.connected.add(i)
                        if len(self.connected) == len(self.agents):
                            self.all_acked.set()
        except asyncio.CancelledError:
            call.cancel()
            raise
        return acked

    def _on_response(self, a: SimAgent, raw: bytes) -> None:
        resp = pb.ReportResponse.FromString(raw)
        self.commands += len(resp.commands)
        a.sent.difference_update(resp.missing_stack_ids)
        if resp.resync:
            a.stream_reports = 0
            a.last_full = [None] * RANKS_PER_NODE

    async def _sleep_to_slot(self, i: int) -> None:
        p = self.plan
        now = time.monotonic()
        off = p.base + phase(i, p.interval)
        k = math.floor((now - off) / p.interval) + 1
        await asyncio.sleep(max(0.0, off + k * p.interval - now))

    async def _commands(self, reader: asyncio.StreamReader) -> None:
        while True:
            line = await reader.readline()
            if not line:
                return
            cmd = json.loads(line)
            op = cmd["cmd"]
            if op == "wait_ready":
                try:
                    await asyncio.wait_for(self.all_acked.wait(), cmd.get("timeout", 120))
                except asyncio.TimeoutError:
                    pass
                self._reply(ready=self.all_acked.is_set(), connected=len(self.connected),
                            agents=len(self.agents), failures=self.failures,
                            errors=self.errors[:3])
            elif op == "interval":  # rounds this far apart from now on
                self.plan.interval = cmd["seconds"]
                for _, a in self.agents:
                    a.interval = cmd["seconds"]
                self._reply(interval=self.plan.interval)
            elif op == "mode":
                self.mode = cmd["mode"]
                self._reply(mode=self.mode)
            elif op == "count":
                self._reply(t=time.monotonic(), acked_reports=self.acked_reports,
                            acked_samples=self.acked_samples, by_target=self.acked_by_target,
                            sent=self.sent_reports, failures=self.failures,
                            connected=len(self.connected))
            elif op == "stalls":
                windows = [Stall(s, e) for s, e in cmd["windows"]]
                for _, a in self.agents:
                    if a.job.job_id == cmd["job"]:
                        a.stalls = windows
                self._reply(stalls=len(windows))
            elif op == "stop":
                culprit = [t for _, a in self.agents for t in a.culprit_sends]
                self._reply(stopped=True, acked_reports=self.acked_reports,
                            acked_samples=self.acked_samples, commands=self.commands,
                            errors=self.errors, failures=self.failures,
                            culprit_sends=culprit)
                return

    @staticmethod
    def _reply(**kw) -> None:
        sys.stdout.write(json.dumps(kw) + "\n")
        sys.stdout.flush()


def client_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench.loadgen client")
    ap.add_argument("--cpus", default="", help="pin to these CPUs (comma separated)")
    a = ap.parse_args(argv)
    if a.cpus:
        os.sched_setaffinity(0, {int(c) for c in a.cpus.split(",")})
    logging.basicConfig(level=logging.ERROR)

    async def go() -> None:
        # Every line of stdin, the plan included, goes through one reader:
        # sys.stdin's own buffer would swallow commands sent right after it.
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 26)  # the plan lists thousands of agents
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        plan = ClientPlan(**json.loads(await reader.readline()))
        plan.agents = [tuple(x) for x in plan.agents]
        await Client(plan).run(reader)

    asyncio.run(go())
    return 0


class ClientProc:
    """The caller's handle on a ``client`` process."""

    def __init__(self, plan: ClientPlan, cpus: list[int] | None = None) -> None:
        argv = [sys.executable, "-m", "bench.loadgen", "client"]
        if cpus:
            argv += ["--cpus", ",".join(map(str, cpus))]
        self.p = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, start_new_session=True)
        self.p.stdin.write(json.dumps(asdict(plan)) + "\n")
        self.p.stdin.flush()

    def send(self, **cmd) -> None:
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()

    def answer(self) -> dict:
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"client {self.p.pid} exited ({self.p.wait()})")
        return json.loads(line)

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


class Clients:
    """A few client processes that together play every agent of a fleet."""

    def __init__(self, jobs: list[JobSpec], targets: list[str], *, processes: int = 2,
                 interval: float = 1.0, stack_change: float = 0.01,
                 streams_per_channel: int = 1, cpus: list[int] | None = None) -> None:
        agents = [(j.job_id, j.world, n) for j in jobs for n in range(j.nodes)]
        self.agents = [(job, world, n, i) for i, (job, world, n) in enumerate(agents)]
        self.interval = interval
        self.base = time.monotonic()
        self.procs = [ClientProc(ClientPlan(
            targets=targets, agents=self.agents[k::processes], interval=interval,
            stack_change=stack_change, streams_per_channel=streams_per_channel, seed=k,
            base=self.base), cpus) for k in range(processes)]

    def set_interval(self, seconds: float) -> None:
        """Interval mode: every agent reports every ``seconds`` from now on."""
        self.interval = seconds
        self.ask(cmd="interval", seconds=seconds)

    def send_times(self, index: int, after: float) -> float:
        """Interval mode: the first time >= ``after`` fleet agent ``index`` sends at."""
        off = self.base + phase(index, self.interval)
        return off + math.ceil((after - off) / self.interval) * self.interval

    def ask(self, **cmd) -> list[dict]:
        """The same command to every process; their answers."""
        for p in self.procs:
            p.send(**cmd)
        return [p.answer() for p in self.procs]

    def count(self) -> tuple[float, list[int], int]:
        """(time, acked samples per daemon, stream failures), summed over the processes."""
        rs = self.ask(cmd="count")
        by_target = [sum(col) for col in zip(*(r["by_target"] for r in rs))]
        return sum(r["t"] for r in rs) / len(rs), by_target, sum(r["failures"] for r in rs)

    def wait_ready(self, timeout: float) -> dict:
        """Until every agent has been acknowledged once; raise if some never were."""
        rs = self.ask(cmd="wait_ready", timeout=timeout)
        out = {"seconds": round(time.monotonic() - self.base, 1),
               "failures": sum(r["failures"] for r in rs)}
        if not all(r["ready"] for r in rs):
            raise RuntimeError(f"agents not connected after {timeout} s: "
                               f"{[(r['connected'], r['agents'], r['errors']) for r in rs]}")
        return out

    def cpu_seconds(self) -> float:
        """CPU time of all client processes so far."""
        total = 0.0
        for p in self.procs:
            t = psutil.Process(p.p.pid).cpu_times()
            total += t.user + t.system
        return total

    def stop(self) -> list[dict]:
        try:
            return self.ask(cmd="stop")
        finally:
            for p in self.procs:
                p.close()


def main(argv: list[str]) -> int:
    if argv and argv[0] == "serve":
        return serve_main(argv[1:])
    if argv and argv[0] == "client":
        return client_main(argv[1:])
    if argv and argv[0] == "check":
        check_assembly()
        print("assembly ok")
        return 0
    print("usage: python -m bench.loadgen serve|client|check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
