"""What the logs say, rank by rank: the facts every verdict rule reads.

The scan (logscan.py) gives evidence lines, tracebacks and torchrun's failure
table (scanresult.py); ``gather_facts`` files them under the rank they belong
to, inferring ranks where a line names none, and the world size. What a
traceback says a rank was doing is here too (``exception_kind``,
``blocked_op``): a rank's facts need it to say whether it waited. The
questions rules share live beside it: who waited for whom (waiting.py), who
crashed on its own (crashes.py); what a rule returns is finding.py's.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Iterable

from ncclwatch.diagnose.lineprefix import DEFAULT_PG
from ncclwatch.diagnose.logwords import (
    NETWORK_EXCEPTIONS,
    PEER_EXCEPTIONS,
    TEARDOWN_EXCEPTIONS,
    TIMEOUT_EXCEPTIONS,
)
from ncclwatch.diagnose.scanresult import (
    Evidence,
    FailureEntry,
    PyTraceback,
    ScanResult,
)
from ncclwatch.diagnose.signtypes import Event
from ncclwatch.flightrec import FrAnalysis
from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.signatures import classify


@dataclass
class RankFacts:
    """What the logs say about one rank."""

    rank: int
    timeouts: list[Evidence] = field(default_factory=list)
    progress: list[Evidence] = field(default_factory=list)
    tracebacks: list[PyTraceback] = field(default_factory=list)
    oom: list[Evidence] = field(default_factory=list)
    network: list[Evidence] = field(default_factory=list)
    peer_closed: list[Evidence] = field(default_factory=list)
    checkpoint: list[Evidence] = field(default_factory=list)
    checkpoint_done: list[Evidence] = field(default_factory=list)
    aborted: list[Evidence] = field(default_factory=list)
    #: "Received a dump signal ... Last enqueued NCCL work: N": progress, not a wait.
    dump_signals: list[Evidence] = field(default_factory=list)
    #: Another rank's dump signal said this rank timed out ("... from rank N").
    signalled: list[Evidence] = field(default_factory=list)
    #: Its watchdog itself was stuck (the heartbeat monitor): blocked in NCCL/CUDA.
    heartbeat: list[Evidence] = field(default_factory=list)
    #: It was busy with work of its own (tokenizing a dataset) while others waited.
    busy: list[Evidence] = field(default_factory=list)
    #: A CUDA call failed under NCCL on its GPU.
    cuda_errors: list[Evidence] = field(default_factory=list)
    failure: FailureEntry | None = None

    def timeout_tracebacks(self) -> list[PyTraceback]:
        return [t for t in self.tracebacks if exception_kind(t) == "timeout"]

    def pending_dump(self) -> bool:
        """A dump signal that says this rank timed out itself or has work overdue."""
        for e in self.dump_signals:
            if "from_rank" not in e.fields and "observed" not in e.fields:
                return True  # "... from this local rank": its own watchdog timed out
            enq, done = e.fields.get("enqueued"), e.fields.get("completed")
            if enq is not None and done is not None and int(enq) > int(done):
                return True
        return False

    @property
    def waited(self) -> bool:
        """Timed out waiting for others (collateral), by any evidence."""
        return bool(self.timeouts or self.progress or self.aborted or self.heartbeat
                    or self.signalled or self.pending_dump() or self.timeout_tracebacks()
                    or any(blocked_op(t) for t in self.tracebacks))

    @property
    def reported(self) -> bool:
        """Left any evidence line of its own (a rank that never did is only a name)."""
        return bool(self.timeouts or self.progress or self.tracebacks or self.oom
                    or self.network or self.peer_closed or self.checkpoint or self.aborted
                    or self.dump_signals or self.heartbeat or self.busy or self.cuda_errors
                    or self.failure)

    def activity(self) -> tuple[RankState, CollectiveOp]:
        """What its last traceback's frames say it was doing."""
        for tb in reversed(self.tracebacks):
            if tb.frames:
                c = classify(tb.innermost_first())
                return c.state, c.op
        return RankState.UNKNOWN, CollectiveOp.NONE

    def checkpointing(self) -> Evidence | None:
        """Its last checkpoint line, when no 'saved' line followed it."""
        if not self.checkpoint:
            return None
        last = self.checkpoint[-1]
        done = [d for d in self.checkpoint_done if (d.file, d.line) > (last.file, last.line)]
        return None if done else last


def exception_kind(tb: PyTraceback) -> str:
    text = tb.exception
    if any(s in text for s in ("OutOfMemoryError", "out of memory", "MemoryError",
                               "can't allocate memory")):
        return "oom"
    if any(s in text for s in TEARDOWN_EXCEPTIONS):
        return "teardown"
    if any(s in text for s in PEER_EXCEPTIONS):
        return "peer"
    if any(s in text for s in ("unhandled cuda error", "ncclUnhandledCudaError")):
        return "error"  # the rank's GPU failed: a crash, not the network
    if any(s in text for s in NETWORK_EXCEPTIONS):
        return "network"
    if any(s in text for s in TIMEOUT_EXCEPTIONS):
        return "timeout"
    if text.startswith("(traceback"):
        return "truncated"
    return "error"


