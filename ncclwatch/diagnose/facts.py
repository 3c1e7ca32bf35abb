"""What the logs say, rank by rank: the facts every verdict rule reads.

The scan (logscan.py) gives evidence lines, tracebacks and torchrun's failure
table; ``gather_facts`` files them under the rank they belong to (inferring
ranks where a line names none, and the world size), and the helpers here
answer the questions rules share: which ranks waited, which did not, what a
traceback says a rank was doing, which ranks crashed on their own.
"""

from __future__ import annotations

import bisect
import re
import signal
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from ncclwatch.diagnose.lineprefix import DEFAULT_PG
from ncclwatch.diagnose.scanresult import Evidence, FailureEntry, PyTraceback, ScanResult
from ncclwatch.diagnose.logsigns import (NETWORK_EXCEPTIONS, NETWORK_FAILURES, PEER_EXCEPTIONS,
                                         SIGNAL_MEANING, TEARDOWN_EXCEPTIONS, TIMEOUT_EXCEPTIONS,
                                         Event)
from ncclwatch.flightrec import FrAnalysis
from ncclwatch.model import CollectiveOp, RankState, rank_ranges
from ncclwatch.signatures import classify


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
    exits = [e for e in scan.evidence if e.event is Event.EXIT]
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


@dataclass
class LogFinding:
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


Rule = Callable[[Facts], "LogFinding | None"]


