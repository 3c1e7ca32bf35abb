"""From evidence to a verdict: what failed, which rank started it, which only waited.

The NCCL watchdog makes every rank report a timeout, and torchrun names the
first rank that exited as the "root cause": in a checkpoint stall both point
at ranks that were only waiting. The rules here invert that: a rank that
timed out waiting is collateral; the initiating rank is the one the waiting
ranks waited for (the Flight Recorder's missing ranks, the watchdog's "last
enqueued work" numbers, monitored_barrier's list, or simply the rank that did
not time out), and what it was doing (its traceback's frames, classified
with the same signature table as live stacks; its checkpoint log lines)
names the failure class. The classes are a table, first match wins.
"""

from __future__ import annotations

import bisect
import re
import signal
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from ncclwatch.diagnose.logscan import DEFAULT_PG, Evidence, FailureEntry, PyTraceback, ScanResult
from ncclwatch.diagnose.logsigns import (NETWORK_EXCEPTIONS, NETWORK_FAILURES, PEER_EXCEPTIONS,
                                         SIGNAL_MEANING, SIGNS, TEARDOWN_EXCEPTIONS,
                                         TIMEOUT_EXCEPTIONS, Event)
from ncclwatch.flightrec import FrAnalysis
from ncclwatch.model import CHECKPOINT_STATES, CollectiveOp, RankState, rank_ranges
from ncclwatch.remediation import ALL_BY_ID, RootCause
from ncclwatch.signatures import classify


@dataclass(frozen=True)
class FailureClass:
    id: str
    title: str


CLASSES: tuple[FailureClass, ...] = (
    FailureClass("gather_oom", "Out of memory while gathering or saving the checkpoint"),
    FailureClass("desync", "Ranks ran different collectives (desync)"),
    FailureClass("network_error", "Network / NCCL transport error"),
    FailureClass("rank_crash", "A rank crashed"),
    FailureClass("checkpoint_gather_timeout",
                 "Checkpoint gather/save outlasted the process-group timeout"),
    FailureClass("collective_hang", "A rank never joined a collective (hang)"),
    FailureClass("none", "No failure found"),
    FailureClass("unknown", "Failure evidence without a recognised pattern"),
)
CLASS_BY_ID = {c.id: c for c in CLASSES}
SIGN_BY_ID = {s.id: s for s in SIGNS}

#: NCCL's OpType names -> the c10d op (a barrier is an all-reduce of one element).
_OPTYPE = {"ALLREDUCE": "all_reduce", "BROADCAST": "broadcast", "ALLGATHER": "all_gather",
           "_ALLGATHER_BASE": "all_gather", "REDUCE_SCATTER": "reduce_scatter",
           "_REDUCE_SCATTER_BASE": "reduce_scatter", "GATHER": "gather", "SCATTER": "scatter",
           "REDUCE": "reduce", "ALLTOALL": "all_to_all", "ALLTOALL_BASE": "all_to_all",
           "SEND": "send", "RECV": "recv", "RECVANYSOURCE": "recv", "BARRIER": "barrier",
           "COALESCED": "coalesced"}


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
        return sorted(out, key=_order)


def _order(e: Evidence | PyTraceback) -> tuple:
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
    exits = [e for e in scan.evidence if e.event is Event.EXIT]
    failed = {str(fe.pid) for fe in scan.failures if fe.pid is not None} | {
        e.fields.get("pid", f"exit{i}") for i, e in enumerate(exits)}
    if stopped:
        world |= set(range(len(failed | stopped)))
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


@dataclass
class Finding:
    cls: str
    initiating: list[int]
    collateral: list[int]
    root_cause: str
    summary: str
    evidence: list[tuple[str, str]] = field(default_factory=list)  # (where, why)
    notes: list[str] = field(default_factory=list)
    #: Where the initiator is not known: the ranks it must be among (those the
    #: evidence leaves, usually the ones that never reported).
    candidates: list[int] = field(default_factory=list)
    #: What evidence the verdict lacked, and what to collect next time.
    missing: list[str] = field(default_factory=list)
    collect: list[str] = field(default_factory=list)


Rule = Callable[[Facts], "Finding | None"]


# -- helpers -------------------------------------------------------------------------------

def who(ranks: Sequence[int], one: str = "", many: str = "") -> str:
    """'rank 0 was' / 'ranks 1-3 were' (verb optional)."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}" + (f" {one}" if one else "")
    return f"ranks {rank_ranges(ranks)}" + (f" {many}" if many else "")


def _op_of(e: Evidence) -> str:
    op = e.fields.get("op")
    if op:
        if op == "ALLREDUCE" and e.fields.get("numel_in") == "1":
            return "barrier or all_reduce of one element"
        return _OPTYPE.get(op, op.lower())
    return ""


def timeout_seconds(facts: Facts) -> float | None:
    """The process-group timeout: the Flight Recorder's, else the watchdog's, else
    monitored_barrier's."""
    fr = facts.fr
    if fr is not None and fr.timeout_ms:
        return fr.timeout_ms / 1000.0
    for rf in facts.ranks.values():
        for e in rf.timeouts:
            if e.fields.get("timeout_ms"):
                return int(e.fields["timeout_ms"]) / 1000.0
    for e in facts.all_evidence(Event.MISSING_RANKS):
        if e.fields.get("timeout_ms"):
            return int(e.fields["timeout_ms"]) / 1000.0
    return None


def _waited_op(facts: Facts, ranks: Iterable[int]) -> str:
    ops: Counter[str] = Counter()
    for r in ranks:
        rf = facts.ranks.get(r)
        if rf is None:
            continue
        for e in rf.timeouts:
            if _op_of(e):
                ops[_op_of(e)] += 1
        state, op = rf.activity()
        if op is not CollectiveOp.NONE and rf.timeout_tracebacks():
            ops[op.value] += 1
    if not ops:
        if facts.fr is not None and facts.fr.stuck:
            return facts.fr.stuck[0].op
        return "a collective"
    return ops.most_common(1)[0][0]


