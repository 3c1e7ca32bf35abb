"""Domain vocabulary shared by agent and daemon (names from DESIGN.md).

Python enums mirror the protobuf enums one to one, so pure code never
handles wire integers; ``to_proto``/``from_proto`` are the only bridges.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from ncclwatch.v1 import collector_pb2 as pb


class RankState(str, enum.Enum):
    """What a rank is doing, from its main thread's stack."""

    UNKNOWN = "unknown"
    SAVING = "saving"
    GATHERING_STATE_DICT = "gathering_state_dict"
    LOADING = "loading"
    COLLECTIVE = "collective"
    DEVICE_WAIT = "device_wait"
    COMPUTE = "compute"
    DATALOADER = "dataloader"
    IDLE = "idle"

    def to_proto(self) -> int:
        return pb.RankState.Value("RANK_STATE_" + self.name)

    @classmethod
    def from_proto(cls, value: int) -> "RankState":
        if value == pb.RANK_STATE_UNSPECIFIED:
            return cls.UNKNOWN
        return cls[pb.RankState.Name(value).removeprefix("RANK_STATE_")]


class CollectiveOp(str, enum.Enum):
    """The collective a rank is inside; NONE when it is in none."""

    NONE = "none"
    BARRIER = "barrier"
    BROADCAST = "broadcast"
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    GATHER = "gather"
    SCATTER = "scatter"
    REDUCE = "reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    SEND = "send"
    RECV = "recv"
    ALL_GATHER_OBJECT = "all_gather_object"
    GATHER_OBJECT = "gather_object"
    BROADCAST_OBJECT_LIST = "broadcast_object_list"
    SCATTER_OBJECT_LIST = "scatter_object_list"
    MONITORED_BARRIER = "monitored_barrier"
    WAIT = "wait"

    def to_proto(self) -> int:
        if self is CollectiveOp.NONE:
            return pb.COLLECTIVE_OP_UNSPECIFIED
        return pb.CollectiveOp.Value("COLLECTIVE_OP_" + self.name)

    @classmethod
    def from_proto(cls, value: int) -> "CollectiveOp":
        if value == pb.COLLECTIVE_OP_UNSPECIFIED:
            return cls.NONE
        return cls[pb.CollectiveOp.Name(value).removeprefix("COLLECTIVE_OP_")]


class WaitEvidence(str, enum.Enum):
    """How a rank's waiting was established (issue 18); NONE: not waiting."""

    NONE = "none"
    PYTHON_FRAME = "python_frame"
    NATIVE_FRAME = "native_frame"
    FLIGHT_RECORDER = "flight_recorder"
    #: Provisional: still since a peer's long work began, nothing else yet.
    STILLNESS = "stillness"

    def to_proto(self) -> int:
        if self is WaitEvidence.NONE:
            return pb.WAIT_EVIDENCE_UNSPECIFIED
        return pb.WaitEvidence.Value("WAIT_EVIDENCE_" + self.name)

    @classmethod
    def from_proto(cls, value: int) -> "WaitEvidence":
        if value == pb.WAIT_EVIDENCE_UNSPECIFIED:
            return cls.NONE
        return cls[pb.WaitEvidence.Name(value).removeprefix("WAIT_EVIDENCE_")]


#: States in which a rank works on a checkpoint (the usual culprits).
CHECKPOINT_STATES = frozenset(
    {RankState.SAVING, RankState.GATHERING_STATE_DICT, RankState.LOADING}
)


class StallKind(str, enum.Enum):
    """Conditions over a job's ranks (DESIGN.md: stall)."""

    CHECKPOINT_GATHER = "checkpoint_gather"
    CHECKPOINT_RESTORE = "checkpoint_restore"
    COLLECTIVE_HANG = "collective_hang"
    DESYNC = "desync"
    RANK_LOST = "rank_lost"


def rank_label(key: int) -> str:
    """A rank key as text: '3', or '?1' for the daemon's first member of a job
    whose rank is unknown (those are keyed -1, -2, ...; see table.Job.key_of)."""
    return str(key) if key >= 0 else f"?{-key}"