def who(ranks: Sequence[int], one: str = "", many: str = "") -> str:
    """'rank 0 was' / 'ranks 1-3 were' (verb optional)."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}" + (f" {one}" if one else "")
    return f"ranks {rank_ranges(ranks)}" + (f" {many}" if many else "")


def op_of(e: Evidence) -> str:
    if e.sign == "store_barrier_timeout":
        return ("the store-based barrier of process-group creation"
                + (f" ({e.fields['key']})" if e.fields.get("key") else ""))
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
            hms = e.fields.get("timeout", "").split(":")  # a timedelta: "0:30:00"
            if len(hms) == 3 and all(x.replace(".", "", 1).isdigit() for x in hms):
                return int(hms[0]) * 3600 + int(hms[1]) * 60 + float(hms[2])
    for e in facts.all_evidence(Event.MISSING_RANKS):
        if e.fields.get("timeout_ms"):
            return int(e.fields["timeout_ms"]) / 1000.0
    return None


def waited_op(facts: Facts, ranks: Iterable[int]) -> str:
    ops: Counter[str] = Counter()
    for r in ranks:
        rf = facts.ranks.get(r)
        if rf is None:
            continue
        for e in rf.timeouts:
            if op_of(e):
                ops[op_of(e)] += 1
        state, op = rf.activity()
        if op is not CollectiveOp.NONE and rf.timeout_tracebacks():
            ops[op.value] += 1
    if not ops:
        if facts.fr is not None and facts.fr.stuck:
            return facts.fr.stuck[0].op
        return "a collective"
    return ops.most_common(1)[0][0]


def first_where(rf: RankFacts) -> list[tuple[str, str]]:
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


def waited_for(facts: Facts) -> tuple[list[int], list[tuple[str, str]], str, list[int]]:
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
            return missing, [(fr_where(facts), why)], "flight_recorder", []
        lag = _fr_lagging(fr)
        if lag:
            pg, top, ranks = lag
            return ranks, [(fr_where(facts),
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


def pg_key(e: Evidence) -> str:
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
    pending_pgs = {pg_key(e) for r in waiting
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
        elif rf.dump_signals and any(pg_key(e) in pending_pgs for e in rf.dump_signals):
            e = rf.dump_signals[-1]
            out[r] = (e.where, f"rank {r} had nothing overdue when the others timed out: "
                      f"{e.text[:120]}")
    return out


def fr_where(facts: Facts) -> str:
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


def oom_killed(facts: Facts, rf: RankFacts) -> Evidence | None:
    fe = rf.failure
    if fe is None or fe.pid is None:
        return None
    for e in facts.unattributed + rf.oom:
        if e.sign == "oom_killer" and e.fields.get("pid") == str(fe.pid):
            return e
    return None


def inferred_notes(facts: Facts, ranks: Iterable[int]) -> list[str]:
    return [facts.inferred[r] for r in ranks if r in facts.inferred]


def job_failed(facts: Facts) -> bool:
    """Anything that says the job did not just finish (warnings alone do not)."""
    return bool(facts.scan.failures or any(
        e.event in (Event.EXIT, Event.TIMEOUT, Event.WATCHDOG_ABORT, Event.MISSING_RANKS,
                    Event.HEARTBEAT)
        or e.sign in ("nccl_error", "nccl_cuda_error", "store_get_failed")
        or (e.event is Event.NETWORK and any(t in e.text for t in NETWORK_FAILURES))
        for e in facts.scan.evidence)
        or any(exception_kind(t) not in ("teardown", "truncated") for t in facts.scan.tracebacks))


def own_crashes(facts: Facts) -> list[tuple[tuple, int, str, str]]:
    """(order, rank, where, why) of ranks that failed on their own (not by waiting)."""
    out = []
    watchdog = any(rf.aborted or rf.timeouts for rf in facts.ranks.values())
    for r, rf in facts.ranks.items():
        if rf.cuda_errors:
            e = rf.cuda_errors[0]
            out.append((time_order(e), r, e.where,
                        f"rank {r}'s GPU failed under NCCL: {e.text[:200]}"))
            continue
        for tb in rf.tracebacks:
            if exception_kind(tb) != "error":
                continue
            out.append((time_order(tb), r, tb.where, f"rank {r} raised {tb.exception[:200]}"))
            break
        else:
            sig = _sig_of(rf)
            meaning = SIGNAL_MEANING.get(sig, "")
            if meaning in ("crashed", "killed") or (meaning == "aborted" and not watchdog
                                                   and not rf.waited):
                if sig == "SIGKILL" and oom_killed(facts, rf) is not None:
                    continue
                fe = rf.failure
                assert fe is not None
                out.append(((True, 0.0, fe.file, fe.line), r, fe.where,
                            f"rank {r} exited with {sig} (exitcode {fe.exitcode}, pid {fe.pid})"))
    if not facts.scan.failures:
        # torchrun's "failed (exitcode: -9) local_rank: 0 (pid: N)" without the summary;
        # the deepspeed launcher's line names its only worker when that is local rank 0.
        for e in facts.all_evidence(Event.EXIT):
            code, lr = int(e.fields["exitcode"]), e.fields.get("local_rank")
            only = lr is None and e.fields.get("last_local_rank") == "0" and (
                SIGNAL_MEANING.get(exit_name(code)) in ("crashed", "killed")
                or not anyone_waited(facts))  # else the exit of a rank that waited
            if only:
                lr = "0"
            if (code < 0 or only) and lr is not None and int(lr) not in {o[1] for o in out}:
                sig = exit_name(code)
                out.append(((True, 0.0, e.file, e.line), int(lr), e.where,
                            f"local rank {lr} exited with {sig} (exitcode {code})"
                            + (" (the deepspeed launcher's only worker on its node)"
                               if only else "")))
    out.sort()
    return out


def unranked_crash(facts: Facts) -> list[Evidence]:
    """Lines that say some process died of its own failure, with no rank anywhere:
    an allocator failing, the OOM killer, a worker killed by a signal."""
    out = [e for e in facts.unattributed if e.event in (Event.OOM, Event.CUDA_ERROR)]
    waited = anyone_waited(facts)
    out += [e for e in facts.all_evidence(Event.EXIT) if e.fields.get("local_rank") is None
            and int(e.fields["exitcode"]) != 0
            # A launcher's exit line after ranks timed out is their exit (code 1, or -6
            # from the watchdog's abort), not a crash: only a crash signal still counts.
            and (not waited or SIGNAL_MEANING.get(exit_name(int(e.fields["exitcode"])))
                 in ("crashed", "killed"))]
    return sorted(out, key=time_order)


def exit_name(code: int) -> str:
    """SIGSEGV for -11 (a worker killed by a signal), else the code itself."""
    if code < 0 and -code in {s.value for s in signal.Signals}:
        return signal.Signals(-code).name
    return str(code)


def anyone_waited(facts: Facts) -> bool:
    """Some rank, named or not, timed out waiting for others."""
    return bool(facts.waiting) or any(
        e.event in (Event.TIMEOUT, Event.PROGRESS, Event.WATCHDOG_ABORT, Event.HEARTBEAT)
        for e in facts.unattributed)