#: Frames of autograd's backward: a collective failing under them is DDP's (or
#: FSDP's) gradient reduction, which has no c10d frame on the Python stack.
_BACKWARD = frozenset({"backward", "_engine_run_backward", "run_backward"})


def blocked_op(tb: PyTraceback) -> str | None:
    """The collective a rank was in when its wait failed (timeout or lost peer)."""
    if exception_kind(tb) not in ("timeout", "peer"):
        return None
    c = classify(tb.innermost_first())
    if c.op is not CollectiveOp.NONE:
        return c.op.value
    if any(f.name.rpartition(".")[2] in _BACKWARD for f in tb.frames):
        return "gradient all_reduce in backward (DDP)"
    return None


class _ByLine:
    """Each file's evidence in line order, to look a few lines ahead by bisection:
    a scan of all evidence per line made big logs quadratic."""

    def __init__(self, evidence: Iterable[Evidence]) -> None:
        self._items: dict[str, list[Evidence]] = {}
        for e in evidence:
            self._items.setdefault(e.file, []).append(e)
        for items in self._items.values():
            items.sort(key=lambda e: e.line)
        self._lines = {f: [e.line for e in items] for f, items in self._items.items()}

    def between(self, file: str, lo: int, hi: int) -> list[Evidence]:
        """Evidence of ``file`` on lines lo..hi (inclusive), in line order."""
        lines = self._lines.get(file)
        if not lines:
            return []
        i, j = bisect.bisect_left(lines, lo), bisect.bisect_right(lines, hi)
        return self._items[file][i:j]


@dataclass
class Facts:
    scan: ScanResult
    ranks: dict[int, RankFacts]
    world: list[int]
    #: The Flight Recorder analysis when dumps were given.
    fr: FrAnalysis | None = None
    unattributed: list[Evidence] = field(default_factory=list)
    by_line: _ByLine = field(default_factory=lambda: _ByLine(()))
    #: Whether the world size comes from the job itself (a world size line, torchrun's
    #: worker accounting, the Flight Recorder) rather than from the highest rank seen.
    world_known: bool = False
    #: Ranks given to rank-less lines by inference, and how ("from GPU index 2").
    inferred: dict[int, str] = field(default_factory=dict)

    def unattributed_checkpointing(self) -> Evidence | None:
        """The last checkpoint line without a rank prefix, if no 'saved' line followed."""
        rf = RankFacts(-1, checkpoint=[e for e in self.unattributed
                                       if e.event is Event.CHECKPOINT],
                       checkpoint_done=[e for e in self.unattributed
                                        if e.event is Event.CHECKPOINT_DONE])
        return rf.checkpointing()

    def rank(self, r: int) -> RankFacts:
        if r not in self.ranks:
            self.ranks[r] = RankFacts(r)
        return self.ranks[r]

    @property
    def waiting(self) -> list[int]:
        """Ranks that waited for others: by their logs, or by the Flight Recorder."""
        fr_waiting = set(self.fr.waiting_ranks()) if self.fr is not None else set()
        return sorted({r for r, f in self.ranks.items() if f.waited} | fr_waiting)

    def all_evidence(self, event: Event) -> list[Evidence]:
        out = [e for e in self.scan.evidence if e.event is event]
        return sorted(out, key=time_order)


def time_order(e: Evidence | PyTraceback) -> tuple:
    """Time order where lines have times, else file order (timeless sort last)."""
    return (e.ts is None, e.ts or 0.0, e.file, e.line)


#: Events that are a rank waiting or being taken down: never the rank of an unprefixed
#: traceback printed just before them (that traceback is usually another rank's).
_WAIT_EVENTS = frozenset({Event.TIMEOUT, Event.PROGRESS, Event.WATCHDOG_ABORT, Event.DUMP_SIGNAL,
                          Event.HEARTBEAT, Event.FR_DUMP, Event.TEARDOWN, Event.EXIT})


def _rank_after(by_line: _ByLine, tb: PyTraceback, within: int = 3) -> int | None:
    """An unprefixed traceback (ranks share the launcher's stderr) belongs to the rank
    whose own log line follows it, e.g. a trainer's "[rank 1] error: RuntimeError"."""
    for e in by_line.between(tb.file, tb.end_line, tb.end_line + within):
        if e.rank is not None and e.event not in _WAIT_EVENTS:
            return e.rank
    return None


def _pg_local(by_line: _ByLine, e: Evidence, within: int = 3) -> bool:
    """torch <2.6 prints "[Rank 2] Watchdog caught ..." and then "[PG 3 Rank 2] Timeout at
    NCCL work ...": the untagged line's rank is local to the group the next line names."""
    for o in by_line.between(e.file, e.line + 1, e.line + within):
        if o.pg_rank == e.pg_rank and o.pg is not None:
            return o.pg not in DEFAULT_PG
    return False


def _tb_rank_near(scan: ScanResult, e: Evidence, within: int = 20) -> int | None:
    """The rank of a prefixed traceback starting just after an NCCL line (same process)."""
    for tb in scan.tracebacks:
        if tb.file == e.file and e.line < tb.line <= e.line + within and tb.rank is not None:
            return tb.rank
    return None