def _first_where(rf: RankFacts) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if rf.timeouts:
        out.append((rf.timeouts[0].where, f"rank {rf.rank} timed out waiting: "
                    + rf.timeouts[0].text[:200]))
    elif rf.progress:
        out.append((rf.progress[0].where, f"rank {rf.rank}: " + rf.progress[0].text[:200]))
    elif rf.timeout_tracebacks():
        tb = rf.timeout_tracebacks()[0]
        out.append((tb.where, f"rank {rf.rank} timed out waiting: {tb.exception[:200]}"))
    elif rf.dump_signals:
        out.append((rf.dump_signals[0].where, f"rank {rf.rank}: "
                    + rf.dump_signals[0].text[:200]))
    elif rf.signalled:
        e = rf.signalled[0]
        out.append((e.where, f"rank {rf.rank} timed out (another rank's dump signal says so): "
                    + e.text[:160]))
    elif rf.heartbeat:
        out.append((rf.heartbeat[0].where, f"rank {rf.rank}'s watchdog was stuck: "
                    + rf.heartbeat[0].text[:160]))
    return out


def _missing(facts: Facts) -> tuple[list[int], list[tuple[str, str]], str, list[int]]:
    """The ranks the waiting ranks waited for, the evidence, how it was found, and
    (when the evidence names nobody) the ranks the initiator must be among."""
    fr = facts.fr
    if fr is not None:
        missing = fr.missing_ranks()
        if missing:
            st = fr.stuck[0] if fr.stuck else None
            why = (f"Flight Recorder: rank(s) {rank_ranges(missing)} never started "
                   f"{st.op} #{st.seq} of process group {st.pg_name or st.pg_id}"
                   if st else "Flight Recorder: missing ranks")
            return missing, [(_fr_where(facts), why)], "flight_recorder", []
        lag = _fr_lagging(fr)
        if lag:
            pg, top, ranks = lag
            return ranks, [(_fr_where(facts),
                            f"Flight Recorder: {who(ranks)} last enqueued collective "
                            f"#{top - 1} or earlier of process group {pg}, the others #{top}")], \
                "flight_recorder", []
    named: set[int] = set()
    ev: list[tuple[str, str]] = []
    for e in facts.all_evidence(Event.MISSING_RANKS):
        ranks = [int(x) for x in re.findall(r"\d+", e.fields.get("missing", ""))]
        if ranks:
            named.update(ranks)
            ev.append((e.where, e.text[:240]))
    if named:
        return sorted(named), ev, "missing_ranks_message", []
    # The watchdog's numbers: the failing work's seq vs each rank's last enqueued.
    seqs: dict[int, int] = {}
    enq: dict[int, tuple[int, Evidence]] = {}
    for r, rf in facts.ranks.items():
        for e in rf.progress + rf.timeouts + rf.dump_signals:
            if e.fields.get("seq"):
                seqs[r] = max(seqs.get(r, -1), int(e.fields["seq"]))
            if e.fields.get("enqueued") and (r not in enq or e.event is not Event.DUMP_SIGNAL):
                enq[r] = (int(e.fields["enqueued"]), e)
    if seqs and enq:
        top = max(seqs.values())
        lag = sorted(r for r, (n, _e) in enq.items() if n < top)
        if lag:
            ev = [(enq[r][1].where, f"rank {r} last enqueued work {enq[r][0]}, the others "
                   f"timed out in work {top}") for r in lag]
            return lag, ev, "watchdog_progress", []
    waiting = set(facts.waiting)
    if not waiting:
        return [], [], "", []
    busy = _busy(facts, waiting)
    if busy:
        ev = [(e.where, f"rank {r} was busy: {e.text[:160]}") for r, e in busy.items()]
        return sorted(busy), ev, "busy", []
    alive = _alive_not_waiting(facts, waiting)
    if alive:
        return sorted(alive), [(w, y) for w, y in alive.values()], "did_not_time_out", []
    silent = [r for r in facts.world if r not in waiting]
    if len(silent) == 1 and facts.world_known:
        return silent, [], "only_rank_not_waiting", []
    return [], [], "never_reported", silent


def _pg_key(e: Evidence) -> str:
    """The process group of a line, the default group's names made one."""
    return "default" if e.pg is None or e.pg in DEFAULT_PG else e.pg


def _busy(facts: Facts, waiting: set[int]) -> dict[int, Evidence]:
    """Ranks busy with work of their own (tokenizing) while others waited; a busy line
    without a rank is the main process's (rank 0: it alone prints progress bars)."""
    first_wait: dict[str, int] = {}
    for r in waiting:
        for e in facts.ranks[r].timeouts if r in facts.ranks else []:
            first_wait[e.file] = min(first_wait.get(e.file, e.line), e.line)

    def recent(e: Evidence) -> bool:
        # Still busy when the others gave up: a progress bar of hours before is not.
        return e.file not in first_wait or first_wait[e.file] - e.line <= BUSY_REACH

    out = {r: rf.busy[-1] for r, rf in facts.ranks.items()
           if rf.busy and r not in waiting and recent(rf.busy[-1])}
    if not out and 0 not in waiting:
        lines = [e for e in facts.unattributed if e.event is Event.BUSY and recent(e)]
        if lines:
            out[0] = lines[-1]
    return out


#: How many lines before the first timeout a busy line may be and still count.
BUSY_REACH = 200