def rank_or_process(key: int, host: str, pid: int) -> str:
    """A rank as a metric label: '3', or for a member whose number nothing
    showed its process, 'host:pid' (the daemon's '?1' names nothing outside
    it; a label is never empty)."""
    return str(key) if key >= 0 else f"{host or '?'}:{pid}"


def rank_name(key: int) -> str:
    """'rank 3', or 'unidentified rank ?1' (its pid is shown beside it)."""
    return f"rank {key}" if key >= 0 else f"unidentified rank {rank_label(key)}"


def rank_ranges(ranks) -> str:
    """[0, 1, 2, 5] -> '0-2,5': how rank lists read in messages; members
    with unknown rank (negative keys) follow as '?1,?2'."""
    ranks = sorted(ranks)
    if ranks and ranks[0] >= 0 and ranks[-1] - ranks[0] == len(ranks) - 1 \
            and len(set(ranks)) == len(ranks):
        # One run (every rank but the culprit, say): no walk over 100k numbers.
        return str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"
    unknown = [rank_label(r) for r in sorted(r for r in ranks if r < 0)[::-1]]
    ranks = [r for r in ranks if r >= 0]
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out + unknown)


def scheduler_label(sj: dict | None) -> str:
    """{'scheduler': 'slurm', 'job_id': '12', 'job_name': 'llm', 'user': 'ana'} ->
    "slurm 12 'llm' by ana": how a job reads for the people who submitted it."""
    if not sj:
        return ""
    out = f"{sj.get('scheduler', '')} {sj.get('job_id', '')}".strip()
    if sj.get("job_name"):
        out += f" {sj['job_name']!r}"
    if sj.get("user"):
        out += f" by {sj['user']}"
    return out


#: Below this share of one core a rank counts as quiet: blocked or sleeping.
#: The agent (start estimates, sampling) and the daemon (which waits are
#: believable) must agree on it.
QUIET_CPU = 0.05


#: Where a checkpoint's expected size came from (forecast ``expected_source``),
#: in words: "size from the <words>". The first three are the file's own.
SIZE_SOURCES = {
    "torch_zip_header": "torch.save header",
    "safetensors_header": "safetensors header",
    "copy_source": "file being copied",
    "file_closed": "closed file",
    "previous_checkpoint": "previous checkpoint",
    "gathered_bytes": "memory the rank gathered",
}

#: Progress events (read/write syscalls of the rank, voluntary context switches
#: of its main thread) per second below which a rank counts as still: making no
#: progress, whatever CPU its spinning threads burn. A rank waiting in a
#: collective makes none (gloo: one futex wait; NCCL: a spin in
#: cudaStreamSynchronize); a training step makes hundreds.
STILL_EVENTS_PER_S = 2.0


def progressed(events: float, seconds: float) -> bool:
    """``events`` progress events over ``seconds`` are progress: at least
    STILL_EVENTS_PER_S a second. The one test of it, for every window the
    agent judges (a round, the time since a stack, since a sample). No event
    is never progress, over however short a window."""
    return events > 0 and events >= STILL_EVENTS_PER_S * seconds


def describe_container(view: Mapping[str, object] | None) -> str:
    """The API's ``container`` object in words, for the page and ``ncclwatch status``:
    ``pid 32 in container trainer-0 (containerd 4c15c0c881a4), pod ml/trainer-0``."""
    if not view:
        return ""
    parts = []
    where = "in container"
    if view.get("hostname"):
        where += f" {view['hostname']}"
    if view.get("id"):
        where += f" ({view.get('runtime') or 'runtime'} {str(view['id'])[:12]})"
    parts.append(f"pid {view['pid']} {where}" if view.get("pid") else where)
    if view.get("pod"):
        ns = f"{view['namespace']}/" if view.get("namespace") else ""
        parts.append(f"pod {ns}{view['pod']}")
    declared = view.get("declared_by_rank") or {}
    if declared.get("pod") and (declared.get("pod"), declared.get("namespace")) != \
            (view.get("pod"), view.get("namespace")):
        ns = f"{declared['namespace']}/" if declared.get("namespace") else ""
        parts.append(f"pod {ns}{declared['pod']} declared by the rank")
    return ", ".join(parts)
