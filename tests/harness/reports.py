"""Reports as an agent sends them, built small: samples, stacks, whole jobs, and daemons fed them.

The builders of the Flight Recorder analyzer's tests, then the feeds that drive a
real ``Daemon`` one simulated second at a time (``drive_job``, ``Feed``,
``feed_lightning_save``).
"""

from __future__ import annotations

import time

from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.model import CollectiveOp, RankState, StallKind
from ncclwatch.stacks import Frame, stack_id
from ncclwatch.v1 import collector_pb2 as pb

C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
SER = "/venv/lib/python3.11/site-packages/torch/serialization.py"
MB = 1 << 20


def frames(*names_files: tuple[str, str]) -> list[Frame]:
    return [Frame(n, f, i + 1) for i, (n, f) in enumerate(names_files)]


def stack_pb(fr: list[Frame]) -> pb.Stack:
    return pb.Stack(id=stack_id(fr), thread_name="MainThread",
                    frames=[pb.Frame(name=f.name, filename=f.filename, line=f.line) for f in fr])


BARRIER = frames(("barrier", C10D), ("wrapper", "/x/torch/distributed/c10d_logger.py"),
                 ("main", "/job/train.py"))
SAVE = frames(("write", "/job/storage.py"), ("_save", SER), ("save", SER), ("main", "/job/train.py"))


def sample(job: str, rank: int, world: int, state: RankState, op: CollectiveOp = CollectiveOp.NONE,
           *, seconds: float = 0.0, stack: str = "", pid: int | None = None,
           timeout: float = 0.0) -> pb.RankSample:
    s = pb.RankSample(
        identity=pb.RankIdentity(job_id=job, rank=rank, local_rank=rank, world_size=world,
                                 pid=pid if pid is not None else 1000 + rank),
        state=state.to_proto(), op=op.to_proto(), state_seconds=seconds, stack_id=stack)
    if timeout:
        s.job.CopyFrom(pb.JobInfo(source="test", watchdog_timeout_seconds=timeout))
    return s


def report(samples: list[pb.RankSample], *, node: str = "node-a", agent: str = "agent-a",
           seq: int = 1, stacks: list[pb.Stack] = (), full: bool = True,
           interval: float = 1.0) -> pb.ReportRequest:
    return pb.ReportRequest(protocol_version=1, report=pb.NodeReport(
        node=node, agent_id=agent, seq=seq, agent_monotonic_seconds=100.0 + seq,
        interval_seconds=interval, full_round=full, samples=samples, stacks=list(stacks)))


def checkpoint_job(job: str = "job-1", world: int = 4, *, save_for: float = 20.0,
                   wait_for: float = 20.0, culprit_state: RankState = RankState.SAVING,
                   node: str = "node-a", agent: str = "agent-a", seq: int = 1,
                   timeout: float = 0.0) -> pb.ReportRequest:
    """Rank 0 in ``culprit_state``, every other rank in barrier."""
    samples = [sample(job, 0, world, culprit_state, seconds=save_for, stack=stack_id(SAVE),
                      timeout=timeout)]
    samples += [sample(job, r, world, RankState.COLLECTIVE, CollectiveOp.BARRIER,
                       seconds=wait_for, stack=stack_id(BARRIER), timeout=timeout)
                for r in range(1, world)]
    return report(samples, node=node, agent=agent, seq=seq,
                  stacks=[stack_pb(SAVE), stack_pb(BARRIER)])


# -- a 4-rank job whose rank 0 the test shapes, one report a second ---------------------

def rank0_sample(state: RankState, t: float, *, file_size: int = 0, prev: int = 0,
                 rss: int = 1000 * MB, limits=(), gpu=(), seconds: float = 0.0,
                 timeout: float = 90.0) -> pb.RankSample:
    """Rank 0 of "job-1" (world 4): its memory, the checkpoint file it writes
    (``file_size``, after one of ``prev`` bytes), its memory limits and GPUs."""
    s = sample("job-1", 0, 4, state, seconds=seconds, timeout=timeout)
    s.process.rss_bytes = rss
    s.process.io_write_bytes = file_size
    s.process.cpu_utilization = 0.9
    if file_size:
        s.process.files_writing.append(pb.OpenFile(
            path="/ckpt/run/ckpt-step200.pt", size_bytes=file_size,
            previous_path="/ckpt/run/ckpt-step100.pt" if prev else "",
            previous_size_bytes=prev))
    for kind, used, limit in limits:
        s.process.memory_limits.append(pb.MemoryLimit(kind=kind, used_bytes=used,
                                                      limit_bytes=limit))
    for g in gpu:
        s.gpu.append(g)
    return s