def _alive_not_waiting(facts: Facts, waiting: set[int]) -> dict[int, tuple[str, str]]:
    """Ranks that reported something and did not wait: a traceback of their own, a
    checkpoint, or a dump signal with nothing overdue in the group the others waited in."""
    pending_pgs = {_pg_key(e) for r in waiting
                   for e in facts.ranks.get(r, RankFacts(r)).dump_signals}
    out: dict[int, tuple[str, str]] = {}
    main = facts.unattributed_checkpointing()
    if 0 not in waiting and main is not None:
        out[0] = (main.where, "the main process (rank 0: trainers log from it alone) did not "
                  f"time out; it was checkpointing: {main.text[:120]}")
    for r, rf in facts.ranks.items():
        if r in waiting or r in out or not rf.reported:
            continue
        if rf.tracebacks:
            tb = rf.tracebacks[-1]
            out[r] = (tb.where, f"rank {r} did not time out; its last traceback ends in "
                      f"{tb.exception[:120]}")
        elif rf.checkpoint or (rf.failure is not None and _sig_of(rf) != "SIGABRT"):
            # (SIGABRT is the watchdog taking a waiting rank down: no sign of life.)
            e = rf.checkpoint[-1] if rf.checkpoint else None
            out[r] = (e.where, f"rank {r} did not time out: {e.text[:120]}") if e else \
                (rf.failure.where, f"rank {r} did not time out (torchrun: exitcode "
                 f"{rf.failure.exitcode})")  # type: ignore[union-attr]
        elif rf.dump_signals and any(_pg_key(e) in pending_pgs for e in rf.dump_signals):
            e = rf.dump_signals[-1]
            out[r] = (e.where, f"rank {r} had nothing overdue when the others timed out: "
                      f"{e.text[:120]}")
    return out


def _fr_where(facts: Facts) -> str:
    """Where the Flight Recorder evidence is: the dumps, as one glob."""
    paths = facts.scan.fr_dumps
    if not paths:
        return "flight recorder summaries"
    stem = re.sub(r"\d+$", "", paths[0])
    return f"{stem}*" if len(paths) > 1 else paths[0]


def _fr_lagging(fr: FrAnalysis) -> tuple[str, int, list[int]] | None:
    """Ranks whose last enqueued collective lags the rest of their group. gloo marks a
    timed-out collective completed, so a dump taken after the timeout shows no stuck
    collective; the sequence ids still show who never enqueued it."""
    by_pg: dict[str, dict[int, int]] = {}
    for r, pgs in fr.progress.items():
        for p in pgs:
            by_pg.setdefault(p.pg_desc or p.pg_name, {})[int(r)] = p.last_enqueued
    for pg, enq in sorted(by_pg.items()):
        if len(enq) < 2:
            continue
        top = max(enq.values())
        lag = sorted(r for r, n in enq.items() if n < top)
        if lag and len(lag) < len(enq):
            return pg, top, lag
    return None


def _sig_of(rf: RankFacts) -> str:
    fe = rf.failure
    if fe is None:
        return ""
    if fe.signame:
        return fe.signame
    if fe.exitcode is not None and fe.exitcode < 0:
        try:
            return signal.Signals(-fe.exitcode).name
        except ValueError:
            return ""
    return ""


def _oom_killed(facts: Facts, rf: RankFacts) -> Evidence | None:
    fe = rf.failure
    if fe is None or fe.pid is None:
        return None
    for e in facts.unattributed + rf.oom:
        if e.sign == "oom_killer" and e.fields.get("pid") == str(fe.pid):
            return e
    return None


# -- rules (first match wins) -------------------------------------------------------------

#: Text of an OOM line that puts it inside a state-dict gather (FSDP's clone() warnings).
_GATHER_OOM_TEXT = ("state_dict entry", "Failed to clone() tensor")


def _ckpt_open_before(facts: Facts, e: Evidence | PyTraceback) -> Evidence | None:
    """A job-level checkpoint line (any rank, or the main process) before ``e`` in the
    same file with no 'saved' line between: the OOM happened inside that save."""
    opened = [c for c in facts.scan.evidence if c.event is Event.CHECKPOINT
              and c.file == e.file and c.line <= e.line]
    if not opened:
        return None
    last = opened[-1]
    done = [d for d in facts.scan.evidence if d.event is Event.CHECKPOINT_DONE
            and d.file == e.file and last.line < d.line <= e.line]
    return None if done else last


def rule_gather_oom(facts: Facts) -> Finding | None:
    hits: list[int] = []
    ev: list[tuple[str, str]] = []
    for r, rf in sorted(facts.ranks.items()):
        oom = list(rf.oom)
        killed = _oom_killed(facts, rf)
        if killed is not None:
            oom.append(killed)
        oom_tbs = [t for t in rf.tracebacks if exception_kind(t) == "oom"]
        if not oom and not oom_tbs:
            continue
        state, _op = rf.activity()
        ckpt = rf.checkpointing()
        if ckpt is None and r == 0:
            ckpt = facts.unattributed_checkpointing()
        if ckpt is None:
            ckpt = next((c for c in (_ckpt_open_before(facts, x) for x in oom + oom_tbs) if c), None)
        during = state in CHECKPOINT_STATES or ckpt is not None
        for t in oom_tbs:
            during = during or classify(t.innermost_first()).state in CHECKPOINT_STATES
        clone = [e for e in oom if any(m in e.text for m in _GATHER_OOM_TEXT)]
        if not during and not clone:
            continue  # an OOM elsewhere is rule_crash's
        hits.append(r)
        first = clone[0] if clone else (oom[0] if oom else None)
        where = first.where if first is not None else oom_tbs[0].where
        text = first.text if first is not None else oom_tbs[0].exception
        ev.append((where, f"rank {r} out of memory: {text[:200]}"))
        if clone:
            ev.append((clone[0].where, f"rank {r} was gathering the state dict (FSDP's "
                       "clone() of a full-state-dict entry failed)"))
        elif ckpt is not None:
            ev.append((ckpt.where, f"rank {r} was checkpointing: {ckpt.text[:160]}"))
        elif oom_tbs:
            ev.append((oom_tbs[0].where, f"rank {r}'s traceback is in "
                       f"{classify(oom_tbs[0].innermost_first()).state.value}"))
    if not hits:
        return None
    collateral = [r for r in facts.world if r not in hits]
    return Finding("gather_oom", hits, collateral, "gather_out_of_memory",
                   f"{who(hits)} ran out of memory while gathering or saving "
                   f"the checkpoint; the other ranks only waited for them.", ev,
                   _inferred_notes(facts, hits))


