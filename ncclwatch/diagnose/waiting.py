"""Who waited for whom: the ranks the waiting ranks waited for, and in what.

The question behind every stall verdict: the Flight Recorder's missing ranks,
monitored_barrier's list, the watchdog's sequence numbers, or the one rank
that did not time out (busy, checkpointing, alive). Apart from the facts
(facts.py) because it is a decision over them, read by the stall, desync and
crash rules.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable

from ncclwatch.diagnose.crashes import sig_of
from ncclwatch.diagnose.facts import Facts, RankFacts
from ncclwatch.diagnose.finding import who
from ncclwatch.diagnose.lineprefix import DEFAULT_PG
from ncclwatch.diagnose.scanresult import Evidence
from ncclwatch.diagnose.signtypes import Event
from ncclwatch.flightrec import FrAnalysis
from ncclwatch.model import CollectiveOp, rank_ranges

#: NCCL's OpType names -> the c10d op (a barrier is an all-reduce of one element).
_OPTYPE = {"ALLREDUCE": "all_reduce", "BROADCAST": "broadcast", "ALLGATHER": "all_gather",
           "_ALLGATHER_BASE": "all_gather", "REDUCE_SCATTER": "reduce_scatter",
           "_REDUCE_SCATTER_BASE": "reduce_scatter", "GATHER": "gather", "SCATTER": "scatter",
           "REDUCE": "reduce", "ALLTOALL": "all_to_all", "ALLTOALL_BASE": "all_to_all",
           "SEND": "send", "RECV": "recv", "RECVANYSOURCE": "recv", "BARRIER": "barrier",
           "COALESCED": "coalesced"}


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
        elif rf.checkpoint or (rf.failure is not None and sig_of(rf) != "SIGABRT"):
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