def gather_facts(scan: ScanResult, fr: FrAnalysis | None = None) -> Facts:
    f = Facts(scan, {}, [], fr, by_line=_ByLine(scan.evidence))
    slots = {Event.TIMEOUT: "timeouts", Event.PROGRESS: "progress", Event.OOM: "oom",
             Event.NETWORK: "network", Event.PEER_CLOSED: "peer_closed",
             Event.CHECKPOINT: "checkpoint", Event.CHECKPOINT_DONE: "checkpoint_done",
             Event.WATCHDOG_ABORT: "aborted", Event.DUMP_SIGNAL: "dump_signals",
             Event.HEARTBEAT: "heartbeat", Event.BUSY: "busy", Event.CUDA_ERROR: "cuda_errors"}
    for e in scan.evidence:
        if e.rank_from == "message" and e.pg is None and _pg_local(f.by_line, e):
            e.rank, e.rank_from = None, None
        if e.rank is None and e.event in (Event.OOM, Event.CUDA_ERROR):
            _infer_rank(f, e)
        slot = slots.get(e.event)
        if slot is None:
            continue
        if e.event is Event.DUMP_SIGNAL and e.fields.get("from_rank"):
            # "... due to a collective timeout from rank 6": rank 6 timed out.
            f.rank(int(e.fields["from_rank"])).signalled.append(e)
        if e.rank is None:
            f.unattributed.append(e)
            continue
        getattr(f.rank(e.rank), slot).append(e)
    for tb in scan.tracebacks:
        rank = tb.rank if tb.rank is not None else _rank_after(f.by_line, tb)
        if rank is not None:
            tb.rank = rank
            f.rank(rank).tracebacks.append(tb)
    for fe in scan.failures:
        if fe.rank is not None:
            rf = f.rank(fe.rank)
            if rf.failure is None or fe.root:
                rf.failure = fe
    world = set(scan.ranks_seen) | set(f.ranks)
    # torchrun names the failed workers and stops the others by pid: on one node
    # that counts the world when nothing else does.
    stopped = {e.fields["pid"] for e in scan.evidence if e.event is Event.TEARDOWN}
    # (A Slurm task's line is no worker of a node's launcher: not counted here.)
    exits = [e for e in scan.evidence if e.event is Event.EXIT
             and "task" not in e.fields and "tasks" not in e.fields]
    failed = {str(fe.pid) for fe in scan.failures if fe.pid is not None} | {
        e.fields.get("pid", f"exit{i}") for i, e in enumerate(exits)}
    if stopped:
        world |= set(range(len(failed | stopped)))
    # The deepspeed launcher's exit line shows the last worker it spawned on a node,
    # local rank N: a node ran N + 1 workers, so ranks 0..N exist.
    world |= {r for e in exits if e.fields.get("last_local_rank")
              for r in range(int(e.fields["last_local_rank"]) + 1)}
    # A failure "rank 12 (local_rank: 4)" puts node base 8; with 8 workers per node
    # (the highest local rank anywhere + 1) that node holds ranks 8-15.
    per_node = 1 + max([fe.local_rank for fe in scan.failures if fe.local_rank is not None]
                       + [int(e.fields["local_rank"]) for e in exits
                          if e.fields.get("local_rank")], default=-1)
    for fe in scan.failures:
        if fe.rank is not None and fe.local_rank is not None and fe.rank >= fe.local_rank:
            base = fe.rank - fe.local_rank
            world |= set(range(base, base + per_node))
    if world:
        # Ranks are numbered from 0: seeing rank 7 means ranks 0-6 exist too.
        world |= set(range(max(world) + 1))
    if scan.world_sizes:
        world |= set(range(max(scan.world_sizes)))
    if fr is not None:
        world |= {int(r) for r in fr.progress}
        for stuck in fr.stuck:
            world |= set(stuck.waiting_ranks) | set(stuck.missing_ranks)
    f.world = sorted(world)
    f.world_known = bool(scan.world_sizes or stopped or scan.failures or fr is not None)
    if scan.world_sizes and world and max(world) >= max(scan.world_sizes):
        f.world_known = False  # a rank above the world size printed: a group's size
    return f


def _infer_rank(f: Facts, e: Evidence) -> None:
    """A rank for an OOM or CUDA error line that names none: the prefixed traceback of
    the same process right after it, else the GPU index (one process per GPU, one node:
    an assumption the verdict states)."""
    rank = _tb_rank_near(f.scan, e) if e.fields.get("pid") else None
    if rank is not None:
        e.rank = rank
        return
    dev = e.fields.get("device")
    if dev is not None:
        e.rank = int(dev)
        f.inferred[e.rank] = (f"rank {e.rank} is inferred from GPU index {dev} ({e.where}): "
                              "the line names no rank; one process per GPU on one node assumed")


def inferred_notes(facts: Facts, ranks: Iterable[int]) -> list[str]:
    return [facts.inferred[r] for r in ranks if r in facts.inferred]