def _inferred_notes(facts: Facts, ranks: Iterable[int]) -> list[str]:
    return [facts.inferred[r] for r in ranks if r in facts.inferred]


def _fingerprint_ops(facts: Facts) -> tuple[dict[int, str], list[int], list[tuple[str, str]]]:
    """Each rank's collective from c10d's mismatch lines (rank -> op and shape), the ranks
    named where the other side is cut off or NCCL names only a neighbourhood, evidence."""
    ops: dict[int, str] = {}
    named: list[int] = []
    ev: list[tuple[str, str]] = []
    for e in facts.all_evidence(Event.MISMATCH)[:8]:
        ev.append((e.where, e.text[:300]))
        if e.fields.get("around"):
            named.append(int(e.fields["around"]))
        for rk, fp in (("rank", "mine"), ("other", "theirs")):
            if e.fields.get(rk) is None:
                continue
            r = int(e.fields[rk])
            named.append(r)
            if e.fields.get(fp):
                ops[r] = _fingerprint(e.fields[fp])
    return ops, sorted(set(named)), ev


def _fingerprint(fp: str) -> str:
    """What of a CollectiveFingerPrint must agree across ranks: sequence, op, shapes."""
    parts = [f"{k}={m.group(1)}" for k, rx in (("SequenceNumber", r"\d+"), ("OpType", r"\w+"),
                                                ("TensorShape", r"\[[^\]]*\]"))
             if (m := re.search(k + "=(" + rx + ")", fp))]
    return ", ".join(parts) if parts else fp.strip(" .")


def _timeout_divergence(facts: Facts) -> tuple[dict[int, str], list[tuple[str, str]]]:
    """Waiting ranks of one process group that timed out in different work: the same
    SeqNum with a different op or size, or different SeqNums (one rank issued a
    collective the others did not, so NCCL paired different calls)."""
    by_pg: dict[str, dict[int, Evidence]] = {}
    guessed: dict[int, set[str]] = {}  # untagged timeouts put in the default group
    for r, rf in facts.ranks.items():
        for e in rf.timeouts:
            if e.fields.get("seq") is None or "op" not in e.fields:
                continue
            pg = _pg_key(e) if e.pg is not None else _seq_pg(facts, rf, e)
            if pg == "default" and e.pg is None:
                guessed.setdefault(r, set()).add(e.fields["seq"])
            by_pg.setdefault(pg, {}).setdefault(r, e)
    if any(len(seqs) > 1 for seqs in guessed.values()):
        by_pg.pop("default", None)  # untagged lines of several groups: not comparable
    for pg, first in sorted(by_pg.items()):
        if len(first) < 2:
            continue
        keys = {r: (int(e.fields["seq"]), e.fields["op"], e.fields.get("numel_in"))
                for r, e in first.items()}
        if len(set(keys.values())) < 2:
            continue
        desc = {r: f"#{k[0]} {k[1]}" + (f" NumelIn={k[2]}" if k[2] else "")
                for r, k in keys.items()}
        ev = [(first[r].where, f"rank {r} timed out in {d}") for r, d in sorted(desc.items())]
        return desc, ev
    return {}, []


def _seq_pg(facts: Facts, rf: RankFacts, e: Evidence) -> str:
    """The group of an untagged timeout line: that of the rank's progress line with the
    same work number (torch prints them together), else the default group."""
    for p in rf.progress:
        if p.fields.get("seq") == e.fields.get("seq") and p.pg is not None:
            return _pg_key(p)
    return "default"


def rule_desync(facts: Facts) -> Finding | None:
    ops, named, ev = _fingerprint_ops(facts)
    how = "c10d's collective fingerprints (TORCH_DISTRIBUTED_DEBUG=DETAIL)"
    fr = facts.fr
    if not ops and fr is not None and fr.mismatches:
        mm = fr.mismatches[0]
        ops = {int(r): f"{v[0]} {[list(x) for x in v[1]]}" for r, v in mm.ops.items()}
        ev.append((_fr_where(facts), f"collective #{mm.seq} of process group "
                   f"{mm.pg_name or mm.pg_id}: " + ", ".join(f"rank {r} {o}"
                                                         for r, o in sorted(ops.items()))))
        how = "the Flight Recorder"
    if not ops and not named:
        ops, tev = _timeout_divergence(facts)
        ev += tev
        how = "the watchdog's timed-out work of each rank"
        if not ops and not _crashes(facts):
            # Where each rank's collective failed (timed out, or its peer went away).
            waited = {}
            for r, rf in facts.ranks.items():
                for tb in reversed(rf.tracebacks):
                    op = blocked_op(tb)
                    if op:
                        waited[r] = op
                        ev.append((tb.where, f"rank {r} failed waiting in {op}: "
                                   f"{tb.exception[:120]}"))
                        break
            if len(set(waited.values())) > 1 and len(waited) >= 2:
                ops = waited
                how = "each rank's traceback"
    if len(set(ops.values())) < 2:
        if not named:
            return None
        # One side of the comparison only (the paste cut it), or NCCL's neighbourhood.
        return Finding("desync", [], [], "collective_order_mismatch",
                       f"ranks ran different collectives; the log names {who(named)} in the "
                       "comparison but not both sides of it, so which rank left the common "
                       f"order is not in it: the initiator is among {who(named)}.", ev,
                       candidates=named,
                       missing=["the other side of the mismatch (the full DETAIL line, or the "
                                "logs of every rank)"],
                       collect=["every rank's log with TORCH_DISTRIBUTED_DEBUG=DETAIL",
                                "Flight Recorder dumps (TORCH_NCCL_TRACE_BUFFER_SIZE=2000, "
                                "TORCH_NCCL_DUMP_ON_TIMEOUT=1)"])
    count = Counter(ops.values())
    desc = ", ".join(f"rank {r} {o}" for r, o in sorted(ops.items()))
    top, n = count.most_common(1)[0]
    if len(ops) == 2 or n * 2 <= len(ops) and 0 not in ops:
        # Two ranks (or no majority and no rank 0 to compare with): either may be the odd one.
        among = sorted(ops)
        return Finding("desync", [], [r for r in facts.waiting if r not in among],
                       "collective_order_mismatch",
                       f"ranks issued different collectives ({desc}), by {how}; with no "
                       f"majority the odd one is among {who(among)}.", ev, candidates=among,
                       missing=["a third rank's view of the same collective, to tell which "
                                "side left the common order"],
                       collect=["every rank's log with TORCH_DISTRIBUTED_DEBUG=DETAIL",
                                "Flight Recorder dumps of all ranks (TORCH_NCCL_DUMP_ON_TIMEOUT=1)"])
    odd = sorted(r for r, o in ops.items() if o != top)
    if n * 2 <= len(ops):
        # No majority: the ranks that differ from rank 0, as c10d compares with rank 0.
        ref = ops[0]
        odd = sorted(r for r, o in ops.items() if o != ref)
    collateral = [r for r in facts.world if r not in odd]
    return Finding("desync", odd, collateral, "collective_order_mismatch",
                   f"ranks issued different collectives ({desc}), by {how}; {who(odd)} "
                   f"left the common order.", ev)


