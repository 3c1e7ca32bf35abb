"""Small builders for reports, as the Flight Recorder analyzer's tests do."""

from __future__ import annotations

from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.stacks import Frame, stack_id
from ncclwatch.v1 import collector_pb2 as pb

C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
SER = "/venv/lib/python3.11/site-packages/torch/serialization.py"


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