def drive_job(make_rank0, seconds: int, *, waiters_op: CollectiveOp = CollectiveOp.BARRIER,
              wait_state=RankState.COLLECTIVE, start: float = 1000.0) -> tuple[Daemon, float]:
    """One report per second for ``seconds``; ranks 1-3 blocked from t=0."""
    d = Daemon(DaemonConfig(stall_threshold=5.0))
    for i in range(seconds):
        now = start + i
        samples = [make_rank0(i)]
        samples += [sample("job-1", r, 4, wait_state, waiters_op, seconds=i, timeout=90.0)
                    for r in (1, 2, 3)]
        d.ingest(report(samples, seq=i + 1), now=now)
        d.tick(now=now, wall=now)
    return d, start + seconds - 1


# -- rounds of one agent, with each rank's stillness -------------------------------------

FEED_JOB, FEED_WORLD = "job-1", 3


class Feed:
    """Rounds of reports from one agent at 1 s, with still_seconds per rank."""

    def __init__(self, **cfg) -> None:
        self.d = Daemon(DaemonConfig(**cfg))
        self.seq = 0
        self.t = 1000.0

    def round(self, spec, *, stack_age: float = 0.5) -> None:
        """spec: [(rank, state, op, state_seconds, still_seconds)]"""
        self.seq += 1
        samples = []
        for r, state, op, secs, still in spec:
            s = sample(FEED_JOB, r, FEED_WORLD, state, op, seconds=secs,
                       stack=f"s{r}{op.value}")
            s.stack_age_seconds = stack_age
            s.still_seconds = still
            samples.append(s)
        self.d.ingest(report(samples, seq=self.seq), now=self.t)
        self.d.tick(now=self.t)
        self.t += 1.0

    def stalls(self) -> dict[StallKind, list[int]]:
        return {k: [c.rank for c in inc.finding.culprits]
                for (j, k), inc in self.d.incidents.active.items() if j == FEED_JOB}


# -- a Lightning job of any size whose rank 0 saves too slowly, one report per node ------

#: Ranks per node (per agent's report) in ``feed_lightning_save``.
PER_NODE = 512
LIGHTNING = "/venv/lib/python3.11/site-packages/lightning/pytorch/trainer/trainer.py"
LIGHTNING_SAVE = [Frame("write", "/job/storage.py", 10), Frame("save", SER, 20),
                  Frame("save_checkpoint", LIGHTNING, 30), Frame("fit", LIGHTNING, 40),
                  Frame("main", "/job/train.py", 50)]
LIGHTNING_WAIT = [Frame("barrier", C10D, 1), Frame("training_step", LIGHTNING, 2),
                  Frame("main", "/job/train.py", 3)]


def feed_lightning_save(d: Daemon, world: int, start: float, seconds: int,
                        first: int = 0) -> None:
    """Seconds ``first``.. of a ``world``-rank job: rank 0 writing (1 MB more each
    second, after a 400 MB checkpoint), the others in barrier, as agents of
    ``PER_NODE`` ranks report it."""
    for i in range(first, first + seconds):
        now = start + i
        r0 = rank0_sample(RankState.SAVING, i, file_size=(i + 1) * MB, prev=400 * MB,
                          seconds=i)
        r0.identity.world_size = world
        r0.stack_id = stack_id(LIGHTNING_SAVE)
        samples = [r0] + [sample("job-1", r, world, RankState.COLLECTIVE, CollectiveOp.BARRIER,
                                 seconds=i, stack=stack_id(LIGHTNING_WAIT), timeout=90.0)
                          for r in range(1, world)]
        for n in range(0, world, PER_NODE):  # one report per node, as agents send them
            d.ingest(report(samples[n:n + PER_NODE], node=f"node-{n // PER_NODE}",
                            agent=f"agent-{n // PER_NODE}", seq=i + 1,
                            stacks=[stack_pb(LIGHTNING_SAVE), stack_pb(LIGHTNING_WAIT)]),
                     now=now)
        d.tick(now=now, wall=time.time() - (time.monotonic() - now))