def _job_failed(facts: Facts) -> bool:
    """Anything that says the job did not just finish (warnings alone do not)."""
    return bool(facts.scan.failures or any(
        e.event in (Event.EXIT, Event.TIMEOUT, Event.WATCHDOG_ABORT, Event.MISSING_RANKS,
                    Event.HEARTBEAT)
        or e.sign in ("nccl_error", "nccl_cuda_error")
        or (e.event is Event.NETWORK and any(t in e.text for t in NETWORK_FAILURES))
        for e in facts.scan.evidence)
        or any(exception_kind(t) not in ("teardown", "truncated") for t in facts.scan.tracebacks))


def _context_rank(facts: Facts, e: Evidence, within: int = 40) -> int | None:
    """An NCCL line has no rank prefix (NCCL prints host:pid:tid): take the rank of
    the next rank-prefixed evidence of the same node (srun task) a few lines on,
    which is the same process's watchdog reporting what NCCL said."""
    for o in facts.by_line.between(e.file, e.line + 1, e.line + within):
        if o.rank is not None and o.task == e.task:
            return o.rank
    return None


def rule_network(facts: Facts) -> Finding | None:
    if not _job_failed(facts) or _crashes(facts) or any(rf.oom for rf in facts.ranks.values()):
        return None  # warnings of a job that went on; or a rank died and its peers' errors follow
    items: list[tuple[bool, tuple, int | None, str, str]] = []  # (remote, order, rank, where, text)
    for e in facts.scan.evidence:
        if e.event is not Event.NETWORK:
            continue
        rank = e.rank if e.rank is not None else _context_rank(facts, e)
        remote = "ncclRemoteError" in e.text or "remote process" in e.text
        items.append((remote, _order(e), rank, e.where, e.text))
    for r, rf in facts.ranks.items():
        for tb in rf.tracebacks:
            if exception_kind(tb) == "network":
                items.append((False, _order(tb), r, tb.where, tb.exception))
    peers = [(r, tb) for r, rf in facts.ranks.items() for tb in rf.tracebacks
             if exception_kind(tb) == "peer"]
    if not items:
        # gloo: every failing rank lost a peer, nobody timed out, nobody crashed: the
        # connections broke under live processes. gloo names only ip:port, not the rank.
        if peers and not any(rf.timeouts or rf.timeout_tracebacks()
                             for rf in facts.ranks.values()):
            ev = [(tb.where, f"rank {r}: {tb.exception[:200]}") for r, tb in peers[:4]]
            reporting = sorted({r for r, _tb in peers})
            return Finding("network_error", reporting, [], "nccl_network_error",
                           f"{who(reporting)} lost connections to peers that did not "
                           "crash; gloo's messages name only ip:port, so which link failed "
                           "is not in the logs: every reporting rank counts as initiating.",
                           ev)
        return None
    items.sort(key=lambda x: (x[0],) + x[1])
    lead = items[0]
    first_timeout = min((_order(e) for rf in facts.ranks.values() for e in rf.timeouts),
                        default=None)
    if first_timeout is not None and first_timeout[0] is False and lead[1][0] is False \
            and first_timeout[1] < lead[1][1]:
        return None  # the errors are the watchdog's teardown of a hang
    initiating = sorted({it[2] for it in items if it[2] is not None and it[0] == lead[0]
                         and (it[1][0] or lead[1][0] or it[1][1] - lead[1][1] < 5.0)})
    ev = [(it[3], it[4][:240]) for it in items[:4]]
    collateral = [r for r in facts.world if r not in initiating]
    if not initiating:
        return Finding("network_error", [], collateral, "nccl_network_error",
                       "a transport error ended the job, but no line of it names a rank "
                       f"(NCCL prints host:pid:tid): {lead[4][:160]}", ev,
                       missing=["which rank the failing process was"],
                       collect=["every rank's log with its rank prefix (torchrun --tee 3 or "
                                "--log-dir; srun --label)", "NCCL_DEBUG=INFO with "
                                "NCCL_DEBUG_SUBSYS=INIT,NET (maps host:pid and devices to ranks)"])
    return Finding("network_error", initiating, collateral, "nccl_network_error",
                   f"the first transport error came from "
                   f"{who(initiating)}: {lead[4][:160]}", ev)


def _crashes(facts: Facts) -> list[tuple[tuple, int, str, str]]:
    """(order, rank, where, why) of ranks that failed on their own (not by waiting)."""
    out = []
    watchdog = any(rf.aborted or rf.timeouts for rf in facts.ranks.values())
    for r, rf in facts.ranks.items():
        if rf.cuda_errors:
            e = rf.cuda_errors[0]
            out.append((_order(e), r, e.where, f"rank {r}'s GPU failed under NCCL: {e.text[:200]}"))
            continue
        for tb in rf.tracebacks:
            if exception_kind(tb) != "error":
                continue
            out.append((_order(tb), r, tb.where, f"rank {r} raised {tb.exception[:200]}"))
            break
        else:
            sig = _sig_of(rf)
            meaning = SIGNAL_MEANING.get(sig, "")
            if meaning in ("crashed", "killed") or (meaning == "aborted" and not watchdog
                                                   and not rf.waited):
                if sig == "SIGKILL" and _oom_killed(facts, rf) is not None:
                    continue
                fe = rf.failure
                assert fe is not None
                out.append(((True, 0.0, fe.file, fe.line), r, fe.where,
                            f"rank {r} exited with {sig} (exitcode {fe.exitcode}, pid {fe.pid})"))
    if not facts.scan.failures:
        # torchrun's "failed (exitcode: -9) local_rank: 0 (pid: N)" without the summary.
        for e in facts.all_evidence(Event.EXIT):
            code, lr = int(e.fields["exitcode"]), e.fields.get("local_rank")
            if code < 0 and lr is not None and int(lr) not in {o[1] for o in out}:
                sig = signal.Signals(-code).name if -code in signal.valid_signals() else str(code)
                out.append(((True, 0.0, e.file, e.line), int(lr), e.where,
                            f"local rank {lr} exited with {sig} (exitcode {code})"))
    out.sort()
    return out


def _unranked_crash(facts: Facts) -> list[Evidence]:
    """Lines that say some process died of its own failure, with no rank anywhere:
    an allocator failing, the OOM killer, a worker killed by a signal."""
    out = [e for e in facts.unattributed if e.event in (Event.OOM, Event.CUDA_ERROR)]
    out += [e for e in facts.all_evidence(Event.EXIT) if e.fields.get("local_rank") is None
            and int(e.fields["exitcode"]) != 0]
    return sorted(out, key=_order)


def rule_crash(facts: Facts) -> Finding | None:
    crashes = _crashes(facts)
    oom_crash = [r for r, rf in facts.ranks.items() if rf.oom or _oom_killed(facts, rf)]
    if not crashes and not oom_crash:
        lines = _unranked_crash(facts)
        if not lines:
            return None
        waiting = facts.waiting
        silent = [r for r in facts.world if r not in waiting]
        kind = "ran out of memory" if lines[0].event is Event.OOM else "died"
        return Finding("rank_crash", [], waiting, "rank_exited",
                       f"a process {kind} ({lines[0].text[:160]}), but no line names its "
                       "rank" + (f"; it is among {who(silent)}" if silent and waiting else "")
                       + ".", [(e.where, e.text[:240]) for e in lines[:4]],
                       candidates=silent if waiting else [],
                       missing=["the rank of the process that died"],
                       collect=["torchrun's failure summary ('rank : N (local_rank: N)', "
                                "'exitcode : -9 (pid: P)') or every rank's log with its "
                                "prefix (torchrun --tee 3)", "the kernel log (dmesg) for the "
                                "OOM killer's 'Killed process P'"])
    if crashes:
        first = crashes[0]
        initiating = sorted({c[1] for c in crashes if c[0][:2] == first[0][:2]}) \
            if first[0][0] is False else [first[1]]
        ev = [(c[2], c[3]) for c in crashes[:4]]
        why = first[3]
    else:
        initiating = sorted(oom_crash)
        rf = facts.ranks[initiating[0]]
        e = rf.oom[0] if rf.oom else _oom_killed(facts, rf)
        assert e is not None
        ev = [(e.where, e.text[:240])]
        why = f"rank {initiating[0]} ran out of memory outside a checkpoint: {e.text[:160]}"
    collateral = [r for r in facts.world if r not in initiating]
    notes = _inferred_notes(facts, initiating)
    if not facts.scan.failures and any("local rank" in c[3] for c in crashes):
        notes.append("the rank is torchrun's local rank: equal to the global rank on one node")
    return Finding("rank_crash", initiating, collateral, "rank_exited",
                   why + "; the other ranks failed after it.", ev, notes)


def rule_stall(facts: Facts) -> Finding | None:
    waiting = facts.waiting
    if not waiting:
        return None
    missing, ev, how, candidates = _missing(facts)
    missing = [r for r in missing if r not in waiting] or missing
    ev = list(ev)
    for r in waiting[:3]:
        ev += _first_where(facts.ranks[r]) if r in facts.ranks else []
    op = _waited_op(facts, waiting)
    timeout = timeout_seconds(facts)
    tmo = f"{timeout:g} s" if timeout else "process-group"
    heartbeat_only = all(not (rf.timeouts or rf.progress or rf.signalled or rf.dump_signals
                              or rf.tracebacks) for rf in facts.ranks.values() if rf.heartbeat) \
        and any(rf.heartbeat for rf in facts.ranks.values())
    if not missing:
        return _stall_unnamed(facts, waiting, candidates, op, tmo, ev, heartbeat_only)
    ckpt: list[tuple[int, str, str]] = []
    for r in missing:
        rf = facts.ranks.get(r) or RankFacts(r)
        state, _op = rf.activity()
        line = rf.checkpointing()
        if state in (RankState.SAVING, RankState.GATHERING_STATE_DICT):
            tb = rf.tracebacks[-1]
            ckpt.append((r, tb.where, f"rank {r}'s last traceback is in {state.value}"))
        elif line is not None:
            ckpt.append((r, line.where, f"rank {r} was checkpointing: {line.text[:160]}"))
        elif r == 0 and (line := facts.unattributed_checkpointing()) is not None:
            ckpt.append((r, line.where, "the main process (rank 0: trainers log from it "
                         f"alone) was checkpointing: {line.text[:160]}"))
    how_text = _HOW.get(how, how.replace("_", " "))
    if ckpt:
        shown = {w for _r, w, _y in ckpt}
        ev = [(w, why) for _r, w, why in ckpt] + [(w, y) for w, y in ev if w not in shown]
        culprits = sorted({r for r, _w, _y in ckpt})
        return Finding(
            "checkpoint_gather_timeout", culprits, waiting, "save_overruns_watchdog",
            f"{who(culprits, 'was', 'were')} gathering/saving the checkpoint while "
            f"{len(waiting)} rank(s) waited in {op} until the {tmo} timeout "
            f"({how_text}).", ev)
    notes = []
    for r in missing:
        rf = facts.ranks.get(r)
        if rf is not None and rf.activity()[0] is not RankState.UNKNOWN:
            notes.append(f"rank {r}'s last traceback: {rf.activity()[0].value}")
    busy = " (it was busy, not dead: see the evidence)" if how == "busy" else ""
    return Finding("collective_hang", missing, waiting, "rank_never_joined",
                   f"{who(missing)} never joined {op}{busy}; {len(waiting)} rank(s) "
                   f"waited in it until the {tmo} timeout ({how_text}).", ev, notes)


#: How the initiating rank was found, as the summary says it.
_HOW = {
    "did_not_time_out": "every other rank timed out waiting; these did not",
    "only_rank_not_waiting": "the only rank of the job that did not report waiting",
    "busy": "the others timed out waiting while it was still busy",
    "watchdog_progress": "the watchdog's last enqueued work numbers",
    "missing_ranks_message": "c10d named the ranks that did not arrive",
    "flight_recorder": "the Flight Recorder",
}


def _stall_everyone_waited(facts: Facts, waiting: list[int], op: str, tmo: str,
                           ev: list[tuple[str, str]]) -> Finding:
    """Every rank of the job is known and every one timed out in the collective:
    none is missing, so the collective itself never finished (a kernel before it
    on some rank's GPU, or the transport). A world of one is the plain case: its
    only rank waited for its own device (recorded on a real H200: tests/data/gpu)."""
    what = (f"{who(waiting, 'waited', 'waited')} in {op} until the {tmo} timeout, and that "
            f"is every rank of the job ({len(facts.world)}): none was missing, so the "
            "collective itself never finished")
    if len(facts.world) == 1:
        what += " (a single rank waits only for its own GPU: work queued before the collective)"
    return Finding("collective_hang", list(waiting), [], "collective_never_finished",
                   what + ".", ev,
                   ["no rank was late: what hung is device work or the transport, not a rank"],
                   missing=["whether the collective started on each GPU"],
                   collect=["TORCH_NCCL_ENABLE_TIMING=1 with the Flight Recorder "
                            "(TORCH_FR_BUFFER_SIZE=2000, TORCH_NCCL_DUMP_ON_TIMEOUT=1): each "
                            "entry then says started or not", "nvidia-smi and dmesg (Xid) "
                            "of the nodes while it hangs"])


def _stall_unnamed(facts: Facts, waiting: list[int], candidates: list[int], op: str,
                   tmo: str, ev: list[tuple[str, str]], heartbeat_only: bool) -> Finding:
    """A hang whose initiator the logs do not name: only waiting ranks speak."""
    if heartbeat_only:
        what = (f"the watchdogs of {who(waiting)} were stuck inside NCCL/CUDA calls "
                "(heartbeat monitor): the job hung, and no collective timeout names the op")
    else:
        what = f"{who(waiting, 'waited', 'waited')} in {op} until the {tmo} timeout"
    if not candidates and facts.world_known and set(waiting) >= set(facts.world):
        return _stall_everyone_waited(facts, waiting, op, tmo, ev)
    if candidates:
        whom = (f"the initiator is among {who(candidates)}, which did not report waiting"
                + (" (and any rank above the highest seen)" if not facts.world_known else ""))
    else:
        whom = ("every rank in the logs waited, so the initiator is a rank whose log is "
                "not here")
    ckpt = facts.unattributed_checkpointing()
    notes = ([f"a checkpoint was in progress ({ckpt.where}: {ckpt.text[:100]}), but the "
              "rank that logged it waited too"] if ckpt is not None else [])
    ev = ev + [(e.where, e.text[:200]) for e in facts.all_evidence(Event.HEARTBEAT)[:2]
               if heartbeat_only]
    return Finding("collective_hang", [], waiting, "rank_never_joined", f"{what}; {whom}.",
                   ev, notes, candidates=candidates,
                   missing=["the log of any rank that did not time out"
                            + (f" ({who(candidates)})" if candidates else "")]
                   + (["the watchdog's timeout lines (which collective, which work number)"]
                      if heartbeat_only else []),
                   collect=["every rank's log (torchrun --log-dir DIR --tee 3, or srun --label)",
                            "Flight Recorder dumps: TORCH_NCCL_TRACE_BUFFER_SIZE=2000 and "
                            "TORCH_NCCL_DUMP_ON_TIMEOUT=1 (files under "
                            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE), read with ncclwatch diagnose"])


RULES: tuple[tuple[str, Rule], ...] = (
    ("gather_oom", rule_gather_oom),
    ("desync", rule_desync),
    ("network_error", rule_network),
    ("rank_crash", rule_crash),
    ("stall", rule_stall),
)


def _torchrun_note(facts: Facts, finding: Finding) -> str | None:
    roots = [fe for fe in facts.scan.failures if fe.root and fe.rank is not None]
    if not roots:
        return None
    root = roots[0]
    if root.rank in finding.initiating:
        return f"torchrun's summary names rank {root.rank} as the root cause too ({root.where})."
    if root.rank in finding.collateral and finding.initiating:
        return (f"torchrun's summary names rank {root.rank} as the root cause "
                f"(first observed failure, {root.where}): it only failed first, after "
                f"waiting for rank(s) {rank_ranges(finding.initiating)}.")
    if root.rank in finding.collateral:
        return (f"torchrun's summary names rank {root.rank} as the root cause "
                f"(first observed failure, {root.where}): it only failed first, after waiting.")
    return None


#: Evidence to collect where a verdict rests on an inference.
_COLLECT_PREFIX = ("every rank's log with its rank prefix (torchrun --tee 3 or --log-dir), so "
                   "lines carry the rank instead of a GPU index")


def decide(facts: Facts) -> Finding:
    for _name, rule in RULES:
        finding = rule(facts)
        if finding is not None:
            note = _torchrun_note(facts, finding)
            if note:
                finding.notes.append(note)
            if any(r in facts.inferred for r in finding.initiating) \
                    and _COLLECT_PREFIX not in finding.collect:
                finding.missing.append("a rank prefix on the failing line")
                finding.collect.append(_COLLECT_PREFIX)
            if finding.cls in ("collective_hang", "checkpoint_gather_timeout", "desync") \
                    and facts.fr is None and not any("Flight Recorder" in c
                                                     for c in finding.collect):
                finding.collect.append("Flight Recorder dumps (TORCH_NCCL_TRACE_BUFFER_SIZE=2000, "
                                       "TORCH_NCCL_DUMP_ON_TIMEOUT=1) to confirm which rank "
                                       "never started the collective")
            return finding
    failing = failure_signs(facts)
    if failing or (facts.ranks and any(rf.tracebacks or rf.failure or rf.timeouts
                                       for rf in facts.ranks.values())):
        # Recall first: a log with any failure sign is never "no failure found".
        ev = [(where, f"{sid}: {text[:200]}") for sid, (where, text) in failing[:6]]
        named = ", ".join(f"{sid} ({facts.scan.hit_counts.get(sid, 1)} line(s))"
                          for sid, _h in failing[:6])
        return Finding("unknown", [], [], "", "failure evidence found, but no known pattern "
                       "explains it" + (f": {named}" if named else "")
                       + "; see the evidence lines.", ev,
                       missing=["a line that points at a rank or a cause"],
                       collect=["every rank's log (torchrun --log-dir DIR --tee 3)",
                                "Flight Recorder dumps (TORCH_NCCL_DUMP_ON_TIMEOUT=1)"])
    finished = [e for e in facts.scan.evidence if e.event is Event.FINISHED]
    return Finding("none", [], [], "", "no failure found"
                   + (" (the job says it finished)" if finished else "") + ".",
                   [(e.where, e.text[:200]) for e in finished[:1]])


def failure_signs(facts: Facts) -> list[tuple[str, tuple[str, str]]]:
    """The failure signs the scan met (logsigns.LogSign.failure), first line of each, in
    table order; NCCL warnings count only where they name a transport failing."""
    out = [(sid, hit) for sid, hit in facts.scan.hits.items()
           if SIGN_BY_ID[sid].failure]
    warn = facts.scan.hits.get("nccl_warn")
    if warn is not None and any(t in warn[1] for t in NETWORK_FAILURES):
        out.append(("nccl_warn", warn))
    order = {s.id: i for i, s in enumerate(SIGNS)}
    return sorted(out, key=lambda kv: order[kv[0]])


def root_cause(finding: Finding) -> RootCause | None:
    return ALL_BY_ID.get(finding.root_cause)


def timeline(facts: Facts, finding: Finding, limit: int = 40) -> list[dict]:
    """Key moments, in time order where the logs have times (else file order)."""
    keep: list[tuple[tuple, dict]] = []
    interesting = set(finding.initiating)

    def add(order: tuple, rank: int | None, where: str, what: str,
            stamp: float | None = None) -> None:
        # The line's own stamp, never one inherited from an earlier line.
        keep.append((order, {"rank": rank, "where": where, "what": what[:240], "time": stamp}))

    for r, rf in sorted(facts.ranks.items()):
        firsts: Sequence[Evidence] = [*rf.timeouts[:1], *rf.progress[:1], *rf.oom[:1],
                                      *rf.network[:1], *rf.aborted[:1], *rf.peer_closed[:1]]
        if r in interesting:
            firsts = [*firsts, *rf.checkpoint[-2:], *rf.checkpoint_done[-1:]]
        for e in firsts:
            add(_order(e), r, e.where, e.text, e.stamp)
        for tb in rf.tracebacks[:1] + rf.tracebacks[-1:] if rf.tracebacks else []:
            add(_order(tb), r, tb.where, f"traceback ending in {tb.exception}", tb.stamp)
    for e in facts.all_evidence(Event.MISSING_RANKS)[:3] + facts.all_evidence(Event.MISMATCH)[:3] \
            + facts.all_evidence(Event.HEARTBEAT)[:2] + facts.all_evidence(Event.FR_DUMP)[:2]:
        add(_order(e), e.rank, e.where, e.text, e.stamp)
    for e in facts.unattributed:
        if e.event in (Event.OOM, Event.NETWORK):
            add(_order(e), None, e.where, e.text, e.stamp)
    for fe in facts.scan.failures:
        sig = f" {fe.signame}" if fe.signame else ""
        add((True, 0.0, fe.file, fe.line), fe.rank, fe.where,
            f"torchrun: rank {fe.rank} exitcode {fe.exitcode}{sig}"
            + (" (named root cause)" if fe.root else ""), fe.stamp)
    for e in facts.all_evidence(Event.EXIT)[:4]:
        add(_order(e), e.rank, e.where, e.text, e.stamp)
    seen = set()
    out = []
    for _o, item in sorted(keep, key=lambda x: x[0]):
        key = (item["where"], item["what"])
        if key in seen:
            continue
        seen.add(key)
        out.append(item)
    return out[:limit]
